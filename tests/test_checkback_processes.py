"""Crashes that must be real: producer and checker processes killed with SIGKILL, a checker stopped by SIGTERM."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.keys import TopicKeys

from .helpers import wait_until

pytestmark = pytest.mark.slow

TXMQ = str(Path(sys.executable).parent / "txmq")
FAST_ENV = {"TXMQ_HEARTBEAT_INTERVAL": "0.5", "TXMQ_LOG_LEVEL": "INFO"}

CRASHING_PRODUCER = textwrap.dedent(
    """
    import sys, time
    from redis_txmq import LocalTransactionState, Message, TransactionListener, TransactionProducer

    class SaveThenHang(TransactionListener):
        def execute_local_transaction(self, message, arg):
            print(message.transaction_id, flush=True)  # the local transaction committed...
            time.sleep(3600)                           # ...and the process dies before its end call

        def check_local_transaction(self, message):
            return None

    with TransactionProducer("crash_group", SaveThenHang(), redis_url=sys.argv[1]) as producer:
        producer.send_message_in_transaction(Message(sys.argv[2], b"paid order"))
    """
)


class CommitKnown(TransactionListener):
    """A fresh instance of the service: knows which transactions its database committed."""

    def __init__(self, committed: set[str], delay: float = 0.0) -> None:
        self.committed = committed
        self.delay = delay

    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        time.sleep(self.delay)
        if message.transaction_id in self.committed:
            return LocalTransactionState.COMMIT
        return LocalTransactionState.ROLLBACK


def start_checker(redis_url: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            TXMQ,
            "checker",
            "--redis-url",
            redis_url,
            "--transaction-timeout",
            "1",
            "--check-interval",
            "1",
            "--claim-idle",
            "1",
            *extra,
        ],
        env=os.environ | FAST_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)


def committed_ids(client, topic: str) -> collections.Counter[bytes]:
    return collections.Counter(fields[b"transaction_id"] for _, fields in client.xrange(topic))


def test_producer_killed_between_half_and_end_is_committed_once_by_a_new_instance(real_client, redis_url):
    crashed = subprocess.Popen(
        [sys.executable, "-c", CRASHING_PRODUCER, redis_url, "crash-orders"], stdout=subprocess.PIPE, text=True
    )
    try:
        transaction_id = crashed.stdout.readline().strip()
        assert transaction_id, "the crashing producer did not reach its local transaction"
        crashed.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        stop(crashed)
    assert real_client.xlen("crash-orders") == 0
    settings = Settings(heartbeat_interval=0.5)
    checker = start_checker(redis_url)
    try:
        with TransactionProducer("crash_group", CommitKnown({transaction_id}), redis_url=redis_url, settings=settings):
            wait_until(lambda: real_client.xlen("crash-orders") == 1, timeout=30)
            recovered = time.monotonic() - killed_at
    finally:
        stop(checker)
    print(f"\ncrash-to-appearance with --transaction-timeout 1 --check-interval 1: {recovered:.2f} s")
    assert committed_ids(real_client, "crash-orders") == {transaction_id.encode(): 1}
    assert real_client.hlen(TopicKeys("crash-orders").inflight) == 0


def test_a_killed_checker_leaves_its_work_to_the_other(real_client, redis_url):
    topic = "orders-two-checkers"
    settings = Settings(heartbeat_interval=0.5, claim_idle=1.0)
    committed: set[str] = set()
    with TransactionProducer(
        "two_checkers", CommitKnown(committed), redis_url=redis_url, settings=Settings(heartbeat_interval=0.5)
    ) as sender:
        results = [
            sender.send_message_in_transaction(Message(topic, str(i).encode()), LocalTransactionState.UNKNOWN)
            for i in range(60)
        ]
    committed.update(r.transaction_id for r in results[::2])
    first, second = start_checker(redis_url), start_checker(redis_url)
    try:
        with TransactionProducer(
            "two_checkers", CommitKnown(committed, delay=0.01), redis_url=redis_url, settings=settings
        ):
            wait_until(lambda: real_client.xlen(topic) >= 5, timeout=30)
            first.send_signal(signal.SIGKILL)
            wait_until(lambda: real_client.hlen(TopicKeys(topic).inflight) == 0, timeout=60)
    finally:
        stop(first)
        stop(second)
    assert committed_ids(real_client, topic) == {t.encode(): 1 for t in committed}


def test_sigterm_stops_a_checker_cleanly(real_client, redis_url):
    topic = "orders-sigterm"
    committed: set[str] = set()
    with TransactionProducer(
        "sigterm_group", CommitKnown(committed), redis_url=redis_url, settings=Settings(heartbeat_interval=0.5)
    ) as sender:
        results = [
            sender.send_message_in_transaction(Message(topic, b"x"), LocalTransactionState.UNKNOWN) for _ in range(40)
        ]
    committed.update(r.transaction_id for r in results)
    checker = start_checker(redis_url)
    try:
        with TransactionProducer(
            "sigterm_group",
            CommitKnown(committed, delay=0.01),
            redis_url=redis_url,
            settings=Settings(heartbeat_interval=0.5),
        ):
            wait_until(lambda: real_client.xlen(topic) >= 1, timeout=30)
            checker.send_signal(signal.SIGTERM)
            assert checker.wait(10) == 0, checker.stderr.read().decode()[-2000:]
            assert b"stopped" in checker.stderr.read()
            successor = start_checker(redis_url)
            try:
                wait_until(lambda: real_client.xlen(topic) == 40, timeout=60)
            finally:
                successor.send_signal(signal.SIGTERM)
                assert successor.wait(10) == 0
    finally:
        stop(checker)
    assert committed_ids(real_client, topic) == {t.encode(): 1 for t in committed}
