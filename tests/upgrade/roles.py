"""A producer process for the upgrade tests, on whichever release ``PYTHONPATH`` puts first (release 0.1.0's code
extracted from its tag, or this checkout): only the public names both releases have.

    python roles.py GROUP TOPIC PREFIX LEDGER [--send N] [--pace S] [--crash K] [--serve]

Settings come from ``TXMQ_*`` variables (``Settings.from_env``). The producer:

1. sends ``N`` transactions one after the other (``--send -1``: until SIGTERM), ``S`` seconds apart, with the bodies
   ``PREFIX-<n>-<kind>``; the kinds take turns: ``c`` (commits), ``r`` (rolls back), ``uc`` and ``ur`` (UNKNOWN,
   then the check-back's answer commits / rolls back);
2. with ``--crash K``: starts K more on threads (kinds ``c`` and ``r`` in turn), and once all K are prepared and in
   their local transaction, exits at once with status 17: no end call, no heartbeat leave;
3. with ``--serve``: answers check requests until SIGTERM, then shuts down (it leaves its group: the clean stop of
   a rolling upgrade), exit status 0.

Every check-back is answered from the body's kind, by any process of either release: the kind plays the part of the
service's database. Every body whose local transaction began (its half message written) is appended to ``LEDGER``
as ``prepared <body>`` before anything else happens to it; ``sent`` follows once step 1 is done.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer

CRASH_STATUS = 17
KINDS = ("c", "r", "uc", "ur")
CRASH_KINDS = ("c", "r")
CRASH = "crash"
"""The ``arg`` of a transaction whose process dies in its local transaction."""


def kind_of(body: str) -> str:
    return body.rsplit("-", 1)[1]


def commits(body: str) -> bool:
    """What the "database" says became of the local transaction of ``body``."""
    return kind_of(body).endswith("c")


class Ledger:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:  # one write(2) of a short line, unbuffered: on disk before the process can die
            os.write(self._fd, f"{line}\n".encode())


class KindListener(TransactionListener):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.crashing = threading.Semaphore(0)

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        body = message.body.decode()
        self.ledger.write(f"prepared {body}")
        if arg == CRASH:
            self.crashing.release()
            threading.Event().wait()  # the process dies meanwhile
        kind = kind_of(body)
        if kind == "c":
            return LocalTransactionState.COMMIT
        if kind == "r":
            return LocalTransactionState.ROLLBACK
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        body = message.body.decode()
        return LocalTransactionState.COMMIT if commits(body) else LocalTransactionState.ROLLBACK


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("prefix")
    parser.add_argument("ledger")
    parser.add_argument("--send", type=int, default=0)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--crash", type=int, default=0)
    parser.add_argument("--serve", action="store_true")
    options = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ledger = Ledger(options.ledger)
    listener = KindListener(ledger)
    producer = TransactionProducer(options.group, listener, settings=Settings.from_env())
    producer.start()
    sent = 0
    while sent != options.send and not stop.is_set():
        body = f"{options.prefix}-{sent}-{KINDS[sent % len(KINDS)]}"
        producer.send_message_in_transaction(Message(options.topic, body.encode()), None)
        sent += 1
        if options.pace:
            stop.wait(options.pace)
    ledger.write("sent")

    if options.crash:
        for n in range(options.crash):
            body = f"{options.prefix}-crash{n}-{CRASH_KINDS[n % len(CRASH_KINDS)]}"
            message = Message(options.topic, body.encode())
            threading.Thread(target=producer.send_message_in_transaction, args=(message, CRASH), daemon=True).start()
        for _ in range(options.crash):
            if not listener.crashing.acquire(timeout=30):
                print("the transactions to crash in were not all prepared within 30 s", file=sys.stderr)
                return 1
        os._exit(CRASH_STATUS)

    if options.serve:
        stop.wait()
    producer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
