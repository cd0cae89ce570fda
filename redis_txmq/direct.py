"""Runs the transaction scripts by SHA with the least client-side work: the send path's fast lane.

redis-py's generic command path (pool checkout with a readiness poll, observability hooks, response
callbacks) costs about as much Python time as the round trip itself. A send is two script calls, so on
a standalone Redis :class:`ScriptRunner` keeps its own connections (made like the client's, one per thread
that is sending at the same moment, never counted against the client's pool) and does only pack, send and
read. The semantics stay redis-py's: the connection's retry policy on connection errors, NOSCRIPT answered
by loading the script and calling again, reply errors raised as ``redis.ResponseError``.

A single-connection client or an unusual pool goes through redis-py's ``Script`` objects and pipelines instead:
the same results, without the shortcut. On a Redis Cluster a call runs in the lane of the master that owns its
slot (a batch is split by master); a redirection or an unreachable master sends it through redis-py's cluster
client, which follows MOVED / ASK and refreshes its view of the cluster.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)

from .connection import hiredis_packer

logger = logging.getLogger(__name__)

ScriptCall = tuple[Any, Sequence[Any], Sequence[Any]]
"""``(script, keys, args)``: a redis-py ``Script`` (registered on the runner's client), its KEYS and ARGV."""

_DIRECT_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool)
_REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)
_FALL_BACK = (*_REDIRECTED, RedisClusterException, redis.ConnectionError, redis.TimeoutError)
"""On a cluster, errors after which a call goes through redis-py's cluster client instead of a master's lane."""


class ScriptRunner:
    """Calls redis-py ``Script`` objects one at a time (:meth:`run`) or in one pipeline (:meth:`run_many`).

    Thread-safe. :meth:`close` releases the connections it made."""

    def __init__(self, client: Any, *, direct: bool = True) -> None:
        """``direct=False`` always takes redis-py's path (``txmq bench`` measures what the shortcut is worth)."""
        self.client = client
        pool = getattr(client, "connection_pool", None)
        self._direct = (
            direct
            and type(pool) in _DIRECT_POOLS
            and getattr(client, "connection", None) is None
            and issubclass(pool.connection_class, redis.Connection | redis.UnixDomainSocketConnection)
        )
        self._pool = pool
        self._pack = hiredis_packer(pool.connection_kwargs) if self._direct else None
        self._idle: list[Any] = []
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.Lock()
        self._all: list[Any] = []
        self._node_runners: dict[str, ScriptRunner] = {}
        self._cluster = isinstance(client, RedisCluster)

    @property
    def direct(self) -> bool:
        """True when calls use the runner's own connections (standalone Redis)."""
        return self._direct

    def run(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """EVALSHA ``script``; returns the reply, raises ``redis.RedisError`` like ``script(keys, args)``."""
        if not self._direct:
            if self._cluster:
                return self._run_on_node(script, keys, args)
            return script(keys=keys, args=args)
        conn = self._acquire()
        healthy = False
        try:
            try:
                reply = _with_retry(conn, lambda: self._exchange_one(conn, script, keys, args))
            except NoScriptError:
                _with_retry(conn, lambda: self._load(conn, [script]))
                reply = _with_retry(conn, lambda: self._exchange_one(conn, script, keys, args))
            healthy = True
        except redis.ResponseError:
            healthy = True
            raise
        finally:
            self._release(conn, healthy)
        return reply

    def run_many(self, calls: Sequence[ScriptCall], *, raise_on_error: bool = False) -> list[Any]:
        """Send every call in one pipeline (not a MULTI: each script is atomic on its own).

        Returns one reply per call, in order; a call the server refused has its ``redis.ResponseError`` in
        its place (or raised, with ``raise_on_error``). A connection error after the retries is raised."""
        if not calls:
            return []
        if not self._direct:
            return self._run_pipeline(calls, raise_on_error)
        conn = self._acquire()
        healthy = False
        try:
            replies = _with_retry(conn, lambda: self._exchange(conn, calls))
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                scripts = {id(calls[i][0]): calls[i][0] for i in missing}.values()
                _with_retry(conn, lambda: self._load(conn, scripts))
                again = _with_retry(conn, lambda: self._exchange(conn, [calls[i] for i in missing]))
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
            healthy = True
        finally:
            self._release(conn, healthy)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, redis.ResponseError):
                    raise reply
        return replies

    def close(self) -> None:
        """Close the runner's own connections; calls after this still work on fresh ones."""
        with self._lock:
            self._closed = True
            connections, self._all, self._idle = self._all, [], []
            node_runners, self._node_runners = list(self._node_runners.values()), {}
        for conn in connections:
            conn.disconnect()
        for runner in node_runners:
            runner.close()

    def _exchange_one(self, conn: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        conn.send_packed_command([self._pack(command)] if self._pack is not None else conn.pack_command(*command))
        return conn.read_response()

    def _exchange(self, conn: Any, calls: Sequence[ScriptCall]) -> list[Any]:
        pack = self._pack
        packed: list[bytes] = []
        for script, keys, args in calls:
            command = ("EVALSHA", script.sha, len(keys), *keys, *args)
            if pack is not None:
                packed.append(pack(command))
            else:
                packed.extend(conn.pack_command(*command))
        conn.send_packed_command([b"".join(packed)])
        replies: list[Any] = []
        for _ in calls:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies

    @staticmethod
    def _load(conn: Any, scripts: Any) -> None:
        for script in scripts:
            conn.send_command("SCRIPT", "LOAD", script.script)
            sha = conn.read_response()
            script.sha = sha.decode() if isinstance(sha, bytes) else sha

    def _acquire(self) -> Any:
        if self._pid != os.getpid():
            # A forked child must not share its parent's sockets.
            with self._lock:
                self._pid, self._idle, self._all = os.getpid(), [], []
        try:
            return self._idle.pop()
        except IndexError:
            conn = self._pool.connection_class(**self._pool.connection_kwargs)
            with self._lock:
                if not self._closed:
                    self._all.append(conn)
            return conn

    def _release(self, conn: Any, healthy: bool) -> None:
        if not healthy:
            # An interrupted exchange may leave replies unread on the socket.
            conn.disconnect()
        if self._closed:
            conn.disconnect()
            return
        self._idle.append(conn)

    def _node_runner(self, node: Any) -> ScriptRunner:
        runner = self._node_runners.get(node.name)
        if runner is None:
            with self._lock:
                runner = self._node_runners.setdefault(node.name, ScriptRunner(node.redis_connection))
        return runner

    def _run_on_node(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """On a cluster: the lane of the master that owns the slot; when the slot is moving or that master is
        unreachable, redis-py's cluster client (it follows MOVED / ASK and refreshes the topology)."""
        try:
            return self._node_runner(self.client.get_node_from_key(keys[0])).run(script, keys, args)
        except _FALL_BACK:
            return script(keys=keys, args=args)

    def _run_pipeline(self, calls: Sequence[ScriptCall], raise_on_error: bool) -> list[Any]:
        """Without the direct lane: a redis-py pipeline, or on a cluster one pipeline per master (redis-py's
        cluster pipeline refuses EVALSHA). Every call's keys share one slot, so its first key names the node."""
        if not isinstance(self.client, RedisCluster):
            replies = self._pipeline(self.client, calls)
        else:
            replies = [None] * len(calls)
            by_node: dict[str, list[int]] = {}
            nodes: dict[str, Any] = {}
            unrouted: list[int] = []
            for i, (_script, keys, _args) in enumerate(calls):
                try:
                    node = self.client.get_node_from_key(keys[0])
                except RedisClusterException:  # the slot is not in the client's map (failover under way)
                    unrouted.append(i)
                    continue
                nodes[node.name] = node
                by_node.setdefault(node.name, []).append(i)
            for name, indexes in by_node.items():
                try:
                    part = self._node_runner(nodes[name]).run_many([calls[i] for i in indexes])
                except (redis.ConnectionError, redis.TimeoutError):
                    unrouted.extend(indexes)  # that master is unreachable: the cluster client finds the new one
                    continue
                for i, reply in zip(indexes, part, strict=True):
                    replies[i] = reply
            unrouted.extend(i for i, reply in enumerate(replies) if isinstance(reply, _REDIRECTED))
            for i in sorted(set(unrouted)):
                # one call through the cluster client, which follows redirections and refreshes its map;
                # every script is idempotent, so a call that did reach its master is not applied twice
                script, keys, args = calls[i]
                try:
                    replies[i] = script(keys=keys, args=args)
                except redis.ResponseError as exc:
                    replies[i] = exc
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    @staticmethod
    def _pipeline(client: Any, calls: Sequence[ScriptCall]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            pipe = client.pipeline(transaction=False)
            for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
                script.sha = client.script_load(script.script)
            for i in missing:
                script, keys, args = calls[i]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            for i, reply in zip(missing, pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
        return replies


def _with_retry(conn: Any, exchange: Callable[[], Any]) -> Any:
    """Run ``exchange`` under the connection's retry policy, and once more on a new socket after a connection error.

    A socket the server closed while it sat idle (``timeout`` setting, restart, failover) shows only when used;
    redis-py's pool polls each connection before handing it out, the fast lane retries instead. Every script
    the runner calls is idempotent, so a second attempt cannot apply anything twice."""

    def failed(_error: Exception) -> None:
        conn.disconnect()

    try:
        return conn.retry.call_with_retry(exchange, failed)
    except redis.ConnectionError:
        conn.disconnect()
        return conn.retry.call_with_retry(exchange, failed)
