"""Redis clients: made from a URL, or checked when the user passes one."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster

# Defined here in 0.1.0, in redis_txmq.core.clients since 0.2.0: importable from here (and from the old path
# redis_txmq.connection) for one release.
from ..core.clients import CLUSTER_UNAVAILABLE as CLUSTER_UNAVAILABLE
from ..core.clients import REDIRECTIONS as REDIRECTIONS
from ..core.clients import REDIS_ERRORS, is_async_cluster, is_sentinel_url, redact_url
from ..core.clients import REDIS_PY_SOCKET_TIMEOUT as REDIS_PY_SOCKET_TIMEOUT
from ..core.clients import blocking_slice as blocking_slice
from ..core.clients import connection_error_of as connection_error_of
from ..core.clients import connection_errors as connection_errors
from ..core.clients import instance_id as instance_id
from ..core.clients import is_cluster as is_cluster
from ..core.clients import socket_timeout_of as socket_timeout_of
from ..core.config import Settings
from ..core.errors import ConfigurationError
from . import sentinel

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - redis[hiredis] is a dependency, but the plain install works too
    _hiredis_pack = None

logger = logging.getLogger(__name__)

Item = TypeVar("Item")

ASYNC_MAX_CONNECTIONS = 64
"""Connections of an asyncio client made from a URL; a call waits for one when all are busy."""


def hiredis_packer(connection_kwargs: dict[str, Any]) -> Callable[[tuple[Any, ...]], bytes] | None:
    """hiredis's C command packer, when it sends what redis-py's pure-Python packer would for these connections.

    hiredis packs ``str`` as UTF-8 and ints as decimal, as redis-py does with its default encoding; for another
    encoding (or without hiredis) the caller packs through the connection."""
    encoding = connection_kwargs.get("encoding", "utf-8").lower().replace("-", "")
    return _hiredis_pack if encoding == "utf8" else None


def pack_commands(conn: Any, pack: Callable[[tuple[Any, ...]], bytes] | None, commands: Any) -> bytes:
    """The commands as one write for ``conn``: packed by hiredis (``pack``, from ``hiredis_packer``) or by the
    connection itself."""
    if pack is not None:
        if len(commands) == 1:  # a sync send's prepare or end: no list to join
            return pack(tuple(commands[0]))
        return b"".join([pack(tuple(command)) for command in commands])
    packed: list[bytes] = []
    for command in commands:
        packed.extend(conn.pack_command(*command))
    return b"".join(packed)


def connect(redis_url: str, *, cluster: bool = False, asyncio: bool = False, **kwargs: Any) -> Any:
    """A binary-safe client (bodies are bytes) for ``redis://``, ``rediss://``, ``unix://`` or
    ``redis+sentinel://`` URLs (``redis_txmq.transport.sentinel``), from ``redis`` or (``asyncio=True``)
    ``redis.asyncio``; ``kwargs`` (a password, timeouts...) override the URL."""
    if is_sentinel_url(redis_url):
        if cluster:
            raise ConfigurationError(f"{redact_url(redis_url)!r}: a Sentinel URL names one master, not a cluster")
        kwargs.setdefault("sentinel_password", os.environ.get("TXMQ_SENTINEL_PASSWORD") or None)
        return sentinel.connect(redis_url, asyncio=asyncio, **kwargs)
    kwargs.pop("sentinel_password", None)
    try:
        if asyncio:
            from redis.asyncio import BlockingConnectionPool
            from redis.asyncio import Redis as AsyncRedis
            from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

            if cluster:
                return AsyncRedisCluster.from_url(redis_url, **kwargs)
            # many sends in flight wait for a free connection instead of failing with "Too many connections"
            kwargs.setdefault("max_connections", ASYNC_MAX_CONNECTIONS)
            return AsyncRedis.from_pool(BlockingConnectionPool.from_url(redis_url, timeout=None, **kwargs))
        if cluster:
            return RedisCluster.from_url(redis_url, **kwargs)
        return redis.Redis.from_url(redis_url, **kwargs)
    except ValueError as exc:
        raise ConfigurationError(f"invalid Redis URL {redact_url(redis_url)!r}: {exc}") from None


def ensure_binary_client(client: Any) -> Any:
    """Refuse a client that decodes replies: message bodies are bytes and must come back unchanged."""
    if isinstance(client, RedisCluster) or is_async_cluster(client):
        kwargs = client.nodes_manager.connection_kwargs
    elif hasattr(client, "get_connection_kwargs"):
        kwargs = client.get_connection_kwargs()
    else:
        raise ConfigurationError(f"expected a redis.Redis or redis.cluster.RedisCluster client, got {client!r}")
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            "the Redis client decodes responses; pass one made with decode_responses=False (message bodies are bytes)"
        )
    return client


def server_nodes(client: Any) -> list[tuple[str, Any]]:
    """``(address, client)`` of each server a sync client writes to: itself, or each master of a cluster. Behind
    Sentinel the address is the master's as Sentinel reports it now."""
    if isinstance(client, RedisCluster):
        return [(node.name, node.redis_connection) for node in client.get_primaries()]
    pool = client.connection_pool
    service = getattr(pool, "service_name", None)
    if service is not None:
        host, port = pool.get_master_address()
        return [(f"{host}:{port} (master of {service!r})", client)]
    kwargs = pool.connection_kwargs
    return [(kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}", client)]


def server_info(node: Any, *sections: str) -> dict[str, Any]:
    """The INFO sections of one server as one dict; empty when the server refuses INFO (an ACL user without it)."""
    info: dict[str, Any] = {}
    try:
        for section in sections:
            info.update(node.info(section))
    except redis.ResponseError as exc:
        logger.info("INFO refused by the server: %s", exc)
        return {}
    return info


async def async_server_nodes(client: Any) -> list[tuple[str, Any]]:
    """``server_nodes`` of a ``redis.asyncio`` client: ``(address, node)`` for ``async_server_info``. A
    cluster client learns its masters on its first command: it is initialized first, or none would be listed."""
    if not is_async_cluster(client):
        pool = client.connection_pool
        if getattr(pool, "service_name", None) is not None:
            host, port = await pool.get_master_address()
            return [(f"{host}:{port} (master of {pool.service_name!r})", (client, {}))]
        kwargs = pool.connection_kwargs
        address = kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        return [(address, (client, {}))]
    await client.initialize()
    return [(node.name, (client, {"target_nodes": node})) for node in client.get_primaries()]


async def async_server_info(node: Any, *sections: str) -> dict[str, Any]:
    """``server_info`` of a node of ``async_server_nodes``."""
    client, options = node
    info: dict[str, Any] = {}
    try:
        for section in sections:
            info.update(await client.info(section, **options))
    except redis.ResponseError as exc:
        logger.info("INFO refused by the server: %s", exc)
        return {}
    return info


PIPELINE_CHUNK = 500
"""Items per pipeline of ``pipeline_each`` (a few commands each)."""


def pipeline_each(
    client: Any, items: Sequence[Item], queue: Callable[[Any, Item], int], chunk: int = PIPELINE_CHUNK
) -> list[list[Any] | Exception]:
    """Each item's replies (error replies among them) or the error that kept them from being read, in the order of
    ``items``; ``queue(pipe, item)`` queues the item's commands and says how many.

    Pipelines of ``chunk`` items: a round trip per item costs Redis more than the commands at thousands of topics.
    redis-py's cluster pipeline raises as a whole when one of its nodes cannot be reached (a master down): that
    chunk is read again item by item, so only the unreachable master's items carry the error and the others are
    read."""
    results: list[list[Any] | Exception] = []
    for start in range(0, len(items), chunk):
        part = items[start : start + chunk]
        try:
            results.extend(_pipelined(client, part, queue))
        except REDIS_ERRORS as exc:
            if len(part) == 1:
                results.append(exc)
                continue
            for item in part:
                try:
                    results.extend(_pipelined(client, [item], queue))
                except REDIS_ERRORS as item_exc:
                    results.append(item_exc)
    return results


def checked(value: Any) -> Any:
    """One item of a pipelined read (``pipeline_each``'s replies of it, or what was made of them), or the error that
    kept it, or one of its replies, from being read, raised: for a reader that shows all it read or an error."""
    if isinstance(value, Exception):
        raise value
    if isinstance(value, list):
        for reply in value:
            if isinstance(reply, Exception):
                raise reply
    return value


def pipeline_all(client: Any, items: Sequence[Item], queue: Callable[[Any, Item], int]) -> list[list[Any]]:
    """``pipeline_each``'s replies of every item, or the first error among them raised (``checked``)."""
    return [checked(replies) for replies in pipeline_each(client, items, queue)]


def _pipelined(client: Any, items: Sequence[Item], queue: Callable[[Any, Item], int]) -> list[list[Any] | Exception]:
    with client.pipeline(transaction=False) as pipe:
        counts = [queue(pipe, item) for item in items]
        replies = pipe.execute(raise_on_error=False) if any(counts) else []
    split: list[list[Any] | Exception] = []
    at = 0
    for count in counts:
        split.append(list(replies[at : at + count]))
        at += count
    return split


def resolve_client(
    redis_url: str | None, client: Any, settings: Settings | None, *, asyncio: bool = False
) -> tuple[Any, Settings, bool]:
    """The client to use, the effective settings, and whether the caller made the client (and must close it).

    ``redis_url`` wins over ``settings.redis_url``; with neither, ``TXMQ_REDIS_URL`` or the default applies."""
    if redis_url is not None and client is not None:
        raise ConfigurationError("pass redis_url or client, not both")
    if settings is None:
        settings = Settings.from_env(redis_url=redis_url)
    elif redis_url is not None:
        settings = replace(settings, redis_url=redis_url)
    if client is not None:
        return ensure_binary_client(client), settings, False
    return connect(settings.redis_url, cluster=settings.cluster, asyncio=asyncio), settings, True
