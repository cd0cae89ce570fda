"""The version of the key layout an instance writes, and who still writes an older one.

A producer records the layout version it writes in its group's layouts hash with every heartbeat
(``lua/heartbeat.lua``); release 0.1.0 wrote layout 1 and records nothing. A checker asks ``legacy_producers`` which
producer instances the heartbeat still lists (live, or gone and not dropped yet: ten live periods after their last beat)
without a record of the current layout: while there is one, it must not rely on what only the current layout writes (a
producer of layout 1 never puts its topics in the checkers' schedule), and visits every registered topic as release
0.1.0 does.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from ..core.clients import REDIS_ERRORS
from . import entries
from .errors import TxMQConnectionError, TxMQError
from .keys import GROUP_REGISTRY, GroupKeys
from .message import validate_name

logger = logging.getLogger(__name__)

LAYOUT_VERSION = 2
"""The key layout this code writes. Layout 1 is release 0.1.0's, which writes no layout record."""


def legacy_producers(client: Any, heartbeat_interval: float = 5.0) -> list[tuple[str, str]]:
    """``(producer group, instance)`` of every producer instance that its group's heartbeat zset still lists (live,
    or gone for less than the heartbeat's drop time, ten live periods of ``heartbeat_interval``: an instance of a group
    none of whose producers runs any more is not dropped by anybody, and must not hold every checker in full rounds for
    ever) and that has no layout record of ``LAYOUT_VERSION`` or later: an instance of release 0.1.0 (which records
    none) or of an older layout. Sorted; empty when every listed instance writes the current layout.

    Reads the group registry, then every group's instances and layout records in one pipeline (two commands per
    group, each on its group's keys: on Redis Cluster, redis-py sends each to the master of the group's slot). A
    registry member that is not a valid group name (written by another tool) is skipped with a logged reason.

    Raises [`TxMQError`][redis_txmq.core.errors.TxMQError] when the registry or a group's keys cannot be read
    ([`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when Redis cannot be reached; a refused read,
    e.g. a key of another type, as such): the caller cannot tell then, and should behave as if an old producer were
    there."""
    try:
        members = client.smembers(GROUP_REGISTRY)
    except REDIS_ERRORS as exc:
        raise TxMQConnectionError(f"cannot read the producer group registry {GROUP_REGISTRY}: {exc}") from exc
    groups = []
    for member in sorted(entries.text(m) or "" for m in members):
        try:
            groups.append(validate_name(member, "producer group"))
        except ValueError:
            logger.error("group registry %s: %r is not a producer group name; skipped", GROUP_REGISTRY, member)
    if not groups:
        return []
    try:
        seconds, micros = client.time()
    except REDIS_ERRORS as exc:
        raise TxMQConnectionError(f"cannot read the server's time: {exc}") from exc
    since_ms = int(seconds) * 1000 + int(micros) // 1000 - int(heartbeat_interval * 3000) * 10
    pipe = client.pipeline(transaction=False)
    for group in groups:
        pipe.zrangebyscore(GroupKeys(group).producers, since_ms, "+inf")
        pipe.hgetall(GroupKeys(group).layouts)
    try:
        replies = pipe.execute(raise_on_error=False)
    except REDIS_ERRORS as exc:
        raise TxMQConnectionError(f"cannot read the producer instances of {len(groups)} groups: {exc}") from exc
    legacy = []
    for index, group in enumerate(groups):
        instances, layouts = replies[2 * index], replies[2 * index + 1]
        for reply in (instances, layouts):
            if isinstance(reply, Exception):
                error = TxMQError if isinstance(reply, redis.ResponseError) else TxMQConnectionError
                raise error(f"cannot read the producer instances of group {group!r}: {reply}") from reply
        versions = {entries.text(k): _version(v) for k, v in layouts.items()}
        for name in (entries.text(i) or "" for i in instances):
            if versions.get(name, 0) < LAYOUT_VERSION:
                legacy.append((group, name))
    return sorted(legacy)


def _version(value: Any) -> int:
    """A layout record's version; 0 for one that is not a number (written by another tool: counts as old)."""
    try:
        return int(entries.text(value) or "")
    except ValueError:
        return 0
