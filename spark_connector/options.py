"""The options of the ``redis-txmq`` source, named as Spark users know them from the Kafka source.

Parsed once on the driver into a picklable [`ConnectorOptions`][redis_txmq.spark.options.ConnectorOptions]; every
refusal is a [`SparkSourceError`][redis_txmq.spark.options.SparkSourceError] naming the option, and no error or ``repr``
carries a password.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis_txmq.core.clients import redact_url
from redis_txmq.core.config import DEFAULT_REDIS_URL
from redis_txmq.core.errors import ConfigurationError
from redis_txmq.core.message import validate_name
from redis_txmq.transport.connection import connect

from .offsets import EARLIEST, LATEST, parse_entry_id

KNOWN_OPTIONS = {
    "redis.url": "Redis URL (redis://, rediss://, unix://, redis+sentinel://), default redis://localhost:6379/0",
    "redis.password": "password, kept out of the URL (Spark redacts options named like a password)",
    "redis.sentinelpassword": "the Sentinels' password (redis+sentinel:// URLs), apart from the data's",
    "redis.cluster": "true to use redis.cluster.RedisCluster",
    "topics": "comma-separated topic names (required)",
    "startingoffsets": "earliest | latest | JSON {topic: {partition: entry id}}",
    "endingoffsets": "batch only: latest | JSON {topic: {partition: entry id}}",
    "maxentriespertrigger": "streaming: at most this many entries per micro-batch",
    "readbatchsize": "entries per XRANGE call, default 5000 (each call holds the server a few ms)",
    "minpartitions": "batch: at least this many Spark partitions (ranges of entry ids), default 1",
    "failondataloss": "true (default): fail when unread entries were trimmed or deleted (XDEL); false: warn",
}

DEFAULT_READ_BATCH_SIZE = 5_000
"""Entries per XRANGE call and per Arrow batch, as measured on a batch read: pages of 5,000 read as fast as pages of
10,000 and faster than 2,000 (about 8% in Spark) or 1,000 (a quarter, in one process); 20,000 is slower again.
Redis builds a page in a few milliseconds and serves nobody else meanwhile: the smaller of the fastest sizes."""


class SparkSourceError(ConfigurationError):
    """A bad option or an unreadable topic; the message names it."""


@dataclass(frozen=True)
class ConnectorOptions:
    topics: tuple[str, ...]
    redis_url: str = DEFAULT_REDIS_URL
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    cluster: bool = False
    starting_offsets: Any = EARLIEST
    ending_offsets: Any = LATEST
    max_entries_per_trigger: int | None = None
    read_batch_size: int = DEFAULT_READ_BATCH_SIZE
    fail_on_data_loss: bool = True
    min_partitions: int = 1

    def __repr__(self) -> str:
        return (
            f"ConnectorOptions(topics={self.topics}, redis_url={redact_url(self.redis_url)!r}, cluster={self.cluster})"
        )

    @property
    def safe_url(self) -> str:
        return redact_url(self.redis_url)

    def client(self) -> Any:
        """A new binary-safe client: made where it is used (readers are pickled to executors)."""
        extra = {} if self.password is None else {"password": self.password}
        if self.sentinel_password is not None:
            extra["sentinel_password"] = self.sentinel_password
        return connect(self.redis_url, cluster=self.cluster, **extra)


def parse_options(options: Mapping[str, str], streaming: bool) -> ConnectorOptions:
    """Validate Spark's (case-insensitive) options for a batch or a streaming read."""
    given = {key.lower(): value for key, value in options.items()}
    unknown = sorted(set(given) - set(KNOWN_OPTIONS))
    if unknown:
        known = ", ".join(sorted(KNOWN_OPTIONS))
        raise SparkSourceError(f"unknown option(s) {', '.join(unknown)} for format redis-txmq; known: {known}")
    if "topics" not in given or not given["topics"].strip():
        raise SparkSourceError("option 'topics' is required: a comma-separated list of topic names")
    topics = tuple(t.strip() for t in given["topics"].split(",") if t.strip())
    for topic in topics:
        try:
            validate_name(topic, "topic")
        except ValueError as exc:
            raise SparkSourceError(f"option 'topics': {exc}") from None
    if streaming and "endingoffsets" in given:
        raise SparkSourceError("option 'endingOffsets' is for batch reads only; a stream has no end")
    if not streaming and "maxentriespertrigger" in given:
        raise SparkSourceError("option 'maxEntriesPerTrigger' is for streaming reads only")
    if streaming and "minpartitions" in given:
        raise SparkSourceError("option 'minPartitions' is for batch reads only")
    starting = _offsets_option(
        given.get("startingoffsets", EARLIEST), "startingOffsets", topics, allowed=(EARLIEST, LATEST)
    )
    ending = _offsets_option(given.get("endingoffsets", LATEST), "endingOffsets", topics, allowed=(LATEST,))
    return ConnectorOptions(
        topics=topics,
        redis_url=given.get("redis.url", DEFAULT_REDIS_URL),
        password=given.get("redis.password"),
        sentinel_password=given.get("redis.sentinelpassword"),
        cluster=_bool(given, "redis.cluster", False),
        starting_offsets=starting,
        ending_offsets=ending,
        max_entries_per_trigger=_positive_int(given, "maxentriespertrigger", "maxEntriesPerTrigger"),
        read_batch_size=_positive_int(given, "readbatchsize", "readBatchSize") or DEFAULT_READ_BATCH_SIZE,
        fail_on_data_loss=_bool(given, "failondataloss", True),
        min_partitions=_positive_int(given, "minpartitions", "minPartitions") or 1,
    )


def _offsets_option(raw: str, name: str, topics: tuple[str, ...], allowed: tuple[str, ...]) -> Any:
    """``earliest`` / ``latest`` as given, or a validated ``{topic: {partition: entry id}}`` dict."""
    value = raw.strip()
    if value.lower() in allowed:
        return value.lower()
    try:
        parsed = json.loads(value)
    except ValueError:
        raise SparkSourceError(
            f"option {name!r}: {value!r} is neither {' nor '.join(allowed)} nor JSON like "
            '{"orders": {"0": "1700000000000-0"}}'
        ) from None
    if not isinstance(parsed, dict):
        raise SparkSourceError(f"option {name!r}: the JSON must be an object of topic -> {{partition: entry id}}")
    for topic, partitions in parsed.items():
        if topic not in topics:
            raise SparkSourceError(f"option {name!r} names topic {topic!r}, which is not in 'topics'")
        if not isinstance(partitions, dict):
            raise SparkSourceError(f"option {name!r}: topic {topic!r} must map partition numbers to entry ids")
        for partition, entry_id in partitions.items():
            if not str(partition).isdigit():
                raise SparkSourceError(f"option {name!r}: topic {topic!r}: partition {partition!r} is not a number")
            if entry_id not in allowed and not _is_entry_id(entry_id):
                raise SparkSourceError(
                    f"option {name!r}: topic {topic!r} partition {partition}: {entry_id!r} is not an entry id "
                    f"like 1700000000000-0 (or {' / '.join(allowed)})"
                )
    return parsed


def _is_entry_id(value: Any) -> bool:
    try:
        parse_entry_id(value)
    except (TypeError, ValueError):
        return False
    return True


def _bool(given: Mapping[str, str], key: str, default: bool) -> bool:
    raw = given.get(key)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in {"true", "false"}:
        return lowered == "true"
    raise SparkSourceError(f"option {key!r} must be true or false, got {raw!r}")


def _positive_int(given: Mapping[str, str], key: str, name: str) -> int | None:
    raw = given.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SparkSourceError(f"option {name!r} must be a positive integer, got {raw!r}")
    return value
