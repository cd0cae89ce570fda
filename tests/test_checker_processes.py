"""The check-back across real processes: `txmq checker` subprocesses, producers killed with SIGKILL or dying on
their own, a checker killed mid-work, SIGTERM, and the operator commands through the console script.

Every subprocess runs with a deadline and is killed in a ``finally``; run with ``pytest -s`` to see the measured
crash-to-appearance times.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.core.keys import (
    CHECKER_INSTANCES,
    CHECKERS_CONSUMER_GROUP,
    PRODUCERS_CONSUMER_GROUP,
    REPLY_STREAM,
    GroupKeys,
    TopicKeys,
)

from .helpers import pending, server_ms, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
_venv_txmq = Path(sys.executable).parent / "txmq"
TXMQ = str(_venv_txmq) if _venv_txmq.exists() else (shutil.which("txmq") or "txmq")
PRODUCER_SETTINGS = Settings(heartbeat_interval=0.5, claim_idle=1.0)


def child_env() -> dict[str, str]:
    """The test's environment without any TXMQ_* of the caller's, plus fast heartbeats and INFO logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
    return env | {"TXMQ_HEARTBEAT_INTERVAL": "0.5", "TXMQ_LOG_LEVEL": "INFO", "COLUMNS": "200"}


class CheckerProcess:
    """A `txmq checker` subprocess whose output goes to a file (no pipe to fill)."""

    def __init__(self, redis_url: str, log: Path, *options: str) -> None:
        defaults = {"--transaction-timeout": "1", "--check-interval": "1", "--claim-idle": "1"}
        for name in options[::2]:
            defaults.pop(name, None)
        args = [TXMQ, "checker", "--redis-url", redis_url, *(x for kv in defaults.items() for x in kv), *options]
        self.log = log
        self._out = log.open("wb")
        self.process = subprocess.Popen(args, stdout=self._out, stderr=subprocess.STDOUT, env=child_env())
        self.instance_id: str | None = None

    def wait_live(self, client: Any) -> str:
        """Wait until its heartbeat is in the checkers zset; return its instance id (from its first line)."""

        def live() -> str | None:
            assert self.process.poll() is None, f"checker exited early:\n{self.output()}"
            words = self.output().split()
            if len(words) < 2 or words[0] != "checker":
                return None
            member = words[1]
            return member if client.zscore(CHECKER_INSTANCES, member) is not None else None

        self.instance_id = wait_until(live, timeout=20)
        return self.instance_id

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, grace: float = 30.0) -> tuple[int, float]:
        """Stop it as an orchestrator does: SIGTERM, then SIGKILL once ``grace`` (Kubernetes' default
        ``terminationGracePeriodSeconds``, 30 s) has passed; returns the exit status (-9 when it had to be killed)
        and how long it took."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait(10)
        return status, time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self._out.close()


@pytest.fixture
def checkers(redis_url: str, tmp_path: Path) -> Iterator[Any]:
    """Start `txmq checker` subprocesses with ``start(*options)``; any still running are killed at the end."""
    started: list[CheckerProcess] = []

    def start(*options: str) -> CheckerProcess:
        process = CheckerProcess(redis_url, tmp_path / f"checker-{len(started)}.log", *options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def txmq(redis_url: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run the console script once, with a deadline."""
    return subprocess.run(
        [TXMQ, *args, "--redis-url", redis_url], capture_output=True, text=True, timeout=timeout, env=child_env()
    )


def committed(client: Any, topic: str) -> collections.Counter[str]:
    """How many times each transaction id occurs in the topic stream."""
    return collections.Counter(fields[b"transaction_id"].decode() for _, fields in client.xrange(topic))


class ByBody(TransactionListener):
    """A service instance whose database knows the outcome: commit when the body ends with b'commit'."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.checked: collections.Counter[str] = collections.Counter()

    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return arg

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        self.checked[message.transaction_id or ""] += 1
        time.sleep(self.delay)  # a slow database
        return COMMIT if message.body.endswith(b"commit") else ROLLBACK


class CommitKnown(TransactionListener):
    """A fresh instance of the service: commits the transactions its database says committed."""

    def __init__(self, committed_ids: set[str]) -> None:
        self.committed_ids = committed_ids
        self.checked: list[str] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return arg

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        self.checked.append(message.transaction_id or "")
        return COMMIT if message.transaction_id in self.committed_ids else ROLLBACK


def drain(client: Any, group: str) -> None:
    """Wait until every check request of ``group`` was answered and every answer applied."""
    wait_until(lambda: client.xlen(GroupKeys(group).check_requests) == 0, timeout=30)
    wait_until(lambda: client.xlen(REPLY_STREAM) == 0, timeout=20)
    wait_until(lambda: pending(client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP) == 0, timeout=20)


def send_unknown(client: Any, group: str, topic: str, bodies: list[bytes]) -> list[str]:
    """Send UNKNOWN transactions from a producer that shuts down right after (its checks go to others)."""
    with TransactionProducer(group, ByBody(), client=client, settings=PRODUCER_SETTINGS) as sender:
        return [sender.send_message_in_transaction(Message(topic, body), UNKNOWN).transaction_id for body in bodies]


# ------------------------------------------------------------------------------ 2. producer killed mid-transaction

CRASHING_PRODUCER = textwrap.dedent(
    """
    import os, sys, threading
    from redis_txmq import Message, Settings, TransactionListener, TransactionProducer

    redis_url, topic, mode = sys.argv[1:4]

    class WriteThenDie(TransactionListener):
        def execute_local_transaction(self, message, arg):
            # the local transaction committed (its id is stored with the data: here, on stdout) ...
            sys.stdout.write(message.transaction_id + "\\n")
            sys.stdout.flush()
            # ... and the process dies before the end call
            if mode == "exit":
                os._exit(3)
            threading.Event().wait()  # "hang": the test kills it with SIGKILL

        def check_local_transaction(self, message):
            return None

    settings = Settings(heartbeat_interval=0.5)
    with TransactionProducer("crash_group", WriteThenDie(), redis_url=redis_url, settings=settings) as producer:
        producer.send_message_in_transaction(Message(topic, b"paid order", keys="order-42"))
    """
)


@pytest.mark.parametrize("death", ["sigkill", "exit"])
def test_producer_dead_between_half_and_end_is_committed_once_by_a_new_instance(
    real_client, redis_url, checkers, death
):
    topic = f"crash-orders-{death}"
    checker = checkers()  # running before the crash, as in production
    checker.wait_live(real_client)

    crashed = subprocess.Popen(
        [sys.executable, "-c", CRASHING_PRODUCER, redis_url, topic, death], stdout=subprocess.PIPE, text=True
    )
    try:
        transaction_id = crashed.stdout.readline().strip()
        assert len(transaction_id) == 32, "the crashing producer did not reach its local transaction"
        if death == "sigkill":
            os.kill(crashed.pid, signal.SIGKILL)
        status = crashed.wait(10)
        died_at, died_at_ms = time.monotonic(), server_ms(real_client)
    finally:
        if crashed.poll() is None:
            crashed.kill()
        crashed.wait(10)
    assert status == (-signal.SIGKILL if death == "sigkill" else 3)
    keys = TopicKeys(topic)
    assert real_client.xlen(topic) == 0 and real_client.hexists(keys.inflight, transaction_id), "half, no end"

    listener = CommitKnown({transaction_id})
    with TransactionProducer("crash_group", listener, redis_url=redis_url, settings=PRODUCER_SETTINGS):
        wait_until(lambda: real_client.xlen(topic) >= 1, timeout=20, interval=0.005)
        recovered = time.monotonic() - died_at
        ((entry_id, entry),) = real_client.xrange(topic)
        recovered_server = (int(entry_id.decode().split("-")[0]) - died_at_ms) / 1000
        print(
            f"\n[crash-to-appearance] producer {death}: message committed by check-back "
            f"{recovered:.2f} s after the producer died (server clock: {recovered_server:.2f} s); "
            "txmq checker --transaction-timeout 1 --check-interval 1"
        )
        # let every request and answer drain, then look again: still once
        wait_until(lambda: real_client.xlen(GroupKeys("crash_group").check_requests) == 0, timeout=10)
        wait_until(lambda: real_client.xlen(REPLY_STREAM) == 0, timeout=10)
    status, took = checker.terminate()
    assert status == 0, checker.output()

    assert committed(real_client, topic) == {transaction_id: 1}
    assert entry[b"body"] == b"paid order" and entry[b"keys"] == b"order-42"
    assert transaction_id in listener.checked
    assert real_client.hlen(keys.inflight) == 0 and real_client.xlen(keys.half_stream) == 0
    assert recovered < 10, f"took {recovered:.2f} s"


ONE_WAY_PRODUCER = textwrap.dedent(
    """
    import sys, threading
    from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer

    redis_url, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

    class CommitAll(TransactionListener):
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.COMMIT

        def check_local_transaction(self, message):
            return None

    # a flusher that waits 10 s to fill a batch of 10,000: every end is still queued when the test kills us
    settings = Settings(heartbeat_interval=0.5, end_batch_size=10_000, end_batch_delay=10)
    producer = TransactionProducer("oneway_group", CommitAll(), redis_url=redis_url, settings=settings, oneway_end=True)
    producer.start()
    for i in range(count):
        result = producer.send_message_in_transaction(Message(topic, b"order %d" % i))
        assert result.end_queued
        sys.stdout.write(result.transaction_id + "\\n")
    sys.stdout.write("queued %d\\n" % producer.pending_ends)
    sys.stdout.flush()
    threading.Event().wait()
    """
)


def test_one_way_producer_killed_with_ends_queued_every_commit_lands_once(real_client, redis_url, checkers):
    topic, count = "oneway-orders", 50
    killed = subprocess.Popen(
        [sys.executable, "-c", ONE_WAY_PRODUCER, redis_url, topic, str(count)], stdout=subprocess.PIPE, text=True
    )
    try:
        lines = [killed.stdout.readline().strip() for _ in range(count + 1)]
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(10) == -signal.SIGKILL
    finally:
        if killed.poll() is None:
            killed.kill()
        killed.wait(10)
    transaction_ids = set(lines[:count])
    assert lines[count] == f"queued {count}" and len(transaction_ids) == count
    keys = TopicKeys(topic)
    assert real_client.xlen(topic) == 0, "an end left the process before the kill"
    assert {k.decode() for k in real_client.hkeys(keys.inflight)} == transaction_ids

    listener = CommitKnown(transaction_ids)
    checker = checkers()
    with TransactionProducer("oneway_group", listener, redis_url=redis_url, settings=PRODUCER_SETTINGS):
        wait_until(lambda: real_client.xlen(topic) >= count, timeout=30)
        drain(real_client, "oneway_group")
    assert checker.terminate()[0] == 0, checker.output()
    assert committed(real_client, topic) == {tx: 1 for tx in transaction_ids}
    assert real_client.hlen(keys.inflight) == 0 and real_client.xlen(keys.half_stream) == 0


DYING_CHECK_ANSWERER = textwrap.dedent(
    """
    import os, sys, threading
    from redis_txmq import Settings, TransactionListener, TransactionProducer

    class DieWhileChecking(TransactionListener):
        def execute_local_transaction(self, message, arg):
            return None

        def check_local_transaction(self, message):
            sys.stdout.write("checking " + message.transaction_id + "\\n")
            sys.stdout.flush()
            os._exit(4)  # it read the request, and dies before answering

    settings = Settings(heartbeat_interval=0.5, claim_idle=1.0)
    with TransactionProducer("handoff_group", DieWhileChecking(), redis_url=sys.argv[1], settings=settings):
        sys.stdout.write("ready\\n")
        sys.stdout.flush()
        threading.Event().wait(60)
    """
)


def test_a_request_read_by_a_producer_that_died_is_taken_over_by_another_instance(real_client, redis_url, checkers):
    """With --check-interval 30 there is no second check in time: only the takeover of the pending request can
    resolve the transaction."""
    topic = "handoff-orders"
    (transaction_id,) = send_unknown(real_client, "handoff_group", topic, [b"taken over: commit"])
    dying = subprocess.Popen([sys.executable, "-c", DYING_CHECK_ANSWERER, redis_url], stdout=subprocess.PIPE, text=True)
    try:
        assert dying.stdout.readline().strip() == "ready"
        checker = checkers("--check-interval", "30")
        assert dying.stdout.readline().strip() == f"checking {transaction_id}"
        assert dying.wait(20) == 4
    finally:
        if dying.poll() is None:
            dying.kill()
        dying.wait(10)
    requests = GroupKeys("handoff_group").check_requests
    assert pending(real_client, requests, PRODUCERS_CONSUMER_GROUP) == 1, "the dead instance holds the request"

    listener = CommitKnown({transaction_id})
    with TransactionProducer("handoff_group", listener, redis_url=redis_url, settings=PRODUCER_SETTINGS):
        wait_until(lambda: real_client.xlen(topic) == 1, timeout=20)
    assert listener.checked == [transaction_id], "the taken-over request, not a new check, was answered"
    assert committed(real_client, topic) == {transaction_id: 1}
    assert real_client.xlen(requests) == 0 and pending(real_client, requests, PRODUCERS_CONSUMER_GROUP) == 0
    assert checker.terminate()[0] == 0


# ------------------------------------------------------------------------------------------------ 3. kill -9


def test_two_checkers_one_killed_mid_work_every_transaction_ends_once(real_client, redis_url, checkers):
    topic = "orders-two-checkers"
    bodies = [b"%d-%s" % (i, b"commit" if i % 3 else b"rollback") for i in range(90)]
    ids = send_unknown(real_client, "two_checkers", topic, bodies)
    should_commit = {txid for txid, body in zip(ids, bodies, strict=True) if body.endswith(b"commit")}
    keys = TopicKeys(topic)

    first, second = checkers(), checkers()
    victim_id = first.wait_live(real_client)
    second.wait_live(real_client)

    def victim() -> dict[str, Any]:
        consumers = real_client.xinfo_consumers(REPLY_STREAM, CHECKERS_CONSUMER_GROUP)
        return next((c for c in consumers if c["name"].decode() == victim_id), {"pending": 0, "idle": 10**9})

    answers = ByBody(delay=0.03)  # one check worker: seconds of answers, so the kill lands mid-work
    with TransactionProducer("two_checkers", answers, redis_url=redis_url, settings=PRODUCER_SETTINGS):
        wait_until(lambda: real_client.xlen(topic) >= 5, timeout=30, interval=0.005)
        # Freeze the victim just after it began waiting for answers: the server hands it the next one while it is
        # stopped. Then kill it: answers read and never applied, which the other checker must take over.
        held = 0
        for _ in range(10):
            wait_until(lambda: victim()["idle"] < 20, timeout=5, interval=0.002)
            os.kill(first.process.pid, signal.SIGSTOP)
            try:
                held = wait_until(lambda: victim()["pending"], timeout=1.0, interval=0.005)
                break
            except AssertionError:  # its wait ended before an answer came: let it go on, try again
                os.kill(first.process.pid, signal.SIGCONT)
        first.kill()  # SIGKILL
        left_in_flight = real_client.hlen(keys.inflight)
        wait_until(lambda: real_client.hlen(keys.inflight) == 0, timeout=60)
        drain(real_client, "two_checkers")  # the answers to repeated checks too: none may append again
    print(
        f"\n[kill -9 checker] {left_in_flight} of 90 transactions in flight at the kill; "
        f"the victim held {held} answers read and not applied"
    )
    assert held > 0, "the victim never held an answer: the takeover of a dead checker's answers was not exercised"
    assert left_in_flight > 0, "the kill came after the work was done: the test proved nothing"
    assert second.process.poll() is None, "the surviving checker is still running"
    assert committed(real_client, topic) == dict.fromkeys(should_commit, 1)
    assert len(should_commit) == 60 and real_client.xlen(keys.dead_stream) == 0
    ops = collections.Counter(f[b"transaction_id"].decode() for _, f in real_client.xrange(keys.op_stream))
    assert ops == dict.fromkeys(ids, 1), "one outcome record per transaction"
    assert second.terminate()[0] == 0


# ------------------------------------------------------------------------------------------------- 9. SIGTERM


def test_sigterm_mid_work_exits_zero_and_a_second_checker_finishes(real_client, redis_url, checkers):
    topic = "orders-sigterm"
    bodies = [b"%d-%s" % (i, b"commit" if i % 2 else b"rollback") for i in range(60)]
    ids = send_unknown(real_client, "sigterm_group", topic, bodies)
    should_commit = {txid for txid, body in zip(ids, bodies, strict=True) if body.endswith(b"commit")}
    keys = TopicKeys(topic)

    first = checkers()
    instance = first.wait_live(real_client)
    with TransactionProducer("sigterm_group", ByBody(delay=0.03), redis_url=redis_url, settings=PRODUCER_SETTINGS):
        wait_until(lambda: real_client.xlen(topic) >= 5, timeout=30, interval=0.005)
        status, took = first.terminate()
        left_in_flight = real_client.hlen(keys.inflight)
        print(f"\n[SIGTERM] checker exited with {status} after {took:.2f} s; {left_in_flight} of 60 left in flight")
        assert status == 0, f"not stopped within the grace period, killed: {first.output()}"
        assert f"checker {instance} stopped" in " ".join(first.output().split())
        assert real_client.zscore(CHECKER_INSTANCES, instance) is None, "a stopped checker leaves the live set"
        assert left_in_flight > 0, "the SIGTERM came after the work was done: the test proved nothing"

        successor = checkers()
        successor.wait_live(real_client)
        wait_until(lambda: real_client.hlen(keys.inflight) == 0, timeout=60)
        drain(real_client, "sigterm_group")
    assert committed(real_client, topic) == dict.fromkeys(should_commit, 1)
    assert len(should_commit) == 30
    assert successor.terminate()[0] == 0


# ------------------------------------------------------------------------ 4, 11. operator commands, console script


def test_dead_letters_and_status_through_the_console_script(real_client, redis_url, checkers):
    topic = "orders-dead"
    ids = send_unknown(real_client, "dead_group", topic, [b"a-commit", b"b", b"c", b"d"])
    # no producer reads the checks, so only the latest one of each transaction counts: check_max 1 dead-letters them
    checker = checkers("--transaction-timeout", "0.2", "--check-interval", "0.2", "--check-max", "1")
    wait_until(lambda: real_client.xlen(TopicKeys(topic).dead_stream) == 4, timeout=20)
    assert checker.terminate()[0] == 0

    listed = txmq(redis_url, "dead", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["transaction_id"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == set(ids)
    assert all(
        r["topic"] == topic and r["check_times"] == 1 and r["reason"] == "check_max 1 checks reached"
        for r in rows.values()
    )

    commit, rollback, recheck, _ = ids
    first, second = txmq(redis_url, "dead", "commit", commit), txmq(redis_url, "dead", "commit", commit)
    assert first.returncode == 0 and second.returncode == 0, first.stdout + second.stdout
    assert "nothing changed" not in first.stdout and "nothing changed" in " ".join(second.stdout.split())
    assert committed(real_client, topic) == {commit: 1}
    assert txmq(redis_url, "dead", "rollback", rollback).returncode == 0
    refused = txmq(redis_url, "dead", "commit", rollback)
    assert refused.returncode == 1 and "already ended with ROLLBACK" in " ".join(refused.stderr.split())
    assert txmq(redis_url, "dead", "recheck", recheck).returncode == 0
    keys = TopicKeys(topic)
    assert real_client.hexists(keys.inflight, recheck) and not real_client.hexists(keys.checks, recheck)
    assert committed(real_client, topic) == {commit: 1}

    report = txmq(redis_url, "status", "--json")
    assert report.returncode == 0, report.stderr
    (orders,) = [t for t in json.loads(report.stdout)["topics"] if t["topic"] == topic]
    assert (orders["committed"], orders["in_flight"], orders["dead_letters"]) == (1, 1, 1)
    assert orders["oldest_in_flight_age_seconds"] is not None and orders["oldest_in_flight_age_seconds"] >= 0

    # The rechecked transaction is checked again with a fresh count, and answered by a live producer.
    listener = CommitKnown({recheck})
    with TransactionProducer("dead_group", listener, redis_url=redis_url, settings=PRODUCER_SETTINGS):
        live = json.loads(txmq(redis_url, "status", "--json").stdout)["producer_groups"]
        assert {g["producer_group"]: g["live_instances"] for g in live} == {"dead_group": 1}
        checker = checkers("--transaction-timeout", "0.2", "--check-interval", "0.2", "--check-max", "2")
        wait_until(lambda: real_client.xlen(topic) == 2, timeout=20)
        assert checker.terminate()[0] == 0
    assert committed(real_client, topic) == {commit: 1, recheck: 1}
    assert [row["transaction_id"] for row in json.loads(txmq(redis_url, "dead", "list", "--json").stdout)] == [ids[3]]
