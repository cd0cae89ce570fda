"""Runs the transaction scripts by SHA with the least client-side work: the send path's fast lane.

Sync only, and not generated: a sync send uses a connection of its own per sending thread, where the asyncio shell
coalesces concurrent calls into shared pipelines (``redis_txmq.asyncio.lane``); the two keep the same surface (``run``,
``run_many``, ``close``) and write through the same wire (``redis_txmq.sync.wire``).

redis-py's generic command path (pool checkout with a readiness poll, observability hooks, response callbacks) costs
about as much Python time as the round trip itself. A send is two script calls, so on a standalone Redis
``ScriptRunner`` keeps its own connections (made like the client's, one per thread that is sending at the same moment,
never counted against the client's pool) and does only pack, send and read. The semantics stay redis-py's: the
connection's retry policy on connection errors, NOSCRIPT answered by loading the script and calling again, reply errors
raised as ``redis.ResponseError``.

A single-connection client or an unusual pool goes through redis-py's ``Script`` objects and pipelines instead:
the same results, without the shortcut. On a Redis Cluster a call runs in the lane of the master that owns its
slot (a batch is split by master); a redirection or an unreachable master sends it through redis-py's cluster
client, which follows MOVED / ASK and refreshes its view of the cluster.

With a durability level (``redis_txmq.core.durability``) the confirming ``WAIT`` / ``WAITAOF`` goes in the same write as
the scripts, on the same connection (on a cluster: the lane of the master that ran them), and its reply is read with
theirs. A call whose confirmation falls short raises [`DurabilityError`][redis_txmq.core.errors.DurabilityError]
carrying the replies. A call that had to be sent again (a connection error, a redirection) cannot be confirmed: the
repeat of an idempotent script writes nothing, so a ``WAIT`` after it proves nothing about the first; it raises that
error too.
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
    NoScriptError,
    RedisClusterException,
)
from redis.sentinel import SentinelConnectionPool

from ..core.batching import ScriptCall, batch_scripts, coalesce, spread, unsendable
from ..core.clients import REDIRECTIONS
from ..core.durability import Durability
from ..core.errors import DurabilityError
from .connection import hiredis_packer

logger = logging.getLogger(__name__)

RunScripts = Callable[..., tuple[list[Any], Any]]
"""The wire's ``run_scripts(conn, calls, *, pack, durability, connect_first)``."""


_DIRECT_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool, SentinelConnectionPool)
"""Pools whose connections the lane makes its own of: behind Sentinel each asks the Sentinels for the master when
it connects, and a demoted master's READONLY closes it (redis-py), so the lane's retry finds the new master."""
_FALL_BACK = (*REDIRECTIONS, RedisClusterException, redis.ConnectionError, redis.TimeoutError)
"""On a cluster, errors after which a call goes through redis-py's cluster client instead of a master's lane."""


class ScriptRunner:
    """Calls redis-py ``Script`` objects one at a time (``run``) or in one pipeline (``run_many``).

    Thread-safe. ``close`` releases the connections it made."""

    def __init__(
        self, client: Any, run_scripts: RunScripts, *, direct: bool = True, durability: Durability | None = None
    ) -> None:
        """``run_scripts``: the sync wire's (``redis_txmq.sync.wire.run_scripts``), given by the caller so that
        this module, below the generated shells, does not import them. ``direct=False`` always takes redis-py's
        path (``txmq bench`` measures what the shortcut is worth)."""
        self.client = client
        self._run_scripts = run_scripts
        self.durability = durability
        pool = getattr(client, "connection_pool", None)
        self._direct = (
            direct
            and type(pool) in _DIRECT_POOLS
            and getattr(client, "connection", None) is None
            and issubclass(pool.connection_class, redis.Connection | redis.UnixDomainSocketConnection)
        )
        self._pool = pool
        # redis-py connects lazily in send_packed_command, past the override by which a Sentinel-managed connection
        # asks the Sentinels for the master: without this it would dial the default localhost:6379
        self._connect_first = self._direct and isinstance(pool, SentinelConnectionPool)
        self._pack = hiredis_packer(pool.connection_kwargs) if self._direct else None
        # prepares, or ends, of one topic partition in one write go as one call of their batch script
        self._batched = batch_scripts(client) if self._direct else {}
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
            refused = unsendable(keys, args)  # as the direct path's wire refuses it: alone, with its own error
            if refused is not None:
                raise refused
            if self.durability is None:
                return script(keys=keys, args=args)
            return self._run_pipeline([(script, keys, args)], raise_on_error=True)[0]
        (reply,) = self._run_direct([(script, keys, args)], raise_on_error=True)
        return reply

    def run_many(self, calls: Sequence[ScriptCall], *, raise_on_error: bool = False) -> list[Any]:
        """Send every call in one pipeline (not a MULTI: each script is atomic on its own).

        Returns one reply per call, in order; a call the server refused has its ``redis.ResponseError`` in
        its place (or raised, with ``raise_on_error``). A connection error after the retries is raised."""
        if not calls:
            return []
        if not self._direct:
            return self._run_pipeline(calls, raise_on_error)
        return self._run_direct(calls, raise_on_error)

    def _run_direct(self, calls: Sequence[ScriptCall], raise_on_error: bool) -> list[Any]:
        """On the runner's own connection: one write, every reply read (``redis_txmq.sync.wire.run_scripts``); the
        prepares, or ends, of one topic partition as one call of their batch script (``redis_txmq.core.batching``).
        A single call (every sync send's prepare and end) has nothing to coalesce: it skips the grouping."""
        written, spans = coalesce(calls, self._batched) if len(calls) > 1 else (calls, None)
        conn = self._acquire()
        healthy = False
        try:
            replies, confirmation = self._run_scripts(
                conn, written, pack=self._pack, durability=self.durability, connect_first=self._connect_first
            )
            healthy = True
        finally:
            self._release(conn, healthy)
        if spans is not None:
            replies = spread(replies, spans, len(calls))
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, redis.ResponseError):
                    raise reply
        if self.durability is not None:
            self._confirm(replies, confirmation)
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

    def _confirm(self, replies: list[Any], waited: Any) -> None:
        """Raise [`DurabilityError`][redis_txmq.core.errors.DurabilityError] (with the replies) when the level asks for
        a confirmation and ``waited``, the reply of its command (None: none could be had), falls short."""
        durability = self.durability
        if durability is None or durability.confirmed(waited):
            return
        raise durability.error(waited, replies)

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
                made = ScriptRunner(node.redis_connection, self._run_scripts, durability=self.durability)
                runner = self._node_runners.setdefault(node.name, made)
        return runner

    def _run_on_node(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """On a cluster: the lane of the master that owns the slot; when the slot is moving or that master is
        unreachable, redis-py's cluster client (it follows MOVED / ASK and refreshes the topology)."""
        try:
            return self._node_runner(self.client.get_node_from_key(keys[0])).run(script, keys, args)
        except _FALL_BACK:
            reply = script(keys=keys, args=args)
        self._confirm([reply], None)
        return reply

    def _run_pipeline(self, calls: Sequence[ScriptCall], raise_on_error: bool) -> list[Any]:
        """Without the direct lane: a redis-py pipeline, or on a cluster one pipeline per master (redis-py's
        cluster pipeline refuses EVALSHA). Every call's keys share one slot, so its first key names the node."""
        if isinstance(self.client, RedisCluster):
            replies, confirmed = self._run_on_masters(calls)
        else:
            replies, confirmation = self._pipeline(self.client, calls, self.durability)
            confirmed = self.durability is None or self.durability.confirmed(confirmation)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        if not confirmed:
            self._confirm(replies, None if isinstance(self.client, RedisCluster) else confirmation)
        return replies

    def _run_on_masters(self, calls: Sequence[ScriptCall]) -> tuple[list[Any], bool]:
        """The replies of a batch on a cluster, each master's part in its own lane, and whether every part was
        confirmed as durable there (always True without a durability level)."""
        replies: list[Any] = [None] * len(calls)
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
        confirmed = True
        for name, indexes in by_node.items():
            try:
                part = self._node_runner(nodes[name]).run_many([calls[i] for i in indexes])
            except (redis.ConnectionError, redis.TimeoutError):
                unrouted.extend(indexes)  # that master is unreachable: the cluster client finds the new one
                continue
            except DurabilityError as exc:
                part, confirmed = exc.replies, False
            for i, reply in zip(indexes, part, strict=True):
                replies[i] = reply
        unrouted.extend(i for i, reply in enumerate(replies) if isinstance(reply, REDIRECTIONS))
        for i in sorted(set(unrouted)):
            # one call through the cluster client, which follows redirections and refreshes its map;
            # every script is idempotent, so a call that did reach its master is not applied twice
            script, keys, args = calls[i]
            confirmed = self.durability is None
            try:
                replies[i] = script(keys=keys, args=args)
            except redis.ResponseError as exc:
                replies[i] = exc
        return replies, confirmed

    @staticmethod
    def _pipeline(client: Any, calls: Sequence[ScriptCall], durability: Durability | None) -> tuple[list[Any], Any]:
        """The replies, and the confirmation's reply (None without a durability level or when it cannot count:
        the calls NOSCRIPT refused went out on another pipeline, which may be another connection). A call that
        cannot be sent is left out, its error in its reply's place: redis-py packs the pipeline at once."""
        refused = [unsendable(keys, args) for _, keys, args in calls]
        pipe = client.pipeline(transaction=False)
        for (script, keys, args), error in zip(calls, refused, strict=True):
            if error is None:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
        if durability is not None:
            pipe.execute_command(*durability.command)
        sent = pipe.execute(raise_on_error=False)
        confirmation = sent.pop() if durability is not None else None
        answered = iter(sent)
        replies: list[Any] = [next(answered) if error is None else error for error in refused]
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            pipe = client.pipeline(transaction=False)
            for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
                script.sha = client.script_load(script.script)
            for i in missing:
                script, keys, args = calls[i]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            if durability is not None:
                pipe.execute_command(*durability.command)
            again = pipe.execute(raise_on_error=False)
            confirmation = again.pop() if durability is not None else None
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies, confirmation
