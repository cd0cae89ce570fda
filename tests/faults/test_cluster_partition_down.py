"""A consumer of a partitioned topic whose partitions span the masters of a cluster, one master down: the
partitions on the healthy masters must be read on (README, "One master down": a dead master stops only what lives
in its slots). Found by the fault suite's cluster run (``master_down``); each test here is the smallest case. And
a producer made while the node of its cluster URL is down, which raises an error outside the library's hierarchy.

Uses a 3-master cluster of its own per test with ``cluster-require-full-coverage no``, as
``tests/test_cluster_master_down.py`` does; the master taken down holds none of the shared keys, nor the topic's
metadata."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from redis_txmq import Message, Settings, TransactionProducer, TxMQConnectionError, create_topic
from redis_txmq.core.keys import topic_meta_key
from redis_txmq.core.topics import partition_keys_of
from redis_txmq.transport.embedded import free_port

from ..helpers import wait_until
from ..test_checker import COMMIT, Answers
from ..test_cluster_master_down import SETTINGS, OneMasterDown, one_master_down_of
from ..test_consumer import AsyncioApi, SyncApi, running

pytestmark = pytest.mark.slow

PARTITIONS = 3
READ_WAIT = 15.0
"""How long a round of messages may take to be read while the master is down (a healthy consumer: well under a
second; the blocking read waits 0.2 s)."""


@pytest.fixture
def down() -> Iterator[OneMasterDown]:
    with one_master_down_of() as built:
        yield built


def spread_topic(down: OneMasterDown) -> tuple[str, int]:
    """A topic of :data:`PARTITIONS` partitions, one of them on the master that goes down, its metadata and the
    other partitions on the healthy masters: the topic and the partition on the victim."""
    for i in range(1000):
        topic = f"spread-{i}"
        on_victim = [k.partition for k in partition_keys_of(topic, PARTITIONS) if down.on_victim(k.topic_stream)]
        if not down.on_victim(topic_meta_key(topic)) and len(on_victim) == 1:
            return topic, on_victim[0]
    raise AssertionError("no such topic")


def key_for(partition: int) -> str:
    """A message key that the producer routes to ``partition`` (CRC-32 of the first key)."""
    return next(f"k{i}" for i in range(10_000) if zlib.crc32(f"k{i}".encode()) % PARTITIONS == partition)


def read_on(down: OneMasterDown, api_class: type, min_idle_time: float) -> None:
    """A consumer reads a message of the partition on the victim, the victim goes down, and twice a message is sent
    to each healthy partition: the consumer must get them all while the victim is down."""
    cluster = down.cluster
    topic, dead = spread_topic(down)
    healthy = [p for p in range(PARTITIONS) if p != dead]
    create_topic(cluster, topic, PARTITIONS)
    reader, api = RedisCluster.from_url(down.url), api_class()
    try:
        consumer = api.Consumer(topic, "billing", "c1", client=reader, block=0.2, min_idle_time=min_idle_time)
        with TransactionProducer(down.group(), Answers(default=COMMIT), client=cluster, settings=SETTINGS) as producer:
            with running(consumer) as handled:
                before = Message(topic, b"before", keys=key_for(dead))
                assert producer.send_message_in_transaction(before, arg=COMMIT).committed_id
                wait_until(lambda: handled == [b"before"], timeout=30)
                down.goes_down()
                sent = [b"before"]
                for round_ in (1, 2):
                    for partition in healthy:
                        body = f"round {round_}, partition {partition}".encode()
                        assert producer.send_message_in_transaction(
                            Message(topic, body, keys=key_for(partition)), COMMIT
                        )
                        sent.append(body)
                    try:
                        wait_until(lambda: len(handled) == len(sent), timeout=READ_WAIT)
                    except AssertionError:
                        raise AssertionError(f"round {round_} not read while a master is down: got {handled}") from None
        assert sorted(handled) == sorted(sent)
    finally:
        api.close()
        reader.close()


@pytest.mark.parametrize("api_class", [SyncApi, AsyncioApi], ids=["sync", "async"])
def test_the_turn_of_the_partitions_moves_past_the_partition_of_the_dead_master(
    down: OneMasterDown, api_class: type
) -> None:
    """No claim walk meanwhile (``min_idle_time`` of 10 minutes: the only one ran at the first poll). The first
    round is read before the turn reaches the dead partition; there it stays."""
    read_on(down, api_class, min_idle_time=600.0)


@pytest.mark.parametrize("api_class", [SyncApi, AsyncioApi], ids=["sync", "async"])
def test_the_claim_walk_does_not_stop_the_reads_while_the_master_of_a_partition_is_down(
    down: OneMasterDown, api_class: type
) -> None:
    """A claim walk due every half second (``min_idle_time`` 1 s) fails at the dead partition, and so does every
    poll after it: not even the first round is read."""
    read_on(down, api_class, min_idle_time=1.0)


@pytest.mark.parametrize("api_class", [SyncApi, AsyncioApi], ids=["sync", "async"])
def test_a_consumer_started_while_the_master_of_a_partition_is_down_reads_the_others(
    down: OneMasterDown, api_class: type
) -> None:
    """The group exists on every partition (a consumer of it ran before); an instance of it (re)starts while the
    master of one partition is down, as a consumer process restarted during the outage does."""
    cluster = down.cluster
    topic, dead = spread_topic(down)
    healthy = [p for p in range(PARTITIONS) if p != dead]
    create_topic(cluster, topic, PARTITIONS)
    reader, api = RedisCluster.from_url(down.url), api_class()
    try:
        api.Consumer(topic, "billing", "c0", client=reader, block=0.2).close()
        down.goes_down()
        with TransactionProducer(down.group(), Answers(default=COMMIT), client=cluster, settings=SETTINGS) as producer:
            sent = [f"partition {p}".encode() for p in healthy]
            for partition, body in zip(healthy, sent, strict=True):
                assert producer.send_message_in_transaction(Message(topic, body, keys=key_for(partition)), COMMIT)
            consumer = api.Consumer(topic, "billing", "c1", client=reader, block=0.2)
            with running(consumer) as handled:
                wait_until(lambda: len(handled) == len(sent), timeout=READ_WAIT)
        assert sorted(handled) == sorted(sent)
    finally:
        api.close()
        reader.close()


def test_a_producer_made_while_the_node_of_its_cluster_url_is_down_raises_a_connection_error() -> None:
    """A producer process restarted while the master its URL names is down (the fault suite's ``redis`` fault on
    the first master) sees this first."""
    dead = Settings(cluster=True, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(TxMQConnectionError, match="fault_orders"):
        TransactionProducer("fault_orders", checker=lambda message: None, settings=dead)
