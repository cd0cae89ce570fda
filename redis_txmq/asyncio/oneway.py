"""One-way end: RocketMQ's ``endTransactionOneway`` with the batching of its 5.x op writes.

A one-way producer returns from a send right after the local transaction and leaves the end call to an end flusher,
which sends queued ends in pipelines (each end is still one atomic script call) from one worker: a task of the
asyncio producer, a thread of the sync one. An end that never reaches Redis (the process died with it queued, or
Redis was unreachable) changes nothing in the guarantees: the half message stays in flight and the check-back
resolves it. The asyncio flusher's module is the source; the sync one's is generated from it by
``scripts/unasync.py``.
"""

from __future__ import annotations

import collections
import os
import time

from ..core.config import Settings
from ..core.protocol import EndCall
from ..core.sending import account_batch, closing_error, forked_error
from ..transport.synchronization import AsyncCondition, AsyncWorker
from .broker import AsyncRedisBroker


class AsyncEndFlusher:
    """Queues end calls and applies them in pipelines of at most ``end_batch_size`` from one worker, waiting at most
    ``end_batch_delay`` to fill one; a submit waits while ``end_queue_size`` ends are pending. Thread-safe (sync)."""

    def __init__(self, broker: AsyncRedisBroker, settings: Settings, name: str) -> None:
        self.broker = broker
        self.batch_size = settings.end_batch_size
        self.batch_delay = settings.end_batch_delay
        self.queue_size = settings.end_queue_size
        self.name = name
        self.applied = 0
        """Ends the flusher sent and Redis accepted (including repeats of an end already applied)."""
        self.failed = 0
        """Ends that failed (logged with their transaction id); the check-back resolves those transactions."""
        self._queue: collections.deque[EndCall] = collections.deque()
        # ends are sent in the order they were queued, by one worker: counters are enough to know what is done
        self._submitted = 0
        self._completed = 0
        self._flushes_waiting = 0
        self._closing = False
        self._cond = AsyncCondition()
        self._pid = os.getpid()
        self._worker = AsyncWorker(self._run, name=f"txmq-end-flusher-{name}")

    @property
    def pending(self) -> int:
        """Ends queued or being sent."""
        return self._submitted - self._completed

    def start(self) -> None:
        self._worker.start()

    async def submit(self, end: EndCall) -> None:
        """Queue an end; waits while ``end_queue_size`` ends are pending."""
        if os.getpid() != self._pid:  # a forked child has the queue but not the worker: its ends would wait forever
            raise forked_error(end)
        async with self._cond:
            if self._submitted - self._completed >= self.queue_size:  # the queue is full: wait for room
                await self._cond.wait_for(lambda: self.pending < self.queue_size or self._closing)
            if self._closing:
                raise closing_error(end)
            queue = self._queue
            queue.append(end)
            self._submitted += 1
            if len(queue) == 1 or len(queue) >= self.batch_size:
                self._cond.notify_all()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every end queued before this call has been sent (ends queued meanwhile are not waited for);
        False if ``timeout`` passed first."""
        if os.getpid() != self._pid:
            return self._submitted == self._completed  # nothing the child queued; what the parent queued is its own
        async with self._cond:
            target = self._submitted
            self._flushes_waiting += 1
            self._cond.notify_all()
            try:
                return await self._cond.wait_for(lambda: self._completed >= target, timeout)
            finally:
                self._flushes_waiting -= 1

    async def close(self, timeout: float | None = None) -> bool:
        """Send what is queued, then stop the worker; False if ``timeout`` passed with ends still queued."""
        async with self._cond:
            self._closing = True
            self._cond.notify_all()
        return await self._worker.join(timeout)

    async def _next_batch(self) -> list[EndCall] | None:
        async with self._cond:
            await self._cond.wait_for(lambda: bool(self._queue) or self._closing)
            if not self._queue:
                return None
            deadline = time.monotonic() + self.batch_delay
            while len(self._queue) < self.batch_size and not self._closing and not self._flushes_waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not await self._cond.wait(remaining):
                    break
            queue = self._queue
            if len(queue) <= self.batch_size:  # all of it, as one copy rather than a pop per end
                batch = list(queue)
                queue.clear()
                return batch
            return [queue.popleft() for _ in range(self.batch_size)]

    async def _run(self) -> None:
        while (batch := await self._next_batch()) is not None:
            try:
                try:
                    results = await self.broker.end_transactions(batch)
                except Exception as exc:  # noqa: BLE001 - the worker must outlive any failure; the checker resolves
                    applied, failed = account_batch(self.name, batch, exc)
                else:
                    applied, failed = account_batch(self.name, batch, results)
                self.applied += applied
                self.failed += failed
            finally:
                async with self._cond:
                    self._completed += len(batch)
                    self._cond.notify_all()
