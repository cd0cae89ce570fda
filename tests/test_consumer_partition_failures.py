"""A consumer of a partitioned topic when one partition fails: on a cluster (partitions on several masters) the
others are read on, and nothing a poll claimed is dropped because a later call of the same poll failed.

The failures are injected into the calls of a consumer on one real redis-server (the cluster runs in
``tests/faults/test_cluster_partition_down.py`` take a master down for real, but cannot make a master answer
CLUSTERDOWN or TRYAGAIN when a test wants it). "On a cluster" is the consumer's own test of its client, patched:
what it decides is written once in :class:`redis_txmq.core.consuming.ConsumerProtocol`, for both APIs, so the sync
consumer drives it here.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ClusterDownError, TryAgainError

from redis_txmq import Consumer, Message, TransactionProducer, create_topic
from redis_txmq.core.consuming import CLAIM, FORGET, READ_GROUP, Command, ConsumerProtocol
from redis_txmq.core.topics import partition_keys_of

from .helpers import ScriptedListener, wait_until
from .test_consumer import COMMIT

PARTITIONS = 3
TOPIC = "parted"


@pytest.fixture
def topic(real_client: redis.Redis) -> list[str]:
    """A topic of three partitions on the test's server: its streams."""
    create_topic(real_client, TOPIC, PARTITIONS)
    return [keys.topic_stream for keys in partition_keys_of(TOPIC, PARTITIONS)]


@pytest.fixture
def on_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ConsumerProtocol, "_on_cluster", property(lambda self: True))


class Faults:
    """Makes the consumer's calls that concern ``stream`` raise ``error`` while ``on`` (a Redis call is a
    :class:`~redis_txmq.core.consuming.Command`; the stream is in its arguments or its script keys)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rules: dict[tuple[str, str], Exception] = {}
        self.hits: list[tuple[str, str]] = []
        original = Command.apply

        def apply(command: Command, client: Any, scripts: Any) -> Any:
            streams = {*map(str, command.args), *map(str, command.kwargs.get("keys", ()))}
            for (name, stream), error in list(self.rules.items()):
                if command.name == name and stream in streams:
                    self.hits.append((name, stream))
                    raise error
            return original(command, client, scripts)

        monkeypatch.setattr(Command, "apply", apply)

    def fail(self, name: str, stream: str, error: Exception) -> None:
        self.rules[(name, stream)] = error

    def heal(self) -> None:
        self.rules.clear()


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    return Faults(monkeypatch)


def send_to_each_partition(client: redis.Redis, tag: str) -> list[bytes]:
    """One committed message per partition (the producer routes by the CRC-32 of the first key): their bodies."""
    bodies = []
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        for partition in range(PARTITIONS):
            key = next(f"k{i}" for i in range(1000) if zlib.crc32(f"k{i}".encode()) % PARTITIONS == partition)
            body = f"{tag} {partition}".encode()
            producer.send_message_in_transaction(Message(TOPIC, body, keys=key), COMMIT)
            bodies.append(body)
    return bodies


@pytest.fixture
def run_consumer(real_client: redis.Redis) -> Iterator[Callable[..., tuple[Consumer, list[bytes]]]]:
    """Starts ``Consumer.run`` in a thread: the consumer and the bodies it handled."""
    started: list[tuple[Consumer, threading.Thread]] = []

    def start(**kwargs: Any) -> tuple[Consumer, list[bytes]]:
        handled: list[bytes] = []
        consumer = Consumer(TOPIC, "billing", "c1", client=real_client, block=0.05, **kwargs)
        worker = threading.Thread(target=consumer.run, args=(lambda m: handled.append(m.body),), daemon=True)
        worker.start()
        started.append((consumer, worker))
        return consumer, handled

    yield start
    for consumer, worker in started:
        consumer.close()
        worker.join(timeout=10)
        assert not worker.is_alive()


@pytest.mark.parametrize(
    "error",
    [
        ClusterDownError("CLUSTERDOWN The cluster is down"),
        TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        redis.ConnectionError("Connection refused"),
    ],
    ids=["clusterdown", "tryagain", "connection"],
)
def test_on_a_cluster_a_partition_whose_slot_is_not_served_is_passed_over(
    real_client, topic, on_cluster, faults, run_consumer, error
):
    """A master just restarted answers CLUSTERDOWN or TRYAGAIN (error replies, not dropped connections) for a
    while: its partition's reads and claims fail, the other partitions are read on; once it serves again, its
    messages come too."""
    faults.fail(READ_GROUP, topic[1], error)
    faults.fail(CLAIM, topic[1], error)
    _, handled = run_consumer(min_idle_time=0.2)
    sent = send_to_each_partition(real_client, "first")
    wait_until(lambda: sorted(handled) == sorted(b for b in sent if not b.endswith(b" 1")), timeout=15)
    wait_until(lambda: (READ_GROUP, topic[1]) in faults.hits and (CLAIM, topic[1]) in faults.hits, timeout=15)
    faults.heal()
    wait_until(lambda: sorted(handled) == sorted(sent), timeout=15)


def test_on_one_server_a_slot_error_still_fails_the_poll(real_client, topic, faults):
    """Without a cluster every partition is on the one server: its error is the poll's (run() backs off)."""
    faults.fail(READ_GROUP, topic[1], ClusterDownError("CLUSTERDOWN The cluster is down"))
    with Consumer(TOPIC, "billing", "c1", client=real_client, block=0.05, min_idle_time=600) as consumer:
        send_to_each_partition(real_client, "m")
        with pytest.raises(Exception, match="CLUSTERDOWN"):
            for _ in range(PARTITIONS + 1):
                consumer.poll(0.05)


def abandoned_on_each_partition(real_client: redis.Redis) -> list[bytes]:
    """A message per partition, read and never acked by a consumer ``dead`` that is gone."""
    sent = send_to_each_partition(real_client, "abandoned")
    with Consumer(TOPIC, "billing", "dead", client=real_client, block=0.05, min_idle_time=600) as dead:
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.body for m in dead.poll(0.05)) or len(got) == PARTITIONS, timeout=15)
    streams = [keys.topic_stream for keys in partition_keys_of(TOPIC, PARTITIONS)]
    wait_until(  # idle past the claiming consumer's min_idle_time (0.05 s)
        lambda: all(
            entry["time_since_delivered"] >= 100
            for stream in streams
            for entry in real_client.xpending_range(stream, "billing", "-", "+", 10)
        ),
        timeout=15,
    )
    return sent


def test_what_a_claim_walk_took_over_is_delivered_when_a_later_partition_fails(real_client, topic, faults):
    """The walk claims the abandoned entries partition by partition; a claim that fails further on (one server:
    the poll's error) must not drop what the earlier claims took over — those are owned by this consumer now and
    would wait ``min_idle_time`` more, one delivery counted for nothing."""
    sent = abandoned_on_each_partition(real_client)
    faults.fail(CLAIM, topic[2], redis.ResponseError("ERR injected"))
    with Consumer(TOPIC, "billing", "c1", client=real_client, block=0.05, min_idle_time=0.05) as consumer:
        claimed = wait_until(lambda: consumer.poll(0.05), timeout=15)
    assert sorted(m.body for m in claimed) == sorted(sent[:2])
    assert all(m.delivery_count == 2 for m in claimed)


def test_removing_dead_consumers_failing_does_not_drop_the_claims(real_client, topic, faults):
    """At the end of a walk the consumers it took over from are removed (``lua/forget_consumers.lua``); when that
    fails, what the walk claimed is delivered all the same."""
    sent = abandoned_on_each_partition(real_client)
    for stream in topic:
        faults.fail(FORGET, stream, redis.ConnectionError("dropped"))
    with Consumer(TOPIC, "billing", "c1", client=real_client, block=0.05, min_idle_time=0.05) as consumer:
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.body for m in consumer.poll(0.05)) or len(got) >= PARTITIONS, timeout=15)
    assert sorted(got) == sorted(sent)
    assert (FORGET, topic[0]) in faults.hits


def test_on_a_cluster_an_ack_that_fails_does_not_stop_the_other_partitions(
    real_client, topic, on_cluster, faults, run_consumer
):
    """run() acks each handled message; on a cluster an ack whose master is down is retried at the next polls
    while the other partitions are read on, and lands once the master is back (nothing re-delivered)."""
    faults.fail("xack", topic[0], redis.ConnectionError("Connection refused"))
    _, handled = run_consumer(min_idle_time=600)
    first = send_to_each_partition(real_client, "first")
    wait_until(lambda: sorted(handled) == sorted(first), timeout=15)
    second = send_to_each_partition(real_client, "second")
    wait_until(lambda: sorted(handled) == sorted(first + second), timeout=15)
    assert real_client.xpending(topic[0], "billing")["pending"] == 2
    faults.heal()
    wait_until(lambda: all(real_client.xpending(s, "billing")["pending"] == 0 for s in topic), timeout=15)
    assert sorted(handled) == sorted(first + second)


def test_on_a_cluster_a_consumer_starts_while_a_partition_cannot_be_set_up(real_client, topic, on_cluster, faults):
    """The group cannot be set up on one partition (its master is down): the consumer starts, reads the others,
    and sets that one up once it answers. On no partition at all, it does not start."""
    faults.fail("eval", topic[1], redis.ConnectionError("Connection refused"))
    sent = send_to_each_partition(real_client, "m")
    with Consumer(TOPIC, "billing", "c1", client=real_client, block=0.05, min_idle_time=600) as consumer:
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.body for m in consumer.poll(0.05)) or len(got) == 2, timeout=15)
        faults.heal()
        wait_until(lambda: got.extend(m.body for m in consumer.poll(0.05)) or len(got) == 3, timeout=15)
    assert sorted(got) == sorted(sent)
    for stream in topic:
        faults.fail("eval", stream, redis.ConnectionError("Connection refused"))
    with pytest.raises(Exception, match="could not set up the consumer group"):
        Consumer(TOPIC, "other", "c1", client=real_client)
