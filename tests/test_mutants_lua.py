"""Script behaviour that operators and consumers rely on and that no other test pinned down: an operator's re-check
is idempotent and keeps its remark, a dead-letter command refuses a transaction still in flight, a late end of a
dead-lettered transaction says so, forgetting dead consumers never drops one that holds an entry (``XGROUP
DELCONSUMER`` would drop the entry with it), a consumer reading one message at a time takes over a dead one's, and
the partition counts at both ends of the allowed range are accepted."""

from __future__ import annotations

import pytest

from checker import Checker
from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionProducer, create_topic
from redis_txmq.admin import dead_letters
from redis_txmq.broker import DeadAction, EndSource, RedisBroker
from redis_txmq.errors import (
    ConfigurationError,
    CorruptEntryError,
    TransactionDeadLetteredError,
    TransactionError,
    TxMQConnectionError,
)
from redis_txmq.groups import ensure_consumer_group, forget_dead_consumers
from redis_txmq.keys import TOPIC_REGISTRY, TopicKeys

from .helpers import ScriptedListener, wait_until

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


def test_a_consumer_holding_an_entry_is_never_forgotten(client):
    """Only consumers that hold nothing are forgotten, however long they were idle: removing one that holds an
    entry would drop that entry from the group's pending list, and nobody would ever be given it again."""
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        producer.send_message_in_transaction(Message("orders", b"m"), LocalTransactionState.COMMIT)
    holder = Consumer("orders", "billing", "holder", client=client, block=0.05)
    assert [m.body for m in holder.poll()] == [b"m"]
    client.xgroup_createconsumer("orders", "billing", "idle")

    assert forget_dead_consumers(client, "orders", "billing", "me", idle_ms=0) == ["idle"]
    assert [c["name"] for c in client.xinfo_consumers("orders", "billing")] == [b"holder"]
    assert client.xpending("orders", "billing")["pending"] == 1


def test_a_consumer_reading_one_at_a_time_takes_over_a_dead_consumers_message(client):
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        producer.send_message_in_transaction(Message("orders", b"m"), LocalTransactionState.COMMIT)
    dead = Consumer("orders", "billing", "dead", client=client, block=0.05, batch_size=1, min_idle_time=0.1)
    assert [m.body for m in dead.poll()] == [b"m"]  # ...and it dies without acking
    live = Consumer("orders", "billing", "live", client=client, block=0.05, batch_size=1, min_idle_time=0.1)
    (taken_over,) = wait_until(live.poll)
    assert (taken_over.body, taken_over.delivery_count) == (b"m", 2)


def test_partition_counts_are_checked_at_both_ends_of_the_range(client):
    """1..1024: ``create_topic`` leaves the range check to its script, so the library call refuses 1025 too."""
    assert create_topic(client, "wide", 1024) == 1024
    with pytest.raises(ConfigurationError, match="from 1 to 1024"):
        create_topic(client, "wider", 1025)
    with pytest.raises(ConfigurationError, match="from 1 to 1024"):
        create_topic(client, "narrow", 0)


def test_creating_a_topic_in_use_with_one_partition_is_accepted(client):
    """One partition is what an unpartitioned topic in use already has: setting it (a deploy script that declares
    every topic) is accepted, more partitions are refused."""
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        producer.send_message_in_transaction(Message("orders", b"m"), LocalTransactionState.COMMIT)
    with pytest.raises(ConfigurationError, match="already has messages"):
        create_topic(client, "orders", 2)
    assert create_topic(client, "orders", 1) == 1


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


def test_a_consumer_group_on_a_key_of_another_type_is_an_error(client):
    """A damaged key (not a stream) is reported when the group is created, not taken for a created group."""
    client.set("orders", "not a stream")
    with pytest.raises(TxMQConnectionError, match="could not create consumer group"):
        ensure_consumer_group(client, "orders", "billing")
