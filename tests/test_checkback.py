"""The check-back, in process, on a real Redis: checks, answers, dead letters, malformed input, bounded memory."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from checker import Checker
from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.cli import main
from redis_txmq.keys import REPLY_STREAM, GroupKeys, TopicKeys

from .helpers import wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")
FAST = Settings(transaction_timeout=0.2, check_interval=0.3, check_max=15, heartbeat_interval=0.5, claim_idle=1.0)


class Answers(TransactionListener):
    """Executes with ``arg``; answers checks from ``decisions`` (transaction id -> state, or an exception)."""

    def __init__(self, default=UNKNOWN):
        self.default = default
        self.decisions: dict[str, object] = {}
        self.checked: list[str] = []

    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        self.checked.append(message.transaction_id)
        answer = self.decisions.get(message.transaction_id, self.default)
        if isinstance(answer, Exception):
            raise answer
        return answer


def bodies(client, topic="orders"):
    return [fields[b"body"] for _, fields in client.xrange(topic)]


def run_until(checker, condition, timeout=10.0):
    """Run checker rounds until ``condition`` holds."""

    def step():
        checker.run_round()
        return condition()

    return wait_until(step, timeout=timeout)


@pytest.fixture
def listener():
    return Answers()


@pytest.fixture
def producer(real_client, listener):
    with TransactionProducer("order_group", listener, client=real_client, settings=FAST) as producer:
        yield producer


@pytest.fixture
def checker(real_client):
    return Checker(real_client, FAST, scan_interval=0.05)


@pytest.mark.parametrize(("answer", "expected"), [(COMMIT, [b"paid"]), (ROLLBACK, [])])
def test_unknown_is_resolved_by_the_producers_answer(real_client, producer, listener, checker, answer, expected):
    result = producer.send_message_in_transaction(Message("orders", b"paid"), UNKNOWN)
    listener.default = answer
    run_until(checker, lambda: not real_client.hlen(KEYS.inflight))
    assert bodies(real_client) == expected
    assert listener.checked == [result.transaction_id]
    checked_message = real_client.xrange(KEYS.op_stream)[-1][1]
    assert checked_message[b"source"] == b"checker" and checked_message[b"outcome"] == answer.value.encode()


def test_check_gets_the_whole_message(real_client, producer, checker):
    seen = []
    producer.listener.check_local_transaction = lambda message: seen.append(message) or COMMIT
    producer.send_message_in_transaction(
        Message("orders", b"\x00body", keys=["a", "b"], tags="t", properties={"p": "v"}), UNKNOWN
    )
    run_until(checker, lambda: seen)
    (message,) = seen
    assert (message.topic, message.body, message.keys, message.tags, message.properties) == (
        "orders",
        b"\x00body",
        "a b",
        "t",
        {"p": "v"},
    )
    assert message.transaction_id


def test_no_check_before_the_transaction_timeout(real_client, listener):
    slow = Settings(transaction_timeout=30, check_interval=1, heartbeat_interval=0.5)
    with TransactionProducer("order_group", listener, client=real_client, settings=slow) as producer:
        producer.send_message_in_transaction(Message("orders", b"x"), UNKNOWN)
        stats = Checker(real_client, slow).run_round()
    assert stats.checks_sent == 0 and real_client.hlen(KEYS.checks) == 0


def test_per_message_immunity(real_client, listener):
    settings = Settings(transaction_timeout=30, check_interval=5, heartbeat_interval=0.5)
    listener.default = COMMIT
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        long = producer.send_message_in_transaction(Message("orders", b"long", check_immunity_seconds=60), UNKNOWN)
        short = producer.send_message_in_transaction(Message("orders", b"short", check_immunity_seconds=0.2), UNKNOWN)
        checker = Checker(real_client, settings)
        run_until(checker, lambda: bodies(real_client) == [b"short"])
        assert listener.checked == [short.transaction_id]
        assert real_client.hget(KEYS.inflight, long.transaction_id)


def test_unknown_until_check_max_then_dead_letter_and_operator_commands(real_client, listener, redis_url):
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=3, heartbeat_interval=0.5)
    listener.default = RuntimeError("order database unreachable")
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        results = [producer.send_message_in_transaction(Message("orders", f"m{i}".encode()), UNKNOWN) for i in range(3)]
        checker = Checker(real_client, settings)
        run_until(checker, lambda: real_client.xlen(KEYS.dead_stream) == 3)
    assert len(listener.checked) == 9, "check_max checks per transaction, then given up"
    assert real_client.hlen(KEYS.inflight) == 0 and real_client.xlen(KEYS.half_stream) == 0
    runner = CliRunner()
    listed = json.loads(runner.invoke(main, ["dead", "list", "--json", "--redis-url", redis_url]).output)
    assert {row["transaction_id"] for row in listed} == {r.transaction_id for r in results}
    assert all(
        row["topic"] == "orders"
        and row["check_times"] == 3
        and "check_max 3" in row["reason"]
        and "order database unreachable" in row["remark"]
        for row in listed
    )

    commit, rollback, recheck = (r.transaction_id for r in results)
    for _ in range(2):
        out = runner.invoke(main, ["dead", "commit", commit, "--redis-url", redis_url])
        assert out.exit_code == 0, out.output
    assert "nothing changed" in out.output
    assert bodies(real_client) == [b"m0"]
    assert runner.invoke(main, ["dead", "rollback", rollback, "--redis-url", redis_url]).exit_code == 0
    conflict = runner.invoke(main, ["dead", "rollback", commit, "--redis-url", redis_url])
    assert conflict.exit_code == 1 and "already ended with COMMIT" in conflict.output
    assert runner.invoke(main, ["dead", "recheck", recheck, "--redis-url", redis_url]).exit_code == 0
    assert real_client.hget(KEYS.inflight, recheck) and not real_client.hexists(KEYS.checks, recheck)
    assert real_client.xlen(KEYS.dead_stream) == 0 and bodies(real_client) == [b"m0"]
    missing = runner.invoke(main, ["dead", "commit", "nope", "--redis-url", redis_url])
    assert missing.exit_code == 1 and "not dead-lettered" in missing.output


def test_recheck_brings_a_dead_transaction_back_to_its_producer(real_client, listener, redis_url):
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1, heartbeat_interval=0.5)
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        result = producer.send_message_in_transaction(Message("orders", b"late"), UNKNOWN)
        checker = Checker(real_client, settings)
        run_until(checker, lambda: real_client.xlen(KEYS.dead_stream) == 1)
        listener.default = COMMIT
        assert (
            CliRunner().invoke(main, ["dead", "recheck", result.transaction_id, "--redis-url", redis_url]).exit_code
            == 0
        )
        run_until(checker, lambda: bodies(real_client) == [b"late"])
    assert real_client.xlen(KEYS.dead_stream) == 0


def test_max_age_dead_letters(real_client, listener):
    settings = Settings(transaction_timeout=0, check_interval=0.05, max_age=0.3, heartbeat_interval=0.5)
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        producer.send_message_in_transaction(Message("orders", b"old", properties={"k": "v"}), UNKNOWN)
        checker = Checker(real_client, settings)
        run_until(checker, lambda: real_client.xlen(KEYS.dead_stream) == 1)
    ((_, dead),) = real_client.xrange(KEYS.dead_stream)
    assert b"max_age" in dead[b"dead_reason"] and dead[b"body"] == b"old" and dead[b"properties"] == b'{"k":"v"}'


def test_duplicate_and_late_replies_append_nothing(real_client, producer, listener, checker):
    listener.default = COMMIT
    result = producer.send_message_in_transaction(Message("orders", b"once"), UNKNOWN)
    run_until(checker, lambda: bodies(real_client) == [b"once"])
    reply = {
        "stream": "orders",
        "topic": "orders",
        "transaction_id": result.transaction_id,
        "producer_group": "order_group",
        "half_id": result.half_id,
        "state": "COMMIT",
        "remark": "",
    }
    real_client.xadd(REPLY_STREAM, reply)
    real_client.xadd(REPLY_STREAM, reply | {"state": "ROLLBACK"})
    run_until(checker, lambda: real_client.xlen(REPLY_STREAM) == 0)
    assert bodies(real_client) == [b"once"]


def test_concurrent_checkers_check_each_transaction_once_per_interval(real_client, listener):
    settings = Settings(transaction_timeout=0, check_interval=30, heartbeat_interval=0.5)
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        ids = [producer.send_message_in_transaction(Message("orders", b"x"), UNKNOWN).transaction_id for _ in range(50)]
        first, second = Checker(real_client, settings, batch_size=7), Checker(real_client, settings, batch_size=7)
        sent = 0
        for _ in range(3):
            sent += first.scan().checks_sent + second.scan().checks_sent
    assert sent == 50
    assert {k.decode(): int(v) for k, v in real_client.hgetall(KEYS.checks).items()} == {i: 1 for i in ids}


def test_malformed_entries_are_dead_lettered_or_skipped_and_work_goes_on(
    real_client, producer, listener, checker, caplog
):
    caplog.set_level(logging.INFO)
    listener.default = COMMIT
    real_client.xadd(KEYS.half_stream, {"garbage": "no transaction"})  # no index: found by the sweep
    half_id = real_client.xadd(KEYS.half_stream, {"transaction_id": "hand-made"})  # indexed, fields missing
    real_client.hset(KEYS.inflight, "hand-made", half_id)
    real_client.zadd(KEYS.unchecked, {"hand-made": 0})
    real_client.xadd(GroupKeys("order_group").check_requests, {"nonsense": "1"})
    real_client.xadd(REPLY_STREAM, {"state": "MAYBE"})
    good = producer.send_message_in_transaction(Message("orders", b"good"), UNKNOWN)

    run_until(checker, lambda: bodies(real_client) == [b"good"] and real_client.xlen(KEYS.dead_stream) == 2)
    reasons = sorted(fields[b"dead_reason"].decode() for _, fields in real_client.xrange(KEYS.dead_stream))
    assert reasons[0].startswith("half message not owned") and reasons[1].startswith("malformed half message")
    wait_until(lambda: real_client.xlen(GroupKeys("order_group").check_requests) == 0)
    assert real_client.xlen(REPLY_STREAM) == 0
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "check request" in logged and "skipped" in logged and "malformed" in logged
    assert good.transaction_id in listener.checked


def test_a_raising_check_counts_and_the_producer_keeps_serving(real_client, producer, listener, checker):
    bad = producer.send_message_in_transaction(Message("orders", b"bad"), UNKNOWN)
    good = producer.send_message_in_transaction(Message("orders", b"good"), UNKNOWN)
    listener.decisions = {bad.transaction_id: ValueError("boom"), good.transaction_id: COMMIT}
    run_until(checker, lambda: bodies(real_client) == [b"good"])
    run_until(checker, lambda: int(real_client.hget(KEYS.checks, bad.transaction_id) or 0) >= 2)
    assert "boom" in real_client.hget(KEYS.remarks, bad.transaction_id).decode()


def test_memory_is_bounded_once_resolved(real_client, producer, listener, checker):
    listener.default = COMMIT
    for i in range(30):
        producer.send_message_in_transaction(Message("orders", str(i).encode()), UNKNOWN if i % 2 else ROLLBACK)
    run_until(checker, lambda: real_client.hlen(KEYS.inflight) == 0)
    assert real_client.xlen("orders") == 15
    for key in (KEYS.half_stream, GroupKeys("order_group").check_requests, REPLY_STREAM):
        assert real_client.xlen(key) == 0, key
    for key in (KEYS.unchecked, KEYS.due):
        assert real_client.zcard(key) == 0, key
    assert real_client.hlen(KEYS.checks) == 0 and real_client.hlen(KEYS.remarks) == 0


def test_answers_of_a_dead_checker_are_taken_over(real_client, producer, listener):
    settings = Settings(transaction_timeout=0.1, check_interval=30, claim_idle=0.3, heartbeat_interval=0.5)
    listener.default = COMMIT
    producer.send_message_in_transaction(Message("orders", b"taken over"), UNKNOWN)
    doomed = Checker(real_client, settings, instance_id="doomed")
    wait_until(lambda: doomed.scan().checks_sent)
    wait_until(lambda: real_client.xlen(REPLY_STREAM))
    doomed.start()
    assert real_client.xreadgroup("checkers", "doomed", {REPLY_STREAM: ">"}, count=10)  # read, then it "dies"
    survivor = Checker(real_client, settings, instance_id="survivor")
    run_until(survivor, lambda: bodies(real_client) == [b"taken over"])
    assert real_client.xlen(REPLY_STREAM) == 0


def test_status_json(real_client, producer, checker, redis_url):
    producer.send_message_in_transaction(Message("orders", b"c"), COMMIT)
    producer.send_message_in_transaction(Message("orders", b"u"), UNKNOWN)
    checker.start()
    out = CliRunner().invoke(main, ["status", "--json", "--redis-url", redis_url], env={"TXMQ_HEARTBEAT_INTERVAL": "1"})
    report = json.loads(out.output)
    (topic,) = report["topics"]
    assert topic["topic"] == "orders" and topic["committed"] == 1 and topic["in_flight"] == 1
    assert topic["dead_letters"] == 0 and topic["oldest_in_flight_age_seconds"] >= 0
    (group,) = report["producer_groups"]
    assert group["producer_group"] == "order_group" and group["live_instances"] == 1
    assert report["checkers"]["live_instances"] == 1
