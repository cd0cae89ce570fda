"""Topics and their partitions: a topic has P partitions (default 1), each its own stream in its own hash slot.

A message goes to the partition of a stable hash of its first key, so one key keeps its order; a message without
keys goes round robin. Create a partitioned topic before anything is sent to it.

Creating a topic also registers its streams in ``txmq:topics``, so that ``txmq status``, the checker and the Spark
source know it (as an empty topic) before its first message.
"""

from __future__ import annotations

import itertools
import logging
import threading
import zlib
from typing import Any

import redis

from . import entries
from .errors import ConfigurationError, TxMQConnectionError
from .keys import TOPIC_REGISTRY, TopicKeys, topic_meta_key, topic_stream_key
from .message import Message, validate_name
from .scripts import script_source

logger = logging.getLogger(__name__)


def create_topic(client: Any, topic: str, partitions: int) -> int:
    """Fix ``topic``'s partition count and register its streams (idempotent for the same count); returns it.

    The registry is a separate call: its key lives in another hash slot than the topic's metadata (Redis Cluster).
    If it fails, the topic exists but is not listed yet; calling again registers it."""
    validate_name(topic, "topic")
    try:
        reply = client.eval(
            script_source("create_topic"), 2, topic_meta_key(topic), topic_stream_key(topic), partitions
        )
    except redis.RedisError as exc:
        raise TxMQConnectionError(f"topic {topic!r}: could not create it: {exc}") from exc
    status = entries.text(reply[0])
    if status != "OK":
        raise ConfigurationError(
            f"topic {topic!r}: cannot create with {partitions} partitions: {entries.text(reply[2])}"
        )
    count = int(reply[1])
    streams = [keys.topic_stream for keys in partition_keys_of(topic, count)]
    try:
        client.sadd(TOPIC_REGISTRY, *streams)
    except redis.RedisError as exc:
        raise TxMQConnectionError(
            f"topic {topic!r}: created with {count} partition(s) but its streams could not be registered in "
            f"{TOPIC_REGISTRY} ({exc}); call create_topic again with the same count to register them"
        ) from exc
    logger.debug("topic %r: %d partition(s), streams registered: %s", topic, count, ", ".join(streams))
    return count


def restore_partitions_call(topic: str, partitions: int) -> tuple[Any, ...]:
    """The EVAL arguments of ``create_topic.lua`` that put back a partition count Redis lost (a no-op when it is
    there, refused when the unpartitioned stream has messages): the producer re-asserts what it routes by. A call
    of its own, not a pipeline's: cluster pipelines refuse scripts."""
    return (script_source("create_topic"), 2, topic_meta_key(topic), topic_stream_key(topic), partitions)


def partition_count(client: Any, topic: str) -> int:
    """The number of partitions of ``topic`` (1 when it was never created with more)."""
    return count_of(client.hget(topic_meta_key(topic), "partitions"))


def count_of(raw: Any) -> int:
    """A topic's partition count from its metadata field (absent: one partition)."""
    return int(raw) if raw else 1


def partition_keys(client: Any, topic: str) -> list[TopicKeys]:
    """The keys of every partition of ``topic``."""
    return partition_keys_of(topic, partition_count(client, topic))


def partition_keys_of(topic: str, count: int) -> list[TopicKeys]:
    """The keys of the partitions of a topic of ``count`` partitions."""
    if count == 1:
        return [TopicKeys(topic)]
    return [TopicKeys(topic, p, partitioned=True) for p in range(count)]


class PartitionRouter:
    """Picks a message's partition; remembers each topic's partitions for the life of the process."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._partitions: dict[str, list[TopicKeys]] = {}
        self._round_robin = itertools.count()
        self._lock = threading.Lock()

    def keys_for(self, message: Message) -> TopicKeys:
        partitions = self._partitions.get(message.topic)
        if partitions is None:
            with self._lock:
                partitions = self._partitions.get(message.topic)
                if partitions is None:
                    partitions = self.remember(message.topic, partition_count(self.client, message.topic))
        return self.pick(message, partitions)

    def known(self, topic: str) -> list[TopicKeys] | None:
        """The topic's partitions if this process has read them (a caller doing its own I/O reads them first)."""
        return self._partitions.get(topic)

    def remember(self, topic: str, count: int) -> list[TopicKeys]:
        partitions = self._partitions.setdefault(topic, partition_keys_of(topic, count))
        return partitions

    def pick(self, message: Message, partitions: list[TopicKeys]) -> TopicKeys:
        """The partition of a stable hash of the message's first key, or round robin without keys."""
        if len(partitions) == 1:
            return partitions[0]
        keys = message.keys_list
        if keys:
            return partitions[zlib.crc32(keys[0].encode()) % len(partitions)]
        return partitions[next(self._round_robin) % len(partitions)]

    def partitioned_topics(self) -> dict[str, int]:
        """Topic -> partition count of the partitioned topics this process sent to."""
        with self._lock:
            return {topic: len(keys) for topic, keys in self._partitions.items() if len(keys) > 1}
