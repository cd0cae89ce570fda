"""One-way end: RocketMQ's ``endTransactionOneway`` with the batching of its 5.x op writes.

A one-way producer returns from a send right after the local transaction and leaves the end call to an
:class:`EndFlusher`, which sends queued ends in pipelines (each end is still one atomic script call). An end
that never reaches Redis (the process died with it queued, or Redis was unreachable) changes nothing in
the guarantees: the half message stays in flight and the check-back resolves it.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time

from .broker import RedisBroker
from .config import Settings
from .errors import ProducerStateError, TxMQError
from .protocol import EndCall, EndResult

logger = logging.getLogger(__name__)


class EndFlusher:
    """Queues end calls and applies them in batches from one background thread. Thread-safe."""

    def __init__(self, broker: RedisBroker, settings: Settings, name: str) -> None:
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
        # ends are sent in the order they were queued, by one thread: counters are enough to know what is done
        self._submitted = 0
        self._completed = 0
        self._flushes_waiting = 0
        self._closing = False
        self._cond = threading.Condition()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name=f"txmq-end-flusher-{name}", daemon=True)

    @property
    def pending(self) -> int:
        """Ends queued or being sent."""
        return self._submitted - self._completed

    def start(self) -> None:
        self._thread.start()

    def submit(self, end: EndCall) -> None:
        """Queue an end; waits while ``end_queue_size`` ends are pending."""
        if os.getpid() != self._pid:
            # a forked child has the queue but not the thread: its ends would wait forever
            raise ProducerStateError(
                f"producer group {end.producer_group!r}, transaction {end.transaction_id}: this one-way producer "
                "was created in another process (before a fork); create the producer in the child. The check-back "
                "will resolve this transaction"
            )
        with self._cond:
            while self._submitted - self._completed >= self.queue_size and not self._closing:
                self._cond.wait()
            if self._closing:
                raise closing_error(end)
            self._queue.append(end)
            self._submitted += 1
            if len(self._queue) == 1 or len(self._queue) >= self.batch_size:
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every end queued before this call has been sent (ends other threads queue meanwhile are not
        waited for); False if ``timeout`` passed first."""
        if os.getpid() != self._pid:
            return self._submitted == self._completed  # nothing the child queued; what the parent queued is its own
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._submitted
            self._flushes_waiting += 1
            self._cond.notify_all()
            try:
                while self._completed < target:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._flushes_waiting -= 1

    def close(self, timeout: float | None = None) -> bool:
        """Send what is queued, then stop the thread; False if ``timeout`` passed with ends still queued."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _next_batch(self) -> list[EndCall] | None:
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            deadline = time.monotonic() + self.batch_delay
            while len(self._queue) < self.batch_size and not self._closing and not self._flushes_waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            count = min(self.batch_size, len(self._queue))
            return [self._queue.popleft() for _ in range(count)]

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self._send(batch)
            finally:
                with self._cond:
                    self._completed += len(batch)
                    self._cond.notify_all()

    def _send(self, batch: list[EndCall]) -> None:
        try:
            results: list[EndResult | TxMQError] | Exception = self.broker.end_transactions(batch)
        except Exception as exc:  # noqa: BLE001 - the flusher thread must outlive any failure; the checker resolves
            results = exc
        applied, failed = account_batch(self.name, batch, results)
        self.applied += applied
        self.failed += failed


def account_batch(name: str, batch: list[EndCall], results: list[EndResult | TxMQError] | Exception) -> tuple[int, int]:
    """Log what a batch of queued ends did; returns (applied, failed). A failed end stays in flight and the
    check-back resolves it."""
    if isinstance(results, Exception):
        logger.warning(
            "producer group %s: %d queued ends failed (%s); the check-back will resolve them (first: tx=%s)",
            name,
            len(batch),
            results,
            ", ".join(end.transaction_id for end in batch[:5]),
        )
        return 0, len(batch)
    failed = 0
    for end, result in zip(batch, results, strict=True):
        if isinstance(result, TxMQError):
            failed += 1
            logger.warning(
                "tx=%s topic=%s one-way end %s failed: %s",
                end.transaction_id,
                end.keys.topic,
                end.outcome.value,
                result,
            )
    return len(batch) - failed, failed


def closing_error(end: EndCall) -> ProducerStateError:
    return ProducerStateError(
        f"producer group {end.producer_group!r}, transaction {end.transaction_id}: the producer is shutting down; "
        "the check-back will resolve this transaction"
    )
