"""Transactions in the dead-letter stream: a half message the checker cannot check goes there at once, a producer
that ends one late is told where it went, and an operator's re-check is idempotent (keeping its remark) while a
commit onto a topic key of another type is refused and keeps the dead letter."""

from __future__ import annotations

import pytest

from redis_txmq import LocalTransactionState, Message, Settings
from redis_txmq.checker import Checker
from redis_txmq.core.errors import CorruptEntryError, TransactionDeadLetteredError, TransactionError
from redis_txmq.core.keys import TOPIC_REGISTRY, TopicKeys
from redis_txmq.ops.admin import dead_letters
from redis_txmq.sync.broker import DeadAction, EndSource, RedisBroker

from .helpers import wait_until

KEYS = TopicKeys("orders")


def dead_lettered(client, checker: Checker, txid: str) -> bool:
    checker.run_round()
    return bool(client.hexists(KEYS.dead_index, txid))


def test_recheck_is_idempotent_keeps_its_remark_and_in_flight_is_not_dead(client):
    """An operator who runs ``txmq dead recheck`` twice gets the same half message back, not an error; a commit of
    the transaction while it is back in flight is refused (the check-back decides); the remark stays with it."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    broker.prepare_half(KEYS, Message("orders", b"x"), "tx-1", "order_group")
    checker = Checker(client, settings)
    wait_until(lambda: dead_lettered(client, checker, "tx-1"))

    first = broker.resolve_dead(KEYS, "tx-1", DeadAction.RECHECK, "operator: try again")
    again = broker.resolve_dead(KEYS, "tx-1", DeadAction.RECHECK)
    assert (first.state, first.applied) == ("PREPARED", True)
    assert (again.state, again.half_id, again.applied) == ("PREPARED", first.half_id, False)
    with pytest.raises(TransactionError, match="in flight"):
        broker.resolve_dead(KEYS, "tx-1", DeadAction.COMMIT)
    assert client.xlen("orders") == 0

    wait_until(lambda: dead_lettered(client, checker, "tx-1"))
    (row,) = dead_letters(client, "orders")
    assert row["remark"] == "operator: try again"


def test_an_operator_commit_onto_a_key_of_another_type_keeps_the_dead_letter(client):
    """``txmq dead commit`` while the topic key holds another type is refused and the dead letter stays, to be
    committed once the key is a stream again: an operator's decision never drops a transaction."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    broker.prepare_half(KEYS, Message("orders", b"x"), "tx-1", "order_group")
    checker = Checker(client, settings)
    wait_until(lambda: dead_lettered(client, checker, "tx-1"))
    client.set("orders", "someone else's value")
    with pytest.raises(CorruptEntryError, match="another type"):
        broker.resolve_dead(KEYS, "tx-1", DeadAction.COMMIT)
    assert client.hexists(KEYS.dead_index, "tx-1") and client.xlen(KEYS.dead_stream) == 1
    client.delete("orders")
    assert broker.resolve_dead(KEYS, "tx-1", DeadAction.COMMIT).applied
    assert [f[b"body"] for _, f in client.xrange("orders")] == [b"x"]
    assert not client.hexists(KEYS.dead_index, "tx-1") and client.xlen(KEYS.dead_stream) == 0


def test_a_late_end_of_a_dead_lettered_transaction_says_it_is_dead_lettered(client):
    """A producer that comes back after its transaction was given up is told where it went (the operator resolves
    it from the dead-letter stream), not that it never existed; nothing reaches the topic."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    broker.prepare_half(KEYS, Message("orders", b"x"), "tx-late", "order_group")
    checker = Checker(client, settings)
    wait_until(lambda: dead_lettered(client, checker, "tx-late"))
    with pytest.raises(TransactionDeadLetteredError) as late:
        broker.end_transaction(KEYS, "tx-late", "order_group", LocalTransactionState.COMMIT, source=EndSource.PRODUCER)
    assert late.value.transaction_id == "tx-late"
    assert client.xlen("orders") == 0


@pytest.mark.parametrize("missing", ["body", "producer_group", "born_ms", "transaction_id"])
def test_an_indexed_half_message_missing_one_field_is_dead_lettered_at_once(client, missing):
    """Each field a check needs, missing alone from an indexed half message (written by another tool): the checker
    dead-letters it, whole, at its first claim instead of asking a producer about it."""
    fields = {"transaction_id": "tx-1", "producer_group": "order_group", "born_ms": "1", "body": "b"}
    fields.pop(missing)
    half_id = client.xadd(KEYS.half_stream, fields).decode()
    client.hset(KEYS.inflight, "tx-1", half_id)
    client.zadd(KEYS.unchecked, {"tx-1": 0})
    client.sadd(TOPIC_REGISTRY, "orders")
    stats = Checker(client, Settings(transaction_timeout=0, check_interval=30)).run_round()
    assert (stats.dead_lettered, stats.checks_sent) == (1, 0)
    ((_, dead),) = client.xrange(KEYS.dead_stream)
    assert dead[b"dead_reason"].startswith(b"malformed half message") and dead[b"half_id"].decode() == half_id
