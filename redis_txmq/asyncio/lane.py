"""Concurrent script calls coalesced into one pipeline: what lets many sends in flight cost less than one each.

Every call made while a pipeline is being sent (or in the same turn of the event loop) waits in the queue and goes
out with the next one, up to ``max_batch`` calls: one write, one read, one connection checkout for all of them
instead of one each. Each script is still atomic on its own (a plain pipeline, not MULTI), and each caller gets its
own reply or its own error. A caller cancelled while its call is still queued takes it out: nothing is sent for it.
Used on a standalone Redis only: redis-py's cluster pipelines refuse EVALSHA.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..connection import REDIS_ERRORS

_Call = tuple[Any, Sequence[Any], Sequence[Any], "asyncio.Future[Any]"]


class ScriptLane:
    """Sends queued ``(script, keys, args)`` calls of one client in pipelines, one pipeline at a time."""

    def __init__(self, client: Any, max_batch: int = 256) -> None:
        self.client = client
        self.max_batch = max_batch
        self._queue: list[_Call] = []
        self._sender: asyncio.Task[None] | None = None

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

    async def _send(self, batch: list[_Call]) -> None:
        try:
            # `async with`: redis-py gives the connection back to the pool even when the SCRIPT EXISTS it sends
            # before the pipeline fails (without it, each connection error there leaked one pooled connection)
            async with self.client.pipeline(transaction=False) as pipe:
                for script, keys, args, _ in batch:
                    await script(keys=keys, args=args, client=pipe)
                replies = await pipe.execute(raise_on_error=False)
        except (*REDIS_ERRORS, OSError) as exc:
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException as exc:  # cancelled while sending: the callers learn it, and the lane goes on
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            raise
        for (*_, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)
