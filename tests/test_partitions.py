"""Partitioned topics: one stream per partition, a key keeps its partition, everything reads every partition."""

from __future__ import annotations

import collections

import pytest
from click.testing import CliRunner

from redis_txmq import (
    ConfigurationError,
    Consumer,
    LocalTransactionState,
    Message,
    Settings,
    TransactionListener,
    TransactionProducer,
    create_topic,
    partition_count,
)
from redis_txmq.checker import Checker
from redis_txmq.cli import main
from redis_txmq.core.keys import TopicKeys
from redis_txmq.ops.admin import status

from .helpers import ScriptedListener, wait_until

COMMIT, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.UNKNOWN


class Commit(TransactionListener):
    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        return COMMIT


def test_create_topic_is_idempotent_and_refuses_changes(client):
    assert create_topic(client, "orders", 4) == 4
    assert create_topic(client, "orders", 4) == 4 and partition_count(client, "orders") == 4
    with pytest.raises(ConfigurationError, match="already has 4 partitions"):
        create_topic(client, "orders", 8)
    client.xadd("payments", {"body": "x"})
    with pytest.raises(ConfigurationError, match="unpartitioned stream"):
        create_topic(client, "payments", 2)
    with pytest.raises(ConfigurationError, match="1 to 1024"):
        create_topic(client, "refunds", 0)
    assert partition_count(client, "refunds") == 1


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
        producer.send_message_in_transaction(Message("orders", b"m"), COMMIT)
    with pytest.raises(ConfigurationError, match="already has messages"):
        create_topic(client, "orders", 2)
    assert create_topic(client, "orders", 1) == 1


def test_created_topic_is_registered_before_its_first_message(client):
    """status, the checker and the Spark source walk the registry: a new topic is there, empty, before any send."""
    assert create_topic(client, "orders", 3) == 3
    assert create_topic(client, "refunds", 1) == 1
    assert create_topic(client, "orders", 3) == 3, "idempotent, also for the registry"
    report = status(client, live_seconds=15)
    assert sorted(t["stream"] for t in report["topics"]) == ["orders#0", "orders#1", "orders#2", "refunds"]
    assert all(t["committed"] == 0 and t["in_flight"] == 0 for t in report["topics"])
    assert Checker(client, Settings(transaction_timeout=0)).run_round() is not None
    assert not any(client.exists(f"orders#{p}") for p in range(3)), "registering writes no stream"


def test_keys_keep_their_partition_and_keyless_messages_spread(real_client):
    create_topic(real_client, "orders", 4)
    with TransactionProducer("g", Commit(), client=real_client) as producer:
        keyed = [
            producer.send_message_in_transaction(Message("orders", b"k", keys=f"customer-{i % 5}"), COMMIT)
            for i in range(40)
        ]
        keyless = [producer.send_message_in_transaction(Message("orders", b"r"), COMMIT) for _ in range(8)]
    by_key = collections.defaultdict(set)
    for i, result in enumerate(keyed):
        by_key[f"customer-{i % 5}"].add(result.partition)
    assert all(len(partitions) == 1 for partitions in by_key.values())
    assert sorted(r.partition for r in keyless) == [0, 0, 1, 1, 2, 2, 3, 3]
    streams = [TopicKeys("orders", p, partitioned=True).topic_stream for p in range(4)]
    assert streams == ["orders#0", "orders#1", "orders#2", "orders#3"]
    assert sum(real_client.xlen(s) for s in streams) == 48 and not real_client.exists("orders")


def test_consumer_checker_and_status_cover_every_partition(real_client):
    create_topic(real_client, "orders", 3)
    settings = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.5)
    with TransactionProducer("g", Commit(), client=real_client, settings=settings) as producer:
        sent = [
            producer.send_message_in_transaction(
                Message("orders", str(i).encode(), keys=f"k{i}"), COMMIT if i % 2 else UNKNOWN
            )
            for i in range(12)
        ]
        assert len({r.partition for r in sent}) == 3
        checker = Checker(real_client, settings)

        def all_resolved():
            checker.run_round()
            return all(real_client.hlen(TopicKeys("orders", p, partitioned=True).inflight) == 0 for p in range(3))

        wait_until(all_resolved)
    with Consumer("orders", "billing", client=real_client, block=0.05) as consumer:
        seen = []
        for _ in range(10):
            for message in consumer.poll():
                seen.append((message.partition, message.body))
                consumer.ack(message)
    assert sorted(int(body) for _, body in seen) == list(range(12))
    assert {partition for partition, _ in seen} == {0, 1, 2}
    report = status(real_client, live_seconds=2)
    assert sorted(t["stream"] for t in report["topics"]) == ["orders#0", "orders#1", "orders#2"]
    assert sum(t["committed"] for t in report["topics"]) == 12


def test_topic_create_command(real_client, redis_url):
    out = CliRunner().invoke(main, ["topic", "create", "events", "--partitions", "8", "--redis-url", redis_url])
    assert out.exit_code == 0 and "8 partitions" in out.output
    again = CliRunner().invoke(main, ["topic", "create", "events", "--partitions", "2", "--redis-url", redis_url])
    assert again.exit_code == 1 and "already has 8 partitions" in again.output
