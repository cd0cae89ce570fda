"""Check-back rules beside tests/test_checker.py: what a check carries, when it may start, re-check, and N checkers."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.cli import main
from redis_txmq.core.keys import TopicKeys

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
