"""Consumer groups on streams."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..core.clients import REDIS_ERRORS, is_async_cluster
from .entries import text
from .errors import TxMQConnectionError
from .scripts import script_source

logger = logging.getLogger(__name__)

_ENSURE_GROUP = "ensure_group"
_FORGET_CONSUMERS = "forget_consumers"
CURSOR_START = "0-0"


def is_missing_group(exc: BaseException) -> bool:
    """True for the NOGROUP error a read or claim gets when the stream or its consumer group is gone (Redis lost its
    data: a restart without persistence, a failover to a replica that lagged, a FLUSHALL): the caller recreates the
    group with ``ensure_consumer_group`` and goes on."""
    if not isinstance(exc, redis.ResponseError):
        return False
    message = str(exc)
    # fakeredis words XREADGROUP on a missing stream differently from Redis
    return message.startswith("NOGROUP") or "requires the key to exist" in message


def forget_dead_consumers(client: Any, stream: str, group: str, me: str, idle_ms: int) -> list[str]:
    """Remove the consumers of ``group`` that hold no pending entry and were not seen for ``idle_ms``: instances
    that died (their pending entries were claimed by live ones). Without this the group lists every instance that
    ever ran. One script (``lua/forget_consumers.lua``): no consumer can read between the check and its removal.
    A live consumer removed (idle that long with nothing pending) is recreated by its next read. Returns the names
    removed."""
    return removed_names(client.eval(*forget_consumers_call(stream, group, me, idle_ms)))


def forget_consumers_call(stream: str, group: str, me: str, idle_ms: int) -> tuple[Any, ...]:
    """The EVAL arguments of ``lua/forget_consumers.lua`` (sync and asyncio callers)."""
    return (script_source(_FORGET_CONSUMERS), 1, stream, group, me, idle_ms)


def removed_names(reply: Any) -> list[str]:
    return [text(name) or "" for name in reply]


def ensure_consumer_group(client: Any, stream: str, group: str, start_id: str = "0") -> bool:
    """Create ``group`` on ``stream`` (and the stream) unless it exists; True if it was created.

    A script rather than XGROUP CREATE so that an existing group is not an error reply: some servers
    (fakeredis' TCP server among them) drop the connection after one. Sent with EVAL, not EVALSHA, for the
    same reason (no NOSCRIPT on first use); it runs once per process start."""
    try:
        return bool(int(client.eval(*ensure_group_call(stream, group, start_id))))
    except REDIS_ERRORS as exc:
        raise ensure_group_error(stream, group, exc) from exc


def read_group(client: Any, group: str, consumer: str, stream: str, count: int, block_ms: int | None) -> Any:
    """XREADGROUP of the new entries of one stream: the reply, or an awaitable on a ``redis.asyncio`` client.

    On a Redis Cluster the read is sent to the master of the stream's slot. Left to itself, redis-py's cluster client
    asks its default node (any master) for the keys of XREADGROUP, whose keys sit at no fixed position: with that
    master down every read failed, whatever master its stream lives on."""
    if not (isinstance(client, RedisCluster) or is_async_cluster(client)):
        return client.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms)
    args: list[Any] = ["XREADGROUP", "GROUP", group, consumer, "COUNT", count]
    if block_ms is not None:
        args += ["BLOCK", block_ms]
    return client.execute_command(*args, "STREAMS", stream, ">", target_nodes=client.get_node_from_key(stream))


def ensure_group_call(stream: str, group: str, start_id: str) -> tuple[Any, ...]:
    """The EVAL arguments of ``lua/ensure_group.lua`` (sync and asyncio callers)."""
    return (script_source(_ENSURE_GROUP), 1, stream, group, start_id)


def ensure_group_error(stream: str, group: str, exc: Exception) -> TxMQConnectionError:
    return TxMQConnectionError(f"stream {stream!r}: could not create consumer group {group!r}: {exc}")


class Backoff:
    """Waits between retries of a loop that rides out outages: ``first`` doubling up to ``cap`` seconds."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.first


class TakeoverWalk:
    """When a walk of a group's pending list is due, and where it stands (the bookkeeping of
    ``PendingTakeover`` and its asyncio twin): XAUTOCLAIM walks the list with a cursor, a batch per call; once a walk
    ends, the next starts ``claim_idle / 2`` seconds later, so a live group pays about nothing for it."""

    def __init__(self, stream: str, group: str, consumer: str, claim_idle: float) -> None:
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.claim_idle = claim_idle
        self.idle_ms = int(claim_idle * 1000)
        self.cursor = CURSOR_START
        self._next_walk = 0.0

    def due(self) -> bool:
        return self.cursor != CURSOR_START or time.monotonic() >= self._next_walk

    def advance(self, cursor: Any) -> bool:
        """Record the cursor XAUTOCLAIM returned; True when the walk ended (time to forget dead consumers)."""
        self.cursor = text(cursor) or CURSOR_START
        if self.cursor != CURSOR_START:
            return False
        self._next_walk = time.monotonic() + self.claim_idle / 2
        return True

    def forgot(self, gone: list[str]) -> None:
        if gone:
            logger.info("stream=%s group=%s removed dead consumers %s", self.stream, self.group, ", ".join(gone))


class PendingTakeover(TakeoverWalk):
    """Takes over entries that a dead reader of a consumer group left pending (read, never acknowledged). When a
    walk ends, the consumers that hold nothing and were not seen for ``claim_idle`` (dead instances, their entries
    claimed) are removed."""

    def __init__(self, client: Any, stream: str, group: str, consumer: str, claim_idle: float) -> None:
        super().__init__(stream, group, consumer, claim_idle)
        self.client = client

    def claim(self, count: int) -> list[Any]:
        """Up to ``count`` entries idle for ``claim_idle`` or longer, now owned by ``consumer``; [] when not due."""
        if not self.due():
            return []
        cursor, claimed, *_ = self.client.xautoclaim(
            self.stream, self.group, self.consumer, self.idle_ms, start_id=self.cursor, count=count
        )
        if self.advance(cursor):
            self.forgot(forget_dead_consumers(self.client, self.stream, self.group, self.consumer, self.idle_ms))
        return list(claimed)
