"""When an end cannot be applied: a send whose end call finds Redis gone returns its result with ``end_error``
(through the send path's own connections and their retries, not a mocked runner), ``flush(timeout)`` of a one-way
producer gives up at its timeout with the end still queued, and a refused operator's end names its topic and
transaction on the exception, not only in its text."""

from __future__ import annotations

import pytest

from redis_txmq import (
    LocalTransactionState,
    Message,
    Settings,
    TransactionConflictError,
    TransactionListener,
    TransactionNotFoundError,
    TransactionProducer,
)
from redis_txmq.core.keys import TopicKeys
from redis_txmq.ops.admin import resolve_dead
from redis_txmq.sync.broker import DeadAction, RedisBroker
from redis_txmq.transport.embedded import EmbeddedRedis

from .helpers import ScriptedListener

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK
KEYS = TopicKeys("orders")


class PausesRedis(TransactionListener):
    """Commits, after pausing every write of the Redis server: the end call then waits in the server."""

    def __init__(self, client) -> None:
        self.client = client

    def execute_local_transaction(self, message: Message, arg) -> LocalTransactionState:
        self.client.client_pause(10_000, all=False)
        return COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return COMMIT


class StopsRedis(TransactionListener):
    """Commits, after stopping the Redis server the producer uses: the end call finds nobody there."""

    def __init__(self, server: EmbeddedRedis) -> None:
        self.server = server

    def execute_local_transaction(self, message: Message, arg) -> LocalTransactionState:
        self.server.stop()
        return COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return COMMIT


def test_a_send_whose_redis_went_away_returns_its_result_with_end_error():
    """SPEC §4.4: when the end call fails (here Redis is gone for good, so the retry on a new socket fails too), the
    send still returns the local transaction's outcome; the check-back will resolve the transaction."""
    server = EmbeddedRedis(prefer_binary=True).start()
    try:
        producer = TransactionProducer("order_group", StopsRedis(server), redis_url=server.url)
        producer.start()
        try:
            result = producer.send_message_in_transaction(Message("orders", b"x"))
        finally:
            producer.shutdown()
    finally:
        server.stop()
    assert result.local_transaction_state is COMMIT and result.half_id and result.committed_id is None
    assert result.end_error and "check-back" in result.end_error


def test_flush_gives_up_at_its_timeout_while_ends_are_still_queued(real_client):
    """A service that flushes before it exits must not hang on a Redis that does not answer: ``flush(timeout)``
    returns False with the end still queued, and a later ``flush()`` sees it applied."""
    with TransactionProducer("order_group", PausesRedis(real_client), client=real_client, oneway_end=True) as producer:
        try:
            result = producer.send_message_in_transaction(Message("orders", b"paused"))
            assert result.end_queued
            assert producer.flush(timeout=0.2) is False
            assert producer.pending_ends == 1
        finally:
            real_client.client_unpause()
        assert producer.flush() is True
    assert [f[b"transaction_id"].decode() for _, f in real_client.xrange("orders")] == [result.transaction_id]


def test_refused_operator_actions_name_the_topic_and_transaction(client):
    """Code that catches a refusal reads ``exc.topic`` and ``exc.transaction_id`` instead of parsing the text."""
    settings = Settings(transaction_timeout=0, check_max=1)
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=settings) as producer:
        rolled_back = producer.send_message_in_transaction(Message("orders", b"r"), ROLLBACK)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    with pytest.raises(TransactionNotFoundError) as not_found:
        resolve_dead(broker, "no-such-transaction", DeadAction.COMMIT, topic="orders")
    assert (not_found.value.topic, not_found.value.transaction_id) == ("orders", "no-such-transaction")
    with pytest.raises(TransactionConflictError) as conflict:
        resolve_dead(broker, rolled_back.transaction_id, DeadAction.COMMIT, topic="orders")
    assert (conflict.value.topic, conflict.value.transaction_id) == ("orders", rolled_back.transaction_id)
    assert client.xlen("orders") == 0
