"""One-way end on asyncio: the twin of :class:`redis_txmq.oneway.EndFlusher`, a task instead of a thread."""

from __future__ import annotations

import asyncio
import collections

from ..config import Settings
from ..oneway import account_batch, closing_error
from ..protocol import EndCall
from .broker import AsyncRedisBroker


class AsyncEndFlusher:
    """Queues end calls and applies them in pipelines of at most ``end_batch_size`` from one task, waiting at most
    ``end_batch_delay`` to fill one; a submit waits while ``end_queue_size`` ends are pending."""

    def __init__(self, broker: AsyncRedisBroker, settings: Settings, name: str) -> None:
        self.broker = broker
        self.batch_size = settings.end_batch_size
        self.batch_delay = settings.end_batch_delay
        self.queue_size = settings.end_queue_size
        self.name = name
        self.applied = 0
        self.failed = 0
        self._queue: collections.deque[EndCall] = collections.deque()
        self._submitted = 0
        self._completed = 0
        self._flushes_waiting = 0
        self._closing = False
        self._cond = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        return self._submitted - self._completed

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"txmq-end-flusher-{self.name}")

    async def submit(self, end: EndCall) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.pending < self.queue_size or self._closing)
            if self._closing:
                raise closing_error(end)
            self._queue.append(end)
            self._submitted += 1
            if len(self._queue) == 1 or len(self._queue) >= self.batch_size:
                self._cond.notify_all()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every end queued before this call has been sent; False if ``timeout`` passed first."""
        async with self._cond:
            target = self._submitted
            self._flushes_waiting += 1
            self._cond.notify_all()
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: self._completed >= target), timeout)
                return True
            except asyncio.TimeoutError:
                return False
            finally:
                self._flushes_waiting -= 1

    async def close(self) -> None:
        """Send what is queued, then stop the task."""
        async with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._task is not None:
            await self._task

    async def _next_batch(self) -> list[EndCall] | None:
        loop = asyncio.get_running_loop()
        async with self._cond:
            await self._cond.wait_for(lambda: bool(self._queue) or self._closing)
            if not self._queue:
                return None
            deadline = loop.time() + self.batch_delay
            while len(self._queue) < self.batch_size and not self._closing and not self._flushes_waiting:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(self._cond.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            count = min(self.batch_size, len(self._queue))
            return [self._queue.popleft() for _ in range(count)]

    async def _run(self) -> None:
        while (batch := await self._next_batch()) is not None:
            try:
                try:
                    results = await self.broker.end_transactions(batch)
                except Exception as exc:  # noqa: BLE001 - the flusher must outlive any failure; the checker resolves
                    applied, failed = account_batch(self.name, batch, exc)
                else:
                    applied, failed = account_batch(self.name, batch, results)
                self.applied += applied
                self.failed += failed
            finally:
                async with self._cond:
                    self._completed += len(batch)
                    self._cond.notify_all()
