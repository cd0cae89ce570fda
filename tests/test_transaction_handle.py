"""The transaction handle, ``with producer.transaction(message) as tx``, on the sync and the asyncio producer."""

from __future__ import annotations

import pytest

from redis_txmq import ConfigurationError, LocalTransactionState, Message, PrepareError, Settings
from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys

from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")


class OrderRefused(Exception):
    pass


def committed_ids(client) -> list[str]:
    return [fields[b"transaction_id"].decode() for _, fields in client.xrange("orders")]


def test_a_block_that_ends_normally_commits(client, make_producer):
    with make_producer("order_group", ScriptedListener(), client=client) as producer:
        message = Message("orders", b"order 1", keys="order-1")
        with producer.transaction(message) as tx:
            assert client.hget(KEYS.inflight, tx.transaction_id), "the half message is written when the block starts"
            assert committed_ids(client) == [], "invisible while the block runs"
            assert tx.message.transaction_id == tx.transaction_id and message.transaction_id is None
        assert tx.result.local_transaction_state is COMMIT and tx.result.committed_id
    assert committed_ids(client) == [tx.transaction_id]
    assert client.hlen(KEYS.inflight) == 0


def test_a_block_that_raises_rolls_back_and_the_exception_goes_on(client, make_producer):
    with make_producer("order_group", ScriptedListener(), client=client) as producer:
        with pytest.raises(OrderRefused):
            with producer.transaction(Message("orders", b"order 2")) as tx:
                raise OrderRefused("out of stock")
    assert tx.result.local_transaction_state is ROLLBACK and "OrderRefused: out of stock" in tx.result.remark
    assert committed_ids(client) == [] and client.hlen(KEYS.inflight) == 0
    (op,) = [fields for _, fields in client.xrange(KEYS.op_stream)]
    assert op[b"outcome"] == b"ROLLBACK" and b"out of stock" in op[b"remark"]


def test_rollback_and_commit_end_it_early(client, make_producer):
    with make_producer("order_group", ScriptedListener(), client=client) as producer:
        with producer.transaction(Message("orders", b"cancelled")) as early_rollback:
            early_rollback.rollback()
            assert client.hlen(KEYS.inflight) == 0
        with producer.transaction(Message("orders", b"kept")) as early_commit:
            early_commit.commit()
            assert committed_ids(client) == [early_commit.transaction_id]
    assert early_rollback.result.local_transaction_state is ROLLBACK
    assert committed_ids(client) == [early_commit.transaction_id], "leaving the block after an early end: no change"


def test_a_half_message_that_cannot_be_written_does_not_run_the_block(client, make_producer):
    client.set("orders", "not a stream")
    ran = []
    with make_producer("order_group", ScriptedListener(), client=client) as producer:
        with pytest.raises(PrepareError, match="another type"):
            with producer.transaction(Message("orders", b"x")):
                ran.append(True)
    assert ran == []


def test_a_producer_for_handles_only_refuses_a_listener_send_before_writing(client, make_producer):
    with make_producer("order_group", checker=lambda message: COMMIT, client=client) as producer:
        with pytest.raises(ConfigurationError, match="no listener"):
            producer.send_message_in_transaction(Message("orders", b"x"))
    assert client.hlen(KEYS.inflight) == 0 and client.xlen(KEYS.half_stream) == 0


def test_producer_needs_a_listener_or_a_checker_not_both(client, make_producer):
    with pytest.raises(ConfigurationError):
        make_producer("order_group", client=client)
    with pytest.raises(ConfigurationError, match="not both"):
        make_producer("order_group", ScriptedListener(), checker=lambda m: COMMIT, client=client)


def test_check_back_of_a_handle_transaction_left_unknown(real_client, make_producer):
    """A block interrupted (KeyboardInterrupt here; a cancelled task on asyncio) leaves its transaction in flight,
    never a blind COMMIT or ROLLBACK: the check-back asks the producer's ``checker=`` and finishes it."""
    settings = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2)
    with make_producer("order_group", checker=lambda m: COMMIT, client=real_client, settings=settings) as producer:
        with pytest.raises(KeyboardInterrupt):
            with producer.transaction(Message("orders", b"interrupted")) as tx:
                raise KeyboardInterrupt
        assert tx.result.local_transaction_state is UNKNOWN and tx.result.end_error is None
        assert real_client.hget(KEYS.inflight, tx.transaction_id), "left in flight"
        checker = Checker(real_client, settings)
        wait_until(lambda: checker.run_round() is not None and committed_ids(real_client) == [tx.transaction_id])


def test_a_database_error_that_lost_the_connection_leaves_the_outcome_to_the_check_back(client, make_producer):
    """A COMMIT whose connection broke may have been applied: the handle neither commits nor rolls back, it records
    why and leaves the transaction in flight; the exception goes on."""
    sqlalchemy_exc = pytest.importorskip("sqlalchemy.exc")
    lost = sqlalchemy_exc.OperationalError("COMMIT", {}, ConnectionError("server closed the connection"))
    lost.connection_invalidated = True
    with make_producer("order_group", ScriptedListener(), client=client) as producer:
        with pytest.raises(sqlalchemy_exc.OperationalError):
            with producer.transaction(Message("orders", b"order 3")) as tx:
                raise lost
    assert tx.result.local_transaction_state is UNKNOWN and "lost its database connection" in tx.result.remark
    assert committed_ids(client) == [] and client.hget(KEYS.inflight, tx.transaction_id), "left to the check-back"
