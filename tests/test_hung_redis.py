"""A Redis that hangs instead of refusing (SIGSTOP: connections are accepted, nothing is answered): every role
notices within its socket timeout, none waits for ever, and once Redis answers again every committed local
transaction is published once and nothing else (docs/guides/operating.md, "When Redis hangs").

The socket timeout is set in the URL (``?socket_timeout=1``), as a deployment would to shorten the bounds; the
bounds themselves are not asserted (a loaded machine stretches them), only that each call ends with its error."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.checker import Checker, CheckerMetrics
from redis_txmq.core.errors import PrepareError, TxMQConnectionError
from redis_txmq.core.keys import TopicKeys
from redis_txmq.transport.connection import connect

from .helpers import wait_until
from .test_checker_probes import OwnRedis, running, served, status_is

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK
TOPIC = "hung"
GROUP = "hung_group"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.freeze(False)
        server.stop()


class Local(TransactionListener):
    """A service's local transactions: the bodies it committed; ``freeze`` hangs Redis inside one (its end then
    meets the hung server)."""

    def __init__(self, server: OwnRedis) -> None:
        self.server = server
        self.committed: set[bytes] = set()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        self.committed.add(message.body)
        if arg == "freeze":
            self.server.freeze(True)
        return COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return COMMIT if message.body in self.committed else ROLLBACK


def ends(call: Callable[[], Any]) -> Any:
    """What ``call`` returned or raised, run in a thread that must end (a hang fails the test at the deadline)."""
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test looks at
            outcome.append(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    wait_until(lambda: not thread.is_alive(), timeout=60, interval=0.05)
    return outcome[0]


def test_a_hung_redis_makes_every_role_give_up_its_call_and_loses_nothing(own_redis: OwnRedis) -> None:
    url = f"{own_redis.url}?socket_timeout=1&socket_connect_timeout=1"
    settings = Settings(redis_url=url, transaction_timeout=0.5, check_interval=0.5, heartbeat_interval=0.5)
    local = Local(own_redis)
    metrics = CheckerMetrics(stall_after=30)
    checker = Checker(connect(url), settings, scan_interval=0.05, metrics=metrics)
    with (
        TransactionProducer(GROUP, local, settings=settings) as producer,
        Consumer(TOPIC, "billing", settings=settings, block=0.1) as consumer,
        served(metrics) as port,
        running(checker),
    ):
        producer.send_message_in_transaction(Message(TOPIC, b"before"), None)
        wait_until(lambda: status_is(port, "/readyz", 200), timeout=30)

        # Redis hangs during a local transaction: the send still returns, its end failed
        frozen = ends(lambda: producer.send_message_in_transaction(Message(TOPIC, b"during"), "freeze"))
        assert not isinstance(frozen, Exception), frozen
        assert frozen.end_error and frozen.local_transaction_state is COMMIT
        try:
            refused = ends(lambda: producer.send_message_in_transaction(Message(TOPIC, b"refused"), None))
            assert isinstance(refused, PrepareError), refused
            assert isinstance(ends(consumer.poll), TxMQConnectionError)
            # not ready: its heartbeat may be noticed first; the failed Redis check follows
            wait_until(lambda: "redis" in ((status_is(port, "/readyz", 503) or {}).get("failed") or []), timeout=30)
            assert status_is(port, "/healthz", 200) is not None, "the loop goes round: each call ends"
        finally:
            own_redis.freeze(False)

        wait_until(lambda: status_is(port, "/readyz", 200), timeout=30)
        published: list[bytes] = []

        def read() -> None:
            for message in consumer.poll(timeout=0.1):
                published.append(message.body)
                consumer.ack(message)

        wait_until(lambda: read() or {b"before", b"during"} <= set(published), timeout=60, interval=0.05)
        # the refused prepare may have reached Redis once it woke up: its local transaction never ran, so the
        # check-back rolls it back (the listener has no record of it)
        wait_until(lambda: checker.client.hlen(TopicKeys(TOPIC).inflight) == 0, timeout=30)
        read()
    assert sorted(published) == [b"before", b"during"]
    assert local.committed == {b"before", b"during"}
