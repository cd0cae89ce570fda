"""Redis clients: made from a URL, or checked when the user passes one."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, RedisClusterException, TryAgainError

from . import sentinel
from .config import Settings
from .errors import ConfigurationError

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - redis[hiredis] is a dependency, but the plain install works too
    _hiredis_pack = None

logger = logging.getLogger(__name__)

Item = TypeVar("Item")

ASYNC_MAX_CONNECTIONS = 64
"""Connections of an asyncio client made from a URL; a call waits for one when all are busy."""

REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
"""What a call to Redis can raise: redis-py's cluster errors (``SlotNotCoveredError``...) are not ``RedisError``."""
REDIRECTIONS: tuple[type[Exception], ...] = (MovedError, AskError, TryAgainError, ClusterDownError)
"""Replies of a cluster node that send a call elsewhere (or later): the cluster client follows them."""
CLUSTER_UNAVAILABLE: tuple[type[Exception], ...] = (TryAgainError, ClusterDownError)
"""Error replies (``ResponseError``s) of a cluster node that say a slot is not served now (CLUSTERDOWN, MASTERDOWN,
TRYAGAIN: a master just restarted or failing over), not that the call is wrong: like a dropped connection, they
concern the keys of one master."""


def hiredis_packer(connection_kwargs: dict[str, Any]) -> Callable[[tuple[Any, ...]], bytes] | None:
    """hiredis's C command packer, when it sends what redis-py's pure-Python packer would for these connections.

    hiredis packs ``str`` as UTF-8 and ints as decimal, as redis-py does with its default encoding; for another
    encoding (or without hiredis) the caller packs through the connection."""
    encoding = connection_kwargs.get("encoding", "utf-8").lower().replace("-", "")
    return _hiredis_pack if encoding == "utf8" else None


def pack_commands(conn: Any, pack: Callable[[tuple[Any, ...]], bytes] | None, commands: Any) -> bytes:
    """The commands as one write for ``conn``: packed by hiredis (``pack``, from :func:`hiredis_packer`) or by the
    connection itself."""
    packed: list[bytes] = []
    for command in commands:
        if pack is not None:
            packed.append(pack(tuple(command)))
        else:
            packed.extend(conn.pack_command(*command))
    return b"".join(packed)


def connect(redis_url: str, *, cluster: bool = False, asyncio: bool = False, **kwargs: Any) -> Any:
    """A binary-safe client (bodies are bytes) for ``redis://``, ``rediss://``, ``unix://`` or
    ``redis+sentinel://`` URLs (:mod:`redis_txmq.sentinel`), from ``redis`` or (``asyncio=True``)
    ``redis.asyncio``; ``kwargs`` (a password, timeouts...) override the URL."""
    if sentinel.is_sentinel_url(redis_url):
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


def redact_url(url: str) -> str:
    """The URL without its password, for logs and errors."""
    if sentinel.is_sentinel_url(url):
        return sentinel.redact(url)
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:
        return "<unparsable redis url>"
    if password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if port:
        host = f"{host}:{port}"
    netloc = f"{user}:***@{host}" if user else f":***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


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
    """:func:`server_nodes` of a ``redis.asyncio`` client: ``(address, node)`` for :func:`async_server_info`. A
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
    """:func:`server_info` of a node of :func:`async_server_nodes`."""
    client, options = node
    info: dict[str, Any] = {}
    try:
        for section in sections:
            info.update(await client.info(section, **options))
    except redis.ResponseError as exc:
        logger.info("INFO refused by the server: %s", exc)
        return {}
    return info


def connection_error_of(exc: BaseException) -> redis.ConnectionError | None:
    """The connection error an ``AttributeError`` / ``TypeError`` raised inside redis-py's connection code stands
    for, else None. redis-py's asyncio connection raises them when its socket is closed under a write (its writer
    set to None by a concurrent disconnect, e.g. a cluster node reset during the connect handshake: redis-py issue
    3546): a caller that retries or reports connection errors must see one, not a crash."""
    if not isinstance(exc, (AttributeError, TypeError)):
        return None
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    filename = frame.tb_frame.f_code.co_filename.replace("\\", "/") if frame is not None else ""
    if "/redis/" not in filename or not filename.endswith("connection.py"):
        return None
    error = redis.ConnectionError(f"connection lost under a write ({type(exc).__name__}: {exc})")
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def connection_errors() -> Iterator[None]:
    """Around a Redis call: :func:`connection_error_of` applied to what it raises."""
    try:
        yield
    except (AttributeError, TypeError) as exc:
        error = connection_error_of(exc)
        if error is None:
            raise
        raise error from exc


PIPELINE_CHUNK = 500
"""Items per pipeline of :func:`pipeline_each` (a few commands each)."""


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


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a cluster client, sync or asyncio."""
    return isinstance(client, RedisCluster) or is_async_cluster(client)


def is_async_cluster(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(client, AsyncRedisCluster)


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


REDIS_PY_SOCKET_TIMEOUT = 5.0
"""redis-py's own ``socket_timeout`` when the client was given none (its connections' default since 6.0)."""


def socket_timeout_of(client: Any) -> float | None:
    """How long the client waits for a reply before it takes the connection for lost (None: for ever)."""
    try:
        kwargs = client.get_connection_kwargs()
    except AttributeError:
        return REDIS_PY_SOCKET_TIMEOUT
    return kwargs.get("socket_timeout", REDIS_PY_SOCKET_TIMEOUT)


def blocking_slice(wanted: float, socket_timeout: float | None) -> float:
    """The longest a blocking read (XREADGROUP BLOCK) may wait on a healthy server without tripping the client's
    socket timeout, which then stays the bound that notices a hung one: a second under it, or half of a short one.
    A longer wait is several reads."""
    if socket_timeout is None:
        return wanted
    return min(wanted, max(socket_timeout - 1.0, socket_timeout / 2))


def instance_id(kind: str) -> str:
    """A name for this process's instance of a producer, consumer or checker: host, pid and a random part."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
