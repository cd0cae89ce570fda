"""Concurrent script calls coalesced into one pipeline: what lets many sends in flight cost less than one each.

Every call made while a pipeline is being sent (or in the same turn of the event loop) waits in the queue and goes out
with the next one, up to ``max_batch`` calls: one write, one read, one connection checkout for all of them instead of
one each. Each script is still atomic on its own (a plain pipeline, not MULTI), and each caller gets its own reply or
its own error; a call whose arguments cannot be sent (a ``str`` UTF-8 cannot encode) is left out of the write and fails
alone with ``UnsendableCallError``, the others go through. A caller cancelled while its call is still queued takes it
out: nothing is sent for it. Used on a standalone Redis only: redis-py's cluster pipelines refuse EVALSHA.

Prepares (``lua/prepare_half.lua``) and ends (``lua/end_transaction.lua``) of transactions in one pipeline with the
same KEYS (one topic partition) and the same number of arguments go out as one call of ``lua/prepare_halves.lua`` /
``lua/end_transactions.lua``, up to ``MAX_PER_BATCH_CALL`` per call: the same rules applied to each in turn (the
same Lua fragments, with the indexes read and written once per batch), one reply per call, each caller's own reply
or error taken from it. A batch of prepares wakes the
topic in the checkers' schedule as the prepares one by one would: the first into an empty ``unchecked`` wakes it,
the others do not. One script invocation per batch instead of one per call is what the server saves (its CPU per
transaction, ``bench/server_cpu.py``); every prepare and every end is idempotent, so a repeat of the batch (a
connection error, NOSCRIPT) applies none twice.

On a client with redis-py's own pool and connections, a batch is one EVALSHA per call packed by hiredis and written
on a connection checked out of that pool (its ``max_connections`` and readiness check apply), read back reply by
reply: redis-py's pipeline would first send SCRIPT EXISTS (one more round trip per batch) and pack in Python, which
took a third of an asyncio send's time. NOSCRIPT is answered by loading the script and sending those calls again,
and a connection error by one more attempt on a new socket (every script is idempotent, so nothing applies twice).
Another client (a custom pool or connection class) goes through redis-py's pipeline.

With a durability level the confirming ``WAIT`` / ``WAITAOF`` ends each batch, on the same connection: one wait confirms
every call of the batch (``redis_txmq.core.durability``). When it falls short, or the batch had to be sent again, each
caller whose script ran gets [`DurabilityError`][redis_txmq.core.errors.DurabilityError] with its reply.

Asyncio only, and not generated: the sync shell's twin is ``redis_txmq.transport.direct.ScriptRunner`` (a connection per
sending thread; threads do not share a pipeline). Both write through ``redis_txmq.sync.wire``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.sentinel

from ..core.batching import MAX_PER_BATCH_CALL, ScriptCall, batch_scripts, coalesce, spread, unsendable
from ..core.clients import REDIRECTIONS, REDIS_ERRORS, connection_errors, is_async_cluster
from ..core.durability import Durability
from ..core.errors import DurabilityError
from ..transport.connection import hiredis_packer
from .wire import run_scripts

_Call = tuple[Any, Sequence[Any], Sequence[Any], "asyncio.Future[Any]"]
MAX_ENDS_PER_CALL = MAX_PREPARES_PER_CALL = MAX_PER_BATCH_CALL
_DIRECT_POOLS = (
    redis.asyncio.ConnectionPool,
    redis.asyncio.BlockingConnectionPool,
    redis.asyncio.sentinel.SentinelConnectionPool,
)
_DIRECT_CONNECTIONS = (redis.asyncio.Connection, redis.asyncio.UnixDomainSocketConnection)


class ScriptLane:
    """Sends queued ``(script, keys, args)`` calls of one client in pipelines, one pipeline at a time.
    ``coalesce_prepares`` / ``coalesce_ends``: prepares / ends to the same KEYS in one pipeline go as one
    ``prepare_halves`` / ``end_transactions`` call (False: each as its own call, what ``bench/server_cpu.py``
    compares against)."""

    def __init__(
        self,
        client: Any,
        max_batch: int = 256,
        durability: Durability | None = None,
        coalesce_ends: bool = True,
        coalesce_prepares: bool = True,
    ) -> None:
        self.client = client
        self.max_batch = max_batch
        self.durability = durability
        self.coalesce_ends = coalesce_ends
        self.coalesce_prepares = coalesce_prepares
        self._queue: list[_Call] = []
        self._sender: asyncio.Task[None] | None = None
        pool = getattr(client, "connection_pool", None)
        self._pool = (
            pool if type(pool) in _DIRECT_POOLS and issubclass(pool.connection_class, _DIRECT_CONNECTIONS) else None
        )
        self._pack = hiredis_packer(pool.connection_kwargs) if self._pool is not None else None
        # redis-py reconnects lazily in send_packed_command, past the override by which a Sentinel-managed
        # connection asks the Sentinels for the master: after a disconnect, connect() first
        self._connect_first = isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool)
        # the prepare and end scripts are known by their digests (those of the text every broker registers); their
        # batch scripts are loaded on first use (NOSCRIPT)
        self._prepare_batches = batch_scripts(client, ends=False)
        self._end_batches = batch_scripts(client, prepares=False)

    async def call(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The script's reply; raises what the call raised (a connection error fails every call of its pipeline)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((script, keys, args, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all())
        return await future

    async def _send_all(self) -> None:
        while self._queue:
            batch = [call for call in self._queue[: self.max_batch] if not call[3].cancelled()]
            del self._queue[: self.max_batch]
            if batch:
                await self._send(batch)

    def _coalesce(self, batch: list[_Call]) -> tuple[list[ScriptCall], list[Any] | None]:
        """The calls to write for ``batch`` and what each carries (``redis_txmq.core.batching.coalesce``), the
        prepares and the ends coalesced as the lane's flags say."""
        batched = {
            **(self._prepare_batches if self.coalesce_prepares else {}),
            **(self._end_batches if self.coalesce_ends else {}),
        }
        return coalesce([(script, keys, args) for script, keys, args, _ in batch], batched)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            calls, spans = self._coalesce(batch)
            if self._pool is not None:
                wire_replies, confirmation = await self._exchange_checked_out(calls)
            else:
                wire_replies, confirmation = await self._exchange_pipelined(calls)
            replies = wire_replies if spans is None else spread(wire_replies, spans, len(batch))
        except Exception as exc:  # noqa: BLE001 - a connection error or a fault here: each caller learns it
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # cancelled while sending: the callers learn it, and the lane goes on
            for *_, future in batch:
                if not future.done():
                    future.set_exception(asyncio.CancelledError())
            raise
        durability = self.durability
        unconfirmed = None if durability is None or durability.confirmed(confirmation) else durability
        for (*_, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            elif unconfirmed is not None:
                future.set_exception(unconfirmed.error(confirmation, [reply]))
            else:
                future.set_result(reply)

    async def _exchange_pipelined(self, calls: list[ScriptCall]) -> tuple[list[Any], Any]:
        """Through redis-py's pipeline, which packs every command at once: a call that cannot be sent is left out
        first, its error in its reply's place (the wire does the same on the direct path)."""
        replies: list[Any] = [unsendable(keys, args) for _, keys, args in calls]
        # `async with`: redis-py gives the connection back to the pool even when the SCRIPT EXISTS it sends
        # before the pipeline fails (without it, each connection error there leaked one pooled connection)
        async with self.client.pipeline(transaction=False) as pipe:
            for (script, keys, args), refused in zip(calls, replies, strict=True):
                if refused is None:
                    await script(keys=keys, args=args, client=pipe)
            if self.durability is not None:
                pipe.execute_command(*self.durability.command)
            sent = iter(await pipe.execute(raise_on_error=False))
        confirmation = None
        replies = [next(sent) if refused is None else refused for refused in replies]
        if self.durability is not None:
            confirmation = next(sent)
        return replies, confirmation

    async def _exchange_checked_out(self, calls: list[ScriptCall]) -> tuple[list[Any], Any]:
        """The replies and the confirmation's reply (None when it cannot count: the batch was sent twice)."""
        pool = self._pool
        conn = await pool.get_connection()
        try:
            return await run_scripts(
                conn, calls, pack=self._pack, durability=self.durability, connect_first=self._connect_first
            )
        finally:
            await pool.release(conn)  # a connection interrupted mid-exchange was disconnected by redis-py


class AsyncScriptRunner:
    """Calls redis-py ``AsyncScript`` objects one at a time (``run``) or many at once (``run_many``): the
    asyncio twin of ``redis_txmq.transport.direct.ScriptRunner``, with the same replies and errors. On a standalone
    Redis every call goes through a ``ScriptLane``, so calls made together share pipelines; on a cluster a call goes to
    the master that owns its slot (with its confirmation, under a durability level)."""

    def __init__(self, client: Any, *, durability: Durability | None = None) -> None:
        self.client = client
        self.durability = durability
        self._lane = None if is_async_cluster(client) else ScriptLane(client, durability=durability)

    async def run(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """EVALSHA ``script``; returns the reply, raises ``redis.RedisError`` (or
        [`DurabilityError`][redis_txmq.core.errors.DurabilityError])."""
        with connection_errors():
            if self._lane is not None:
                return await self._lane.call(script, keys, args)
            refused = unsendable(keys, args)  # as the lane's wire refuses it: alone, with its own error
            if refused is not None:
                raise refused
            if self.durability is None:
                return await script(keys=keys, args=args)
            return await self._run_on_master(script, keys, args)

    async def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Every call at once (a lane sends them in one pipeline; each script is atomic on its own). Returns one reply
        per call, in order, a refused call's ``redis.ResponseError`` in its place (on a cluster, a call whose master
        failed has its error in its place too: the others went on); a connection error of the lane is raised, and a
        confirmation that fell short raises [`DurabilityError`][redis_txmq.core.errors.DurabilityError] carrying every
        reply."""
        outcomes = await asyncio.gather(*(self.run(*call) for call in calls), return_exceptions=True)
        replies: list[Any] = []
        unconfirmed: DurabilityError | None = None
        for outcome in outcomes:
            if isinstance(outcome, DurabilityError):
                unconfirmed = unconfirmed or outcome
                replies.append(outcome.replies[0] if outcome.replies else None)
            elif not isinstance(outcome, BaseException) or isinstance(outcome, redis.ResponseError):
                replies.append(outcome)
            elif self._lane is None and isinstance(outcome, REDIS_ERRORS):
                replies.append(outcome)
            else:
                raise outcome
        if unconfirmed is not None:
            raise DurabilityError(str(unconfirmed), replies=replies)
        return replies

    async def close(self) -> None:
        """Nothing to release: the lane checks connections out of the client's pool."""

    async def _run_on_master(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """On a cluster with a durability level: the script and its confirmation in one write (the wire's) on one
        connection of the master that owns the slot. A redirection or an unreachable master sends the call through
        the cluster client (which follows MOVED and refreshes its map); such a call cannot be confirmed
        (DurabilityError)."""
        durability = self.durability
        assert durability is not None
        try:
            node = self.client.get_node_from_key(keys[0])
            conn = node.acquire_connection()
            healthy = False
            try:
                (reply,), confirmation = await run_scripts(
                    conn, [(script, keys, args)], pack=hiredis_packer(node.connection_kwargs), durability=durability
                )
                healthy = True
            finally:
                if not healthy:  # an exchange cut short may leave replies unread on the socket
                    await conn.disconnect()
                node.release(conn)
        except REDIS_ERRORS as exc:
            if isinstance(exc, redis.ResponseError) and not isinstance(exc, REDIRECTIONS):
                raise
            reply, confirmation = await script(keys=keys, args=args), None
        if isinstance(reply, REDIRECTIONS):
            reply, confirmation = await script(keys=keys, args=args), None
        if isinstance(reply, Exception):
            raise reply
        if not durability.confirmed(confirmation):
            raise durability.error(confirmation, [reply])
        return reply
