"""The primitives in which an asyncio I/O shell and its generated sync twin differ, side by side.

The sync shells (``redis_txmq/consumer.py``...) are generated from the asyncio ones (``redis_txmq/asyncio/``) by
``scripts/unasync.py``, which renames ``AsyncX`` to ``X`` and ``async_x`` to ``x``: an asyncio shell uses the
``Async`` names of this module, and its sync twin gets the others. Each pair keeps one meaning: what a shell asks
of a primitive is the same in both worlds (an event's ``wait`` takes a timeout and says whether it was set).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

Event = threading.Event
"""``wait(timeout)`` returns whether it was set; ``set``, ``is_set``; thread-safe."""

Lock = threading.Lock
AsyncLock = asyncio.Lock
"""``with lock`` / ``async with lock``."""


class AsyncEvent:
    """:class:`threading.Event`'s surface on asyncio: ``await wait(timeout)`` returns whether it was set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set()


async def async_maybe_await(value: Any) -> Any:
    """The value, awaited when it is awaitable: a user's callback may be an ``async def`` or a plain function."""
    return (await value) if inspect.isawaitable(value) else value


def maybe_await(value: Any) -> Any:
    """A sync shell calls plain functions only: the value itself."""
    return value


Condition = threading.Condition
"""``with cond``; ``wait(timeout)`` and ``wait_for(predicate, timeout)`` return whether they were woken or the
predicate holds; ``notify_all``."""


class AsyncCondition:
    """:class:`threading.Condition`'s surface on asyncio: ``async with cond``, ``await cond.wait(timeout)``,
    ``await cond.wait_for(predicate, timeout)`` (both return False when the timeout passed), ``notify_all()``."""

    def __init__(self) -> None:
        self._condition = asyncio.Condition()

    async def __aenter__(self) -> AsyncCondition:
        await self._condition.acquire()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._condition.release()

    def notify_all(self) -> None:
        self._condition.notify_all()

    async def wait(self, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self._condition.wait(), timeout)  # the lock is held again on a timeout too
        except asyncio.TimeoutError:
            return False
        return True

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            await self.wait(remaining)
        return True


class Worker:
    """A function run in a daemon thread of its own: ``start()``, then ``join(timeout)`` says whether it ended."""

    def __init__(self, target: Callable[[], Any], name: str) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()


class AsyncWorker:
    """A coroutine function run as a task of its own: ``start()``, then ``await join(timeout)`` says whether it
    ended (a timeout leaves it running)."""

    def __init__(self, target: Callable[[], Coroutine[Any, Any, Any]], name: str) -> None:
        self._target = target
        self._name = name
        self._task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._target(), name=self._name)

    async def join(self, timeout: float | None = None) -> bool:
        if self._task is None:
            return True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        return self._task.done()
