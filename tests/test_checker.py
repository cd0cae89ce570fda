"""The check-back in process: answers, immunity, give-up, operator commands, bad input, bounded memory, status.

Tests that need a live producer answering checks (a reader thread with blocking reads) or a checker running its
loop in a thread use the real ``redis-server``. Tests that drive the checker round by round and write the producer's
side by hand also run on fakeredis (the ``client`` fixture).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from redis_txmq import (
    LocalTransactionState,
    Message,
    Settings,
    TransactionListener,
    TransactionProducer,
    create_topic,
)
from redis_txmq.checker import Checker
from redis_txmq.checker.worker import SCAN_BATCHES
from redis_txmq.cli import main
from redis_txmq.core.errors import TransactionConflictError
from redis_txmq.core.keys import (
    CHECKERS_CONSUMER_GROUP,
    PRODUCERS_CONSUMER_GROUP,
    REPLY_STREAM,
    SCHEDULE,
    TOPIC_REGISTRY,
    GroupKeys,
    TopicKeys,
)
from redis_txmq.ops.admin import dead_letters, resolve_dead
from redis_txmq.ops.admin import status as read_status
from redis_txmq.sync.broker import DeadAction, EndSource, RedisBroker

from .helpers import pending, server_ms, wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
TOPIC = "orders"
GROUP = "order_group"
KEYS = TopicKeys(TOPIC)
REQUESTS = GroupKeys(GROUP).check_requests
FAST = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, claim_idle=1.0)


# ----------------------------------------------------------------------------------------------------------- helpers


class Answers(TransactionListener):
    """Executes with ``arg``; answers a check from ``decisions[transaction_id]`` or ``default``.

    An answer may be a state, ``None``, an exception (raised), a list of those (one per check, the last repeats) or
    a function of the message. Counts the checks it answered per transaction id."""

    def __init__(self, default: Any = UNKNOWN) -> None:
        self.default = default
        self.decisions: dict[str, Any] = {}
        self.checked: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return arg

    def check_local_transaction(self, message: Message) -> Any:
        txid = message.transaction_id or ""
        with self._lock:
            self.checked[txid] += 1
            seen = self.checked[txid]
        answer = self.decisions.get(txid, self.default)
        if isinstance(answer, list):
            answer = answer[min(seen, len(answer)) - 1]
        elif callable(answer) and not isinstance(answer, BaseException):
            answer = answer(message)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def committed(client: Any, stream: str = TOPIC) -> collections.Counter[str]:
    """How many times each transaction id occurs in a topic stream."""
    return collections.Counter(fields[b"transaction_id"].decode() for _, fields in client.xrange(stream))


def leftovers(client: Any, keys: TopicKeys = KEYS, group: str = GROUP) -> dict[str, int]:
    """What a topic and its group keep for transactions that are not finished; all 0 when everything ended."""
    return {
        "half": client.xlen(keys.half_stream),
        "inflight": client.hlen(keys.inflight),
        "unchecked": client.zcard(keys.unchecked),
        "due": client.zcard(keys.due),
        "checks": client.hlen(keys.checks),
        "remarks": client.hlen(keys.remarks),
        "requests": client.xlen(GroupKeys(group).check_requests),
        "request_index": client.hlen(keys.check_requests),
        "replies": client.xlen(REPLY_STREAM),
    }


NOTHING_LEFT = dict.fromkeys(
    ("half", "inflight", "unchecked", "due", "checks", "remarks", "requests", "request_index", "replies"), 0
)


def requested(client: Any, group: str = GROUP) -> list[str]:
    """Transaction ids of the check requests in a group's request stream, in order."""
    return [fields[b"transaction_id"].decode() for _, fields in client.xrange(GroupKeys(group).check_requests)]


def prepare(broker: RedisBroker, txid: str, body: bytes = b"x", **message: Any) -> str:
    """A half message, as a producer that died right after its prepare leaves it; returns its half id."""
    return broker.prepare_half(KEYS, Message(TOPIC, body, **message), txid, GROUP).half_id


def reply(client: Any, txid: str, state: str, half_id: str = "", group: str = GROUP, stream: str = TOPIC) -> str:
    """A check answer, as a producer of ``group`` writes it to the reply stream."""
    fields = {
        "stream": stream,
        "topic": TOPIC,
        "transaction_id": txid,
        "producer_group": group,
        "half_id": half_id,
        "state": state,
        "remark": "",
    }
    return client.xadd(REPLY_STREAM, fields).decode()


def run_rounds(checker: Checker, condition: Any, timeout: float = 10.0) -> Any:
    def step() -> Any:
        checker.run_round()
        return condition()

    return wait_until(step, timeout=timeout)


@contextlib.contextmanager
def running(checker: Checker) -> Iterator[threading.Thread]:
    """``checker.run`` in a thread, as ``txmq checker`` runs it; stopped on exit, and it must not have died."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            checker.run(stop)
        except BaseException as exc:  # noqa: BLE001 - recorded, the test fails on it
            errors.append(exc)

    thread = threading.Thread(target=work, name="test-checker", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive(), "the checker did not stop"
    assert not errors, f"the checker died: {errors!r}"


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(record.getMessage() for record in caplog.records)


@pytest.fixture
def listener() -> Answers:
    return Answers()


@pytest.fixture
def producer(real_client, listener, make_producer) -> Iterator[TransactionProducer]:
    """The check-backs are answered by a producer of each API (sync, and asyncio through a sync facade)."""
    with make_producer(GROUP, listener, client=real_client, settings=FAST) as producer:
        yield producer


@pytest.fixture
def checker(real_client) -> Checker:
    return Checker(real_client, FAST, scan_interval=0.05)


# --------------------------------------------------------------------------------------- 1. answers of the producer


@pytest.mark.parametrize("answer", [COMMIT, ROLLBACK])
def test_unknown_at_send_is_ended_by_the_producers_check_answer(real_client, producer, listener, checker, answer):
    listener.default = answer
    result = producer.send_message_in_transaction(Message(TOPIC, b"paid", keys="order-1"), UNKNOWN)
    assert result.local_transaction_state is UNKNOWN and result.committed_id is None
    assert real_client.xlen(TOPIC) == 0 and real_client.hget(KEYS.inflight, result.transaction_id)

    with running(checker):
        wait_until(lambda: leftovers(real_client) == NOTHING_LEFT)
        wait_until(lambda: pending(real_client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP) == 0)

    assert listener.checked[result.transaction_id] >= 1
    assert pending(real_client, REQUESTS, PRODUCERS_CONSUMER_GROUP) == 0
    *_, (_, op) = real_client.xrange(KEYS.op_stream)
    assert (op[b"transaction_id"].decode(), op[b"outcome"], op[b"source"]) == (
        result.transaction_id,
        answer.value.encode(),
        b"checker",
    )
    if answer is COMMIT:
        assert committed(real_client) == {result.transaction_id: 1}
        ((_, fields),) = real_client.xrange(TOPIC)
        assert fields[b"body"] == b"paid" and fields[b"keys"] == b"order-1"
    else:
        assert real_client.xlen(TOPIC) == 0, "a rolled-back message never reaches the topic stream"


def test_unknown_answers_are_checked_again_until_the_producer_knows(real_client, producer, listener, checker):
    result = producer.send_message_in_transaction(Message(TOPIC, b"late"), UNKNOWN)
    listener.decisions[result.transaction_id] = [UNKNOWN, None, COMMIT]  # UNKNOWN twice, then it knows
    with running(checker):
        wait_until(lambda: real_client.xlen(TOPIC) == 1)
        wait_until(lambda: leftovers(real_client) == NOTHING_LEFT)
    assert listener.checked[result.transaction_id] >= 3, "every UNKNOWN answer is followed by another check"
    assert committed(real_client) == {result.transaction_id: 1}


def test_a_request_no_producer_was_there_to_read_waits_for_the_next_one(real_client, listener, make_producer):
    settings = Settings(transaction_timeout=0.1, check_interval=30, heartbeat_interval=0.5, claim_idle=1.0)
    with make_producer(GROUP, Answers(), client=real_client, settings=settings) as first:
        result = first.send_message_in_transaction(Message(TOPIC, b"waited"), UNKNOWN)
    checker = Checker(real_client, settings, scan_interval=0.05)
    run_rounds(checker, lambda: requested(real_client) == [result.transaction_id])
    assert real_client.hget(KEYS.checks, result.transaction_id) == b"1", "an unread request still counts as a check"

    listener.default = COMMIT
    with make_producer(GROUP, listener, client=real_client, settings=settings):
        with running(checker):
            wait_until(lambda: real_client.xlen(TOPIC) == 1)
    assert listener.checked == {result.transaction_id: 1}, "the durable request was answered, no second check"
    assert committed(real_client) == {result.transaction_id: 1}


# ------------------------------------------------------------------------------- 3. a checker that died mid-work


@pytest.mark.parametrize("died", ["before applying", "after applying, before the ack"])
def test_answers_read_by_a_dead_checker_are_applied_once_by_another(client, died):
    settings = Settings(transaction_timeout=30, check_interval=30, claim_idle=0.2)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    half_id = prepare(broker, "tx", b"taken over")
    reply(client, "tx", "COMMIT", half_id)
    dead = Checker(client, settings, instance_id="dead-checker")
    dead.start()
    ((_, [(reply_id, fields)]),) = client.xreadgroup(CHECKERS_CONSUMER_GROUP, "dead-checker", {REPLY_STREAM: ">"})
    if died != "before applying":
        end = dead._end_of(reply_id.decode(), {k.decode(): v for k, v in fields.items()})
        (result,) = dead.broker.end_transactions([end])
        assert result.applied
        assert committed(client) == {"tx": 1}
    # ... and the process is gone: the answer stays pending under its name.
    survivor = Checker(client, settings, instance_id="survivor")
    assert survivor.run_round().replies_applied == 0, "not taken over before claim_idle"
    run_rounds(survivor, lambda: pending(client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP) == 0)
    assert committed(client) == {"tx": 1}
    assert client.xlen(REPLY_STREAM) == 0 and leftovers(client) == NOTHING_LEFT


def test_check_back_on_a_partitioned_topic(real_client, listener, checker, make_producer):
    create_topic(real_client, "porders", 3)
    listener.default = lambda message: COMMIT if message.body.startswith(b"commit") else ROLLBACK
    with make_producer(GROUP, listener, client=real_client, settings=FAST) as producer:
        results = [
            producer.send_message_in_transaction(
                Message("porders", b"%s-%d" % (b"commit" if i % 2 else b"rollback", i), keys=f"k{i}"), UNKNOWN
            )
            for i in range(12)
        ]
        partitions = [TopicKeys("porders", p, partitioned=True) for p in range(3)]
        assert all(real_client.hlen(k.inflight) for k in partitions), "the keys spread over every partition"
        with running(checker):
            wait_until(lambda: all(leftovers(real_client, k) == NOTHING_LEFT for k in partitions))
    counts = sum((committed(real_client, k.topic_stream) for k in partitions), collections.Counter())
    assert counts == {r.transaction_id: 1 for i, r in enumerate(results) if i % 2}
    assert real_client.xlen("porders") == 0, "partitions have their own streams"


# ------------------------------------------------------------------------ 4-5. giving up, and the operator commands


def test_check_max_dead_letters_then_cli_lists_commits_rolls_back_and_rechecks(
    real_client, redis_url, listener, caplog
):
    caplog.set_level(logging.WARNING)
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=2, heartbeat_interval=0.5)
    runner = CliRunner()

    def txmq(*args: str) -> Any:
        return runner.invoke(main, [*args, "--redis-url", redis_url], env={"TXMQ_LOG_LEVEL": "WARNING"})

    with TransactionProducer(GROUP, listener, client=real_client, settings=settings) as producer:
        results = [
            producer.send_message_in_transaction(Message(TOPIC, f"m{i}".encode(), tags="t"), UNKNOWN) for i in range(4)
        ]
        ids = [r.transaction_id for r in results]
        listener.decisions = {ids[0]: None, ids[1]: RuntimeError("order database unreachable")}  # others: UNKNOWN
        checker = Checker(real_client, settings)
        run_rounds(checker, lambda: real_client.xlen(KEYS.dead_stream) == 4)
        wait_until(lambda: real_client.xlen(REQUESTS) == 0)  # every request sent was answered
        assert listener.checked == {txid: 2 for txid in ids}, "exactly check_max checks, then given up"
    assert leftovers(real_client) == NOTHING_LEFT | {"replies": real_client.xlen(REPLY_STREAM)}
    checker.run_round()  # the answers that came after the burial are refused, not applied
    assert real_client.xlen(REPLY_STREAM) == 0 and real_client.xlen(TOPIC) == 0

    listed = txmq("dead", "list", "--json")
    assert listed.exit_code == 0, listed.output
    rows = {row["transaction_id"]: row for row in json.loads(listed.output)}
    assert set(rows) == set(ids)
    for row in rows.values():
        assert row["topic"] == TOPIC and row["producer_group"] == GROUP and row["tags"] == "t"
        assert row["check_times"] == 2 and "check_max 2" in row["reason"]
    assert "order database unreachable" in rows[ids[1]]["remark"]
    assert "dead-lettered: check_max 2" in logged(caplog)

    commit, rollback, recheck, untouched = ids
    first, second = txmq("dead", "commit", commit), txmq("dead", "commit", commit)
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert "nothing changed" not in " ".join(first.output.split())
    assert "nothing changed" in " ".join(second.output.split())
    assert committed(real_client) == {commit: 1}
    ((_, entry),) = real_client.xrange(TOPIC)
    assert entry[b"body"] == b"m0" and entry[b"tags"] == b"t"

    assert txmq("dead", "rollback", rollback).exit_code == 0
    assert txmq("dead", "rollback", rollback).exit_code == 0, "a repeated rollback is answered like the first"
    conflict = txmq("dead", "commit", rollback)
    assert conflict.exit_code == 1 and "already ended with ROLLBACK" in " ".join(conflict.output.split())
    operator_ops = [f for _, f in real_client.xrange(KEYS.op_stream) if f[b"source"] == b"operator"]
    assert sorted((f[b"transaction_id"].decode(), f[b"outcome"].decode()) for f in operator_ops) == sorted(
        [(commit, "COMMIT"), (rollback, "ROLLBACK")]
    )

    assert txmq("dead", "recheck", recheck).exit_code == 0
    assert real_client.hget(KEYS.inflight, recheck) and not real_client.hexists(KEYS.checks, recheck)
    assert real_client.zscore(KEYS.due, recheck) <= server_ms(real_client), "a rechecked transaction is due now"
    assert {row["transaction_id"] for row in json.loads(txmq("dead", "list", "--json").output)} == {untouched}

    # Back in flight with its check count reset: with check_max 2, a kept count would bury it on the next claim.
    with TransactionProducer(GROUP, listener, client=real_client, settings=settings):
        checker.run_round()
        assert real_client.hget(KEYS.checks, recheck) == b"1" and real_client.hexists(KEYS.inflight, recheck)
        listener.decisions[recheck] = COMMIT
        run_rounds(checker, lambda: real_client.xlen(TOPIC) == 2)
    assert committed(real_client) == {commit: 1, recheck: 1}
    assert real_client.xlen(KEYS.dead_stream) == 1 and real_client.hlen(KEYS.inflight) == 0


def test_without_any_live_producer_one_request_is_kept_and_max_age_gives_up(client):
    """No producer ever reads the requests: they do not count towards check_max (each one's check is given back
    when the next replaces it), and the transaction is given up at max_age. Its group's request stream holds one
    request while it is in flight (each check replaces the last one) and none once it is dead-lettered: memory
    follows in-flight transactions, not checks."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=3)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    half_id = prepare(broker, "lonely", b"nobody answers")
    checker = Checker(client, settings)
    sent, seen_checks = 0, set()

    def step() -> bool:
        nonlocal sent
        sent += checker.run_round().checks_sent
        assert len(requested(client)) <= 1, "at most one pending request per transaction"
        seen_checks.update(int(f[b"check_times"]) for _, f in client.xrange(GroupKeys(GROUP).check_requests))
        assert client.xlen(KEYS.dead_stream) == 0, "dead-lettered for checks nobody read"
        return sent >= 3 * settings.check_max

    wait_until(step)
    assert seen_checks == {1} and client.hget(KEYS.checks, "lonely") == b"1", "only the pending request counts"
    run_rounds(Checker(client, replace(settings, max_age=0.1)), lambda: client.xlen(KEYS.dead_stream) == 1)
    ((_, dead),) = client.xrange(KEYS.dead_stream)
    assert dead[b"body"] == b"nobody answers" and dead[b"half_id"].decode() == half_id
    assert dead[b"check_times"] == b"1" and dead[b"dead_reason"].startswith(b"older than max_age")
    assert leftovers(client) == NOTHING_LEFT, "the dead-lettered transaction's request is deleted with it"


def test_requests_without_live_producer_do_not_pile_up(real_client):
    """100 transactions of 100 KB, check_max 5, no producer alive: the request stream never holds more than one
    request per transaction, and nothing once all are dead-lettered (it used to keep 500 requests, 57 MB)."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=5)
    broker = RedisBroker(real_client, settings)
    broker.load_scripts()
    body = b"x" * 100_000
    for i in range(100):
        prepare(broker, f"big-{i}", body)
    checker = Checker(real_client, settings)
    most = sent = 0

    def step(checker: Checker, enough: Any) -> Any:
        def one() -> Any:
            nonlocal most, sent
            sent += checker.run_round().checks_sent
            most = max(most, real_client.xlen(GroupKeys(GROUP).check_requests))
            return enough()

        return one

    def outage() -> bool:
        assert real_client.xlen(KEYS.dead_stream) == 0, "dead-lettered for checks nobody read"
        return sent >= 100 * (settings.check_max + 1)

    wait_until(step(checker, outage), timeout=30)
    given_up = Checker(real_client, replace(settings, max_age=0.1))
    wait_until(step(given_up, lambda: real_client.xlen(KEYS.dead_stream) == 100), timeout=30)
    assert most <= 100
    assert leftovers(real_client) == NOTHING_LEFT


def test_request_of_a_checked_transaction_is_deleted_when_its_producer_ends_it(real_client):
    """A late end from the producer (after a check request went out to a group with no live instance) deletes
    the request with the transaction: no answer can be needed any more."""
    settings = Settings(transaction_timeout=0, check_interval=60)
    broker = RedisBroker(real_client, settings)
    broker.load_scripts()
    prepare(broker, "late")
    Checker(real_client, settings).run_round()
    assert requested(real_client) == ["late"] and real_client.hlen(KEYS.check_requests) == 1
    result = broker.end_transaction(KEYS, "late", GROUP, COMMIT, source=EndSource.PRODUCER)
    assert result.applied and result.check_request
    assert leftovers(real_client) == NOTHING_LEFT


def test_max_age_dead_letters_the_whole_message(client):
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1000, max_age=0.3)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    message = {"keys": ["order-7", "customer-3"], "tags": "created", "properties": {"source": "web"}}
    half_id = prepare(broker, "ancient", b"\x00old\xff", **message)
    born = server_ms(client)
    checker = Checker(client, settings)
    run_rounds(checker, lambda: client.xlen(KEYS.dead_stream) == 1)
    assert server_ms(client) - born >= 300

    ((_, dead),) = client.xrange(KEYS.dead_stream)
    assert b"max_age" in dead[b"dead_reason"] and b"300" in dead[b"dead_reason"]
    assert (dead[b"body"], dead[b"keys"], dead[b"tags"], dead[b"properties"]) == (
        b"\x00old\xff",
        b"order-7 customer-3",
        b"created",
        b'{"source":"web"}',
    )
    assert dead[b"half_id"].decode() == half_id and int(dead[b"check_times"]) >= 1
    assert leftovers(client) | {"requests": 0} == NOTHING_LEFT
    (row,) = dead_letters(client)
    assert row["transaction_id"] == "ancient" and "max_age" in row["reason"] and row["body_bytes"] == 5

    # The operator commits it: the topic entry is the message as it was sent, once.
    _, result = resolve_dead(broker, "ancient", DeadAction.COMMIT)
    assert result.applied and result.state == "COMMIT"
    _, again = resolve_dead(broker, "ancient", DeadAction.COMMIT)
    assert not again.applied and again.committed_id == result.committed_id
    with pytest.raises(TransactionConflictError):
        resolve_dead(broker, "ancient", DeadAction.ROLLBACK)
    ((entry_id, entry),) = client.xrange(TOPIC)
    assert entry_id.decode() == result.committed_id
    assert entry == {
        b"transaction_id": b"ancient",
        b"body": b"\x00old\xff",
        b"keys": b"order-7 customer-3",
        b"tags": b"created",
        b"properties": b'{"source":"web"}',
    }
    assert client.xlen(KEYS.dead_stream) == 0 and dead_letters(client) == []


def test_max_age_with_a_producer_that_never_knows(real_client, listener, make_producer):
    settings = Settings(transaction_timeout=0, check_interval=0.1, check_max=1000, max_age=0.5, heartbeat_interval=0.5)
    with make_producer(GROUP, listener, client=real_client, settings=settings) as producer:
        result = producer.send_message_in_transaction(Message(TOPIC, b"forever unknown"), UNKNOWN)
        with running(Checker(real_client, settings, scan_interval=0.05)):
            wait_until(lambda: real_client.xlen(KEYS.dead_stream) == 1)
    (row,) = dead_letters(real_client)
    assert row["transaction_id"] == result.transaction_id and "max_age 500 ms" in row["reason"]
    assert row["check_times"] >= 2 and listener.checked[result.transaction_id] >= 2
    assert real_client.xlen(TOPIC) == 0 and real_client.hlen(KEYS.inflight) == 0


# ---------------------------------------------------------------------------------------- 6. per-message immunity


def test_per_message_immunity_overrides_the_transaction_timeout(client):
    settings = Settings(transaction_timeout=1.0, check_interval=30)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    immunity_ms = {"long": 2000, "short": 200, "plain": 1000}  # plain: the global transaction_timeout
    for txid, ms in immunity_ms.items():
        own = {"check_immunity_seconds": ms / 1000} if txid != "plain" else {}
        prepare(broker, txid, txid.encode(), **own)
    born = {f[b"transaction_id"].decode(): int(f[b"born_ms"]) for _, f in client.xrange(KEYS.half_stream)}

    checker = Checker(client, settings)
    first_check: dict[str, tuple[int, int]] = {}  # transaction -> server time before and after the scan that asked

    def scan() -> bool:
        before = server_ms(client)
        checker.run_round()
        after = server_ms(client)
        for txid in set(requested(client)) - set(first_check):
            first_check[txid] = (before, after)
        return len(first_check) == 3

    wait_until(scan, timeout=10, interval=0.01)
    for txid, ms in immunity_ms.items():
        _, after = first_check[txid]
        assert after >= born[txid] + ms, f"{txid}: checked before its immunity of {ms} ms"
    before, _ = first_check["short"]
    assert before < born["short"] + 1000, "a short immunity is checked before the global transaction_timeout"
    assert sorted(first_check, key=first_check.__getitem__) == ["short", "plain", "long"]
    assert sorted(requested(client)) == ["long", "plain", "short"], "one check each within check_interval"


def test_immunity_with_a_live_producer(real_client, listener, make_producer):
    settings = Settings(transaction_timeout=0.8, check_interval=30, heartbeat_interval=0.5)
    listener.default = COMMIT
    with make_producer(GROUP, listener, client=real_client, settings=settings) as producer:
        long = producer.send_message_in_transaction(Message(TOPIC, b"long", check_immunity_seconds=1.6), UNKNOWN)
        short = producer.send_message_in_transaction(Message(TOPIC, b"short", check_immunity_seconds=0.1), UNKNOWN)
        sent = time.monotonic()
        with running(Checker(real_client, settings, scan_interval=0.02)):
            wait_until(lambda: real_client.xlen(TOPIC) == 1)
            short_after = time.monotonic() - sent
            assert real_client.hexists(KEYS.inflight, long.transaction_id)
            wait_until(lambda: real_client.xlen(TOPIC) == 2)
            long_after = time.monotonic() - sent
    assert [f[b"body"] for _, f in real_client.xrange(TOPIC)] == [b"short", b"long"]
    assert short_after < 0.8, f"short immunity resolved after {short_after:.2f} s, not before the global timeout"
    assert long_after >= 1.6 - 0.1, f"long immunity resolved after {long_after:.2f} s"  # sent ~ms after born
    assert listener.checked == {short.transaction_id: 1, long.transaction_id: 1}


# ------------------------------------------------------------------------------- 7. duplicate and late replies


def test_duplicate_late_and_forged_replies_never_append_twice(client, caplog):
    caplog.set_level(logging.INFO)
    settings = Settings(transaction_timeout=30, check_interval=30)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    halves = {txid: prepare(broker, txid, txid.encode()) for txid in ("a", "b", "c")}
    checker = Checker(client, settings)

    # Two identical COMMIT answers and a ROLLBACK in one batch: the first decides, once.
    reply(client, "a", "COMMIT", halves["a"])
    reply(client, "a", "COMMIT", halves["a"])
    reply(client, "a", "ROLLBACK", halves["a"])
    assert checker.run_round().replies_applied == 1
    assert committed(client) == {"a": 1}
    assert "already ended with COMMIT" in logged(caplog)

    # Late: after the commit, the same answer again, the other one, and an UNKNOWN.
    for state in ("COMMIT", "ROLLBACK", "UNKNOWN", "COMMIT"):
        reply(client, "a", state, halves["a"])
    assert checker.run_round().replies_applied == 0
    assert committed(client) == {"a": 1}

    # A forged answer from another group, and one naming another half message, are refused.
    reply(client, "b", "COMMIT", halves["b"], group="other_group")
    reply(client, "b", "COMMIT", "1-1")
    assert checker.run_round().replies_applied == 0
    assert client.hget(KEYS.inflight, "b").decode() == halves["b"] and committed(client) == {"a": 1}
    text = logged(caplog)
    assert "belongs to producer group order_group" in text and "not 1-1" in text

    # ROLLBACK, then a late COMMIT: never appears.
    reply(client, "b", "ROLLBACK", halves["b"])
    reply(client, "b", "COMMIT", halves["b"])
    assert checker.run_round().replies_applied == 1
    assert "b" not in committed(client) and not client.hexists(KEYS.inflight, "b")

    # Past the dedupe window the outcome is forgotten: a late answer finds nothing and still appends nothing.
    reply(client, "c", "COMMIT", halves["c"])
    assert checker.run_round().replies_applied == 1
    client.zadd(KEYS.ended_at, {"c": 0})  # its outcome is now older than the dedupe window
    client.zadd(SCHEDULE, {TOPIC: 0})  # and the checkers' schedule says so
    reply(client, "c", "COMMIT", halves["c"])
    reply(client, "c", "ROLLBACK", halves["c"])
    assert checker.run_round().replies_applied == 0
    assert not client.hexists(KEYS.ended, "c")
    assert committed(client) == {"a": 1, "c": 1}
    assert "no in-flight transaction with this id" in logged(caplog)

    assert client.xlen(REPLY_STREAM) == 0 and pending(client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP) == 0
    assert [f[b"outcome"] for _, f in client.xrange(KEYS.op_stream)] == [b"COMMIT", b"ROLLBACK", b"COMMIT"]


def test_duplicate_replies_after_a_check_back_commit(real_client, producer, listener, checker):
    listener.default = COMMIT
    result = producer.send_message_in_transaction(Message(TOPIC, b"once"), UNKNOWN)
    with running(checker):
        wait_until(lambda: real_client.xlen(TOPIC) == 1)
        # What the producer wrote, again (a retried XADD), and the opposite answer from a confused instance.
        reply(real_client, result.transaction_id, "COMMIT", result.half_id)
        reply(real_client, result.transaction_id, "COMMIT", result.half_id)
        reply(real_client, result.transaction_id, "ROLLBACK", result.half_id)
        wait_until(lambda: real_client.xlen(REPLY_STREAM) == 0)
        wait_until(lambda: pending(real_client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP) == 0)
    assert committed(real_client) == {result.transaction_id: 1}
    assert [f[b"outcome"] for _, f in real_client.xrange(KEYS.op_stream)] == [b"COMMIT"]


# --------------------------------------------------------------------------------------------- 8. malformed input


def test_malformed_half_entries_are_dead_lettered_while_a_good_transaction_commits(client, caplog):
    caplog.set_level(logging.INFO)
    settings = Settings(transaction_timeout=0, check_interval=30)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    good_half = prepare(broker, "good", b"good")
    (good_fields,) = [fields for _, fields in client.xrange(KEYS.half_stream)]

    # Written by other tools, straight into the half stream (XADD, no index):
    raw = client.xadd(KEYS.half_stream, {"garbage": "no transaction"}).decode()
    ghost = client.xadd(KEYS.half_stream, {"transaction_id": "ghost", "body": "b"}).decode()
    copy = client.xadd(KEYS.half_stream, good_fields).decode()  # a second copy of an in-flight transaction
    # ... and with the index entries but fields missing, or no half message at all:
    hand_made = client.xadd(KEYS.half_stream, {"transaction_id": "hand-made"}).decode()
    client.hset(KEYS.inflight, mapping={"hand-made": hand_made, "vanished": "1-1"})
    client.zadd(KEYS.unchecked, {"hand-made": 0, "vanished": 0})
    client.zadd(KEYS.due, {"stale": 0})  # an index entry without a transaction

    checker = Checker(client, settings)
    stats = checker.run_round()  # the sweep runs on the first scan
    assert stats.dead_lettered == 5 and stats.checks_sent == 1
    assert requested(client) == ["good"] and client.hget(KEYS.inflight, "good").decode() == good_half

    dead = {fields[b"half_id"].decode(): fields for _, fields in client.xrange(KEYS.dead_stream)}
    assert set(dead) == {raw, ghost, copy, hand_made, "1-1"}
    for half_id in (raw, ghost, copy):
        assert dead[half_id][b"dead_reason"].startswith(b"half message not owned by an in-flight transaction")
    assert dead[hand_made][b"dead_reason"].startswith(b"malformed half message")
    assert b"missing from the half stream" in dead["1-1"][b"dead_reason"]
    assert dead[raw][b"garbage"] == b"no transaction" and dead[ghost][b"body"] == b"b", "kept whole"
    assert dead[copy][b"body"] == b"good"
    index = {k.decode(): v.decode() for k, v in client.hgetall(KEYS.dead_index).items()}
    assert set(index) == {"ghost", "hand-made", "vanished"}, "the copy did not take over the good transaction"
    assert client.zscore(KEYS.due, "stale") is None, "an index entry without a transaction is dropped"
    text = logged(caplog)
    assert "dead-lettered: malformed half message" in text and "half entry" in text

    reply(client, "good", "COMMIT", good_half)
    assert checker.run_round().replies_applied == 1
    assert committed(client) == {"good": 1}
    assert leftovers(client) | {"requests": 0} == NOTHING_LEFT
    assert len(dead_letters(client)) == 5


def test_malformed_replies_are_skipped_and_the_checker_goes_on(client, caplog):
    caplog.set_level(logging.INFO)
    settings = Settings(transaction_timeout=30, check_interval=30)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    half_id = prepare(broker, "good", b"good")
    bad = [
        client.xadd(REPLY_STREAM, {"state": "MAYBE"}),
        client.xadd(REPLY_STREAM, {"stream": TOPIC, "transaction_id": "good", "producer_group": GROUP}),
        client.xadd(
            REPLY_STREAM, {"stream": "orders#x", "transaction_id": "good", "producer_group": GROUP, "state": "COMMIT"}
        ),
    ]
    reply(client, "never-prepared", "COMMIT")
    reply(client, "good", "COMMIT", half_id)

    stats = Checker(client, settings).run_round()
    assert stats.replies_applied == 1 and committed(client) == {"good": 1}
    assert client.xlen(REPLY_STREAM) == 0 and pending(client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP) == 0
    text = logged(caplog)
    for entry_id in bad:
        assert f"check answer {entry_id.decode()} skipped: malformed" in text
    assert "tx=never-prepared" in text and "not applied" in text


def test_malformed_registry_member_is_skipped_and_the_checker_goes_on(client, caplog):
    settings = Settings(transaction_timeout=0, check_interval=30)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    prepare(broker, "good", b"good")
    client.sadd(TOPIC_REGISTRY, "orders#not-a-partition")
    checker = Checker(client, settings)
    stats = checker.run_round()
    assert stats.checks_sent == 1 and requested(client) == ["good"]
    checker.run_round()
    reported = [r for r in caplog.records if "'orders#not-a-partition' is not a topic stream key" in r.getMessage()]
    assert len(reported) == 1, "skipped with a reason, logged once"


def test_malformed_requests_and_replies_with_live_workers(real_client, producer, listener, checker, caplog):
    caplog.set_level(logging.INFO)
    listener.default = COMMIT
    nonsense = real_client.xadd(REQUESTS, {"nonsense": "1"}).decode()
    no_half = real_client.xadd(REQUESTS, {"topic": TOPIC, "body": "b", "transaction_id": "t1"}).decode()
    bad_properties = real_client.xadd(
        REQUESTS,
        {"topic": TOPIC, "body": "b", "transaction_id": "t2", "stream": TOPIC, "half_id": "1-1", "properties": "{"},
    ).decode()
    bad_immunity = real_client.xadd(
        REQUESTS,
        {
            "topic": TOPIC,
            "body": "b",
            "transaction_id": "t3",
            "stream": TOPIC,
            "half_id": "1-1",
            "check_immunity_ms": "x",
        },
    ).decode()
    bad_replies = [
        real_client.xadd(REPLY_STREAM, {"state": "MAYBE"}).decode(),
        real_client.xadd(
            REPLY_STREAM, {"stream": "orders#x", "transaction_id": "t", "producer_group": GROUP, "state": "COMMIT"}
        ).decode(),
    ]

    with running(checker) as thread:
        first = producer.send_message_in_transaction(Message(TOPIC, b"first"), UNKNOWN)
        wait_until(lambda: real_client.xlen(TOPIC) == 1)
        assert thread.is_alive()
        second = producer.send_message_in_transaction(Message(TOPIC, b"second"), UNKNOWN)
        wait_until(lambda: real_client.xlen(TOPIC) == 2)
        wait_until(lambda: leftovers(real_client) == NOTHING_LEFT)

    assert committed(real_client) == {first.transaction_id: 1, second.transaction_id: 1}
    assert set(listener.checked) == {first.transaction_id, second.transaction_id}, "malformed requests not answered"
    assert pending(real_client, REQUESTS, PRODUCERS_CONSUMER_GROUP) == 0
    text = logged(caplog)
    assert f"check request {nonsense} skipped" in text and "missing field(s) topic, body, transaction_id" in text
    assert f"check request {no_half} skipped" in text and "missing field(s) stream / half_id" in text
    assert f"check request {bad_properties} skipped" in text and "'properties' is not JSON" in text
    assert f"check request {bad_immunity} skipped" in text and "'check_immunity_ms' is not a number" in text
    for entry_id in bad_replies:
        assert f"check answer {entry_id} skipped: malformed" in text


# ------------------------------------------------------------------------------------------------------ 10. bounded


def test_half_request_and_reply_streams_are_empty_once_everything_is_resolved(real_client, producer, listener, checker):
    listener.default = lambda message: COMMIT if message.body.endswith(b"commit") else ROLLBACK
    should_commit: set[str] = set()
    with running(checker):
        for batch in range(2):
            for i in range(40):
                outcome = (COMMIT, ROLLBACK, UNKNOWN, UNKNOWN)[i % 4]
                later = b"commit" if i % 8 == 2 else b"rollback"  # what a check will be answered
                result = producer.send_message_in_transaction(Message(TOPIC, b"%d-%d-%s" % (batch, i, later)), outcome)
                if outcome is COMMIT or (outcome is UNKNOWN and later == b"commit"):
                    should_commit.add(result.transaction_id)
            wait_until(lambda: leftovers(real_client) == NOTHING_LEFT, timeout=20)
            wait_until(lambda: pending(real_client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP) == 0)
            assert pending(real_client, REQUESTS, PRODUCERS_CONSUMER_GROUP) == 0
            assert len(should_commit) == 15 * (batch + 1)  # 10 committed at send + 5 by a check, per batch
            assert committed(real_client) == dict.fromkeys(should_commit, 1)


# ------------------------------------------------------------------------------------------------------- 11. status


def test_status_json(real_client, redis_url, listener):
    settings = Settings(transaction_timeout=30, check_interval=30, heartbeat_interval=0.5)
    with TransactionProducer("idle_group", Answers(), client=real_client, settings=settings) as idle:
        idle.send_message_in_transaction(Message("refunds", b"r"), ROLLBACK)
    with TransactionProducer(GROUP, listener, client=real_client, settings=settings) as producer:
        producer.send_message_in_transaction(Message(TOPIC, b"c1"), COMMIT)
        producer.send_message_in_transaction(Message(TOPIC, b"c2"), COMMIT)
        before = server_ms(real_client)
        producer.send_message_in_transaction(Message(TOPIC, b"u"), UNKNOWN)
        real_client.xadd(KEYS.half_stream, {"junk": "from another tool"})
        checker = Checker(real_client, settings)
        assert checker.run_round().dead_lettered == 1  # the junk, by the sweep; the UNKNOWN is not due yet

        out = CliRunner().invoke(
            main, ["status", "--json", "--redis-url", redis_url], env={"TXMQ_HEARTBEAT_INTERVAL": "0.5"}
        )
        elapsed = (server_ms(real_client) - before) / 1000
        assert out.exit_code == 0, out.output
        report = json.loads(out.output)
        topics = {t["topic"]: t for t in report["topics"]}
        assert set(topics) == {TOPIC, "refunds"}
        orders = topics[TOPIC]
        assert (orders["committed"], orders["in_flight"], orders["dead_letters"]) == (2, 1, 1)
        assert 0 <= orders["oldest_in_flight_age_seconds"] <= elapsed + 0.01
        assert topics["refunds"] == {
            "topic": "refunds",
            "stream": "refunds",
            "committed": 0,
            "in_flight": 0,
            "oldest_in_flight_age_seconds": None,
            "dead_letters": 0,
        }
        groups = {g["producer_group"]: g for g in report["producer_groups"]}
        assert groups[GROUP]["live_instances"] == 1 and groups["idle_group"]["live_instances"] == 0
        assert groups[GROUP]["pending_check_requests"] == 0
        assert report["checkers"]["live_instances"] == 1
        (server,) = report["servers"]
        assert server["role"] == "master" and server["replicas"] == []
        assert server["redis_version"] == real_client.info("server")["redis_version"]
        port = redis_url.rsplit(":", 1)[1].split("/")[0]
        assert server["server"] in ("redis", "valkey") and server["address"].endswith(f":{port}")

        # The age grows on the server's clock while the transaction stays in flight.
        def oldest_age() -> float:
            (orders,) = [t for t in read_status(real_client, 1.5)["topics"] if t["topic"] == TOPIC]
            return orders["oldest_in_flight_age_seconds"]

        wait_until(lambda: oldest_age() >= 0.3)
    live = {g["producer_group"]: g["live_instances"] for g in read_status(real_client, 1.5)["producer_groups"]}
    assert live == {GROUP: 0, "idle_group": 0}, "a producer that shut down is no longer live"


# --------------------------------------------------------------------------------------- 12. a check that raises


def test_a_raising_check_counts_as_unknown_and_the_handler_keeps_serving(real_client, listener, caplog, make_producer):
    caplog.set_level(logging.INFO)
    settings = Settings(
        transaction_timeout=0.1, check_interval=0.2, check_threads=1, heartbeat_interval=0.5, claim_idle=1.0
    )
    with make_producer(GROUP, listener, client=real_client, settings=settings) as producer:
        bad = producer.send_message_in_transaction(Message(TOPIC, b"bad"), UNKNOWN).transaction_id
        odd = producer.send_message_in_transaction(Message(TOPIC, b"odd"), UNKNOWN).transaction_id
        good = producer.send_message_in_transaction(Message(TOPIC, b"good"), UNKNOWN).transaction_id
        listener.decisions = {bad: ValueError("ledger offline"), odd: "MAYBE", good: COMMIT}
        with running(Checker(real_client, settings, scan_interval=0.05)):
            wait_until(lambda: real_client.xlen(TOPIC) == 1)
            wait_until(lambda: listener.checked[bad] >= 3 and listener.checked[odd] >= 3)
            assert int(real_client.hget(KEYS.checks, bad)) >= 3, "every raising check was counted"
            wait_until(lambda: b"ledger offline" in (real_client.hget(KEYS.remarks, bad) or b""))
            wait_until(lambda: b"returned 'MAYBE'" in (real_client.hget(KEYS.remarks, odd) or b""))
            listener.decisions[bad] = COMMIT  # the same worker, after all those exceptions, still answers
            listener.decisions[odd] = ROLLBACK
            wait_until(lambda: leftovers(real_client) == NOTHING_LEFT)
    assert committed(real_client) == {good: 1, bad: 1}
    text = logged(caplog)
    assert f"tx={bad} topic={TOPIC} check_local_transaction raised" in text
    assert f"tx={odd} topic={TOPIC} check_local_transaction returned 'MAYBE'" in text


def test_a_scan_claims_a_bounded_number_per_topic_and_says_more_are_due(client):
    """A backlog is requested in slices, so the answers of the first slice are applied before the last is sent."""
    settings = Settings(transaction_timeout=0, check_interval=30)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    for i in range(25):
        prepare(broker, f"tx-{i}")
    checker = Checker(client, settings, batch_size=2)
    first = checker.scan()
    assert (first.checks_sent, first.more_due) == (2 * SCAN_BATCHES, True)
    second = checker.scan()
    assert (second.checks_sent, second.more_due) == (25 - 2 * SCAN_BATCHES, False)
    assert client.xlen(GroupKeys(GROUP).check_requests) == 25


# -------------------------------------------------------------- 13. check_max counts the checks that reached a producer


def test_checks_no_producer_read_do_not_spend_check_max(real_client, listener, make_producer):
    """A committed transaction whose end was lost must not need an operator because no producer could read its
    checks for a while (a failover, a restart of every instance): with check_max 2 and no producer of the group
    running, a request is sent every check_interval and replaced, unread, by the next one; none of them counts, so
    the transaction is not dead-lettered however many are sent, and the producer that starts next commits it."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=2, heartbeat_interval=0.5, claim_idle=1.0)
    with make_producer(GROUP, Answers(), client=real_client, settings=settings) as gone:
        result = gone.send_message_in_transaction(Message(TOPIC, b"committed, end lost"), UNKNOWN)
    checker = Checker(real_client, settings)
    sent = 0

    def outage() -> bool:
        nonlocal sent
        sent += checker.run_round().checks_sent
        assert real_client.xlen(KEYS.dead_stream) == 0, "dead-lettered for checks that no producer read"
        return sent >= 5 * settings.check_max

    wait_until(outage)
    assert requested(real_client) == [result.transaction_id], "one request kept, for the next producer"
    assert real_client.hget(KEYS.checks, result.transaction_id) == b"1", "only the pending request counts"

    listener.default = COMMIT
    with make_producer(GROUP, listener, client=real_client, settings=settings):
        # a long interval from here: the pending request alone must reach the producer, no later check needed
        run_rounds(Checker(real_client, replace(settings, check_interval=30)), lambda: real_client.xlen(TOPIC) == 1)
    assert committed(real_client) == {result.transaction_id: 1}
    assert real_client.xlen(KEYS.dead_stream) == 0 and real_client.hlen(KEYS.inflight) == 0


def test_a_check_a_producer_read_counts_and_one_nobody_read_does_not(client):
    """Read means delivered to a producer instance: a request read and never answered (its reader died with it in
    hand, or hangs) counts, so that transaction is dead-lettered at check_max; a request still unread when the next
    check replaces it gives its check back, so the transaction of a group nobody reads stays in flight, counting
    one check (the pending one), until a producer answers it."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=3)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    prepare(broker, "read")
    broker.prepare_half(KEYS, Message(TOPIC, b"unread"), "unread", "idle_group")
    idle_requests = GroupKeys("idle_group").check_requests
    for stream in (REQUESTS, idle_requests):
        client.xgroup_create(stream, PRODUCERS_CONSUMER_GROUP, "0", mkstream=True)
    checker = Checker(client, settings)
    sent = 0

    def step() -> bool:
        nonlocal sent
        sent += checker.run_round().checks_sent
        client.xreadgroup(PRODUCERS_CONSUMER_GROUP, "hangs", {REQUESTS: ">"})  # read, never answered
        assert not client.hexists(KEYS.dead_index, "unread"), "dead-lettered for checks that no producer read"
        return client.hexists(KEYS.dead_index, "read") and sent >= 6 * settings.check_max

    wait_until(step)
    (dead,) = dead_letters(client)
    assert (dead["transaction_id"], dead["check_times"]) == ("read", 3) and "check_max 3" in dead["reason"]
    assert client.hget(KEYS.checks, "unread") == b"1" and client.hexists(KEYS.inflight, "unread")
    (request_id, request), *more = client.xrange(idle_requests)
    assert not more and request[b"transaction_id"] == b"unread" and request[b"check_times"] == b"1"

    client.xreadgroup(PRODUCERS_CONSUMER_GROUP, "back", {idle_requests: ">"})  # a producer of the group is back
    reply(client, "unread", "COMMIT", group="idle_group")
    client.xack(idle_requests, PRODUCERS_CONSUMER_GROUP, request_id)
    client.xdel(idle_requests, request_id)
    run_rounds(checker, lambda: client.xlen(TOPIC) == 1)
    assert committed(client) == {"unread": 1} and client.hlen(KEYS.inflight) == 0


def test_a_check_is_given_back_once_and_never_below_zero(client):
    """The note that gives a check back is idempotent (redis-py repeats a call whose reply was lost): it gives back
    only while the unread request is still the one noted for the transaction."""
    from redis_txmq.core.protocol import SentCheck

    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=5)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    prepare(broker, "tx")
    Checker(client, settings).run_round()
    (first, _), *_ = client.xrange(REQUESTS)
    first = first.decode()
    wait_until(lambda: broker.claim_checks(KEYS, 10).to_check)  # the next check: counted, 2 so far
    assert client.hget(KEYS.checks, "tx") == b"2"
    note = [SentCheck("tx", "9999999999999-0", first)]
    assert broker.note_check_requests(KEYS, note).given_back == 1
    assert broker.note_check_requests(KEYS, note).given_back == 0, "a repeated note gives nothing back twice"
    assert client.hget(KEYS.checks, "tx") == b"1" and client.hget(KEYS.check_requests, "tx") == b"9999999999999-0"

    client.hset(KEYS.checks, "tx", 0)
    assert broker.note_check_requests(KEYS, [SentCheck("tx", "9999999999999-1", "9999999999999-0")]).given_back == 0
    assert client.hget(KEYS.checks, "tx") == b"0"
    assert broker.note_check_requests(KEYS, [SentCheck("ended", "9999999999999-2", "1-0")]).stale == [
        "9999999999999-2"
    ], "a transaction that ended meanwhile: its new request is stale"
