"""What a run left behind, read straight from Redis and from the consumers' records."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from redis_txmq.core.keys import (
    CHECKERS_CONSUMER_GROUP,
    PRODUCERS_CONSUMER_GROUP,
    REPLY_STREAM,
    TOPIC_REGISTRY,
    GroupKeys,
    TopicKeys,
    topic_keys_of_stream,
)
from redis_txmq.core.topics import partition_keys

from .harness import CONSUMER_GROUP, PRODUCER_GROUP, TOPICS

MISSING_GROUP = -1
"""What :func:`leftovers` reports for a consumer group that should exist and does not."""


@dataclass(frozen=True)
class Entry:
    topic: str
    stream: str
    id: str


@dataclass(frozen=True)
class Delivery:
    topic: str
    stream: str
    id: str
    transaction_id: str
    delivery_count: int


def partitions(client: Any) -> list[TopicKeys]:
    """The keys of every topic partition: those of the suite's topics and whatever else is registered."""
    keys = {k for topic in TOPICS for k in partition_keys(client, topic)}
    keys |= {topic_keys_of_stream(member.decode()) for member in client.smembers(TOPIC_REGISTRY)}
    return sorted(keys, key=lambda k: k.topic_stream)


def topic_entries(client: Any) -> dict[str, list[Entry]]:
    """Transaction id -> every entry of the topic streams that carries it (one, if all is well)."""
    found: dict[str, list[Entry]] = collections.defaultdict(list)
    for keys in partitions(client):
        for entry_id, fields in client.xrange(keys.topic_stream):
            found[fields[b"transaction_id"].decode()].append(Entry(keys.topic, keys.topic_stream, entry_id.decode()))
    return dict(found)


def pending(client: Any, stream: str, group: str) -> int:
    """Entries read through ``group`` and not acknowledged; :data:`MISSING_GROUP` when the group is gone."""
    try:
        return int(client.xpending(stream, group)["pending"])
    except redis.ResponseError as exc:
        if str(exc).startswith("NOGROUP"):
            return MISSING_GROUP
        raise


def leftovers(client: Any) -> dict[str, int]:
    """Everything that must be empty once a run has settled, by what it is, with its size."""
    counts: dict[str, int] = {}
    for keys in partitions(client):
        counts[f"in flight {keys.inflight}"] = client.hlen(keys.inflight)
        counts[f"half messages {keys.half_stream}"] = client.xlen(keys.half_stream)
        for zset in (keys.unchecked, keys.due):
            counts[f"index of in-flight transactions {zset}"] = client.zcard(zset)
        for index in (keys.checks, keys.remarks, keys.check_requests):
            counts[f"index of in-flight transactions {index}"] = client.hlen(index)
        counts[f"dead letters {keys.dead_stream}"] = client.xlen(keys.dead_stream)
        counts[f"consumer dead letters {keys.consumer_dead_stream(CONSUMER_GROUP)}"] = client.xlen(
            keys.consumer_dead_stream(CONSUMER_GROUP)
        )
        counts[f"unacked by {CONSUMER_GROUP} {keys.topic_stream}"] = pending(client, keys.topic_stream, CONSUMER_GROUP)
    requests = GroupKeys(PRODUCER_GROUP).check_requests
    counts[f"check requests {requests}"] = client.xlen(requests)
    counts[f"check requests unacked {requests}"] = pending(client, requests, PRODUCERS_CONSUMER_GROUP)
    counts[f"check replies {REPLY_STREAM}"] = client.xlen(REPLY_STREAM)
    counts[f"check replies unacked {REPLY_STREAM}"] = pending(client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP)
    return counts


def op_records(client: Any) -> collections.Counter[str]:
    """Outcome records of the op streams, counted by ``<outcome> by <source>``."""
    counted: collections.Counter[str] = collections.Counter()
    for keys in partitions(client):
        for _, fields in client.xrange(keys.op_stream):
            counted[f"{fields[b'outcome'].decode()} by {fields[b'source'].decode()}"] += 1
    return counted


def deliveries(directory: Path) -> list[Delivery]:
    """Every delivery the consumers recorded, in the order of their records."""
    found = []
    for record in sorted(directory.glob("consumer-*.log")):
        for line in record.read_text().splitlines():
            topic, stream, entry_id, transaction_id, count = line.split()
            found.append(Delivery(topic, stream, entry_id, transaction_id, int(count)))
    return found


SHORTFALLS = (
    ("tx.send", "a send raised (try"),
    ("prepare", "the half message is on the master but"),
    ("end", "is applied on the master but"),
    ("pipelined ends", "end calls applied on the master but"),
)
"""What a durability shortfall logged by a service fell short on, by a phrase of its message (the first that
matches): a ``tx.send`` of a message of several that raised (:class:`~.producer_worker.Parts`), a prepare that
raised, a send's end, ends sent in one pipeline; any other (a decision, or the mark of a failed send, of a
transaction of several messages) counts as ``decision or mark``."""


def shortfalls(logs: Path) -> collections.Counter[str]:
    """Durability shortfalls in the workers' logs (the replica variant), counted by ``<worker kind> <what>``: each
    is a write the master applied and the replica did not acknowledge in time."""
    counted: collections.Counter[str] = collections.Counter()
    for log in sorted(logs.glob("*.log")):
        kind = log.stem.rpartition("-")[0]
        for line in log.read_text(errors="replace").splitlines():
            if "not confirmed as durable" in line:
                what = next((name for name, phrase in SHORTFALLS if phrase in line), "decision or mark")
                counted[f"{kind} {what}"] += 1
    return counted
