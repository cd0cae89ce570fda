"""The primitives in which an asyncio I/O shell and its generated sync twin differ, side by side.

The sync shells (``redis_txmq/sync/consumer.py``...) are generated from the asyncio ones (``redis_txmq/asyncio/``) by
``scripts/unasync.py``, which renames ``AsyncX`` to ``X`` and ``async_x`` to ``x``: an asyncio shell uses the
``Async`` names of this module, and its sync twin gets the others. Each pair keeps one meaning: what a shell asks
of a primitive is the same in both worlds (an event's ``wait`` takes a timeout and says whether it was set).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

from ..core.errors import ConfigurationError

logger = logging.getLogger(__name__)

Event = threading.Event
"""``wait(timeout)`` returns whether it was set; ``set``, ``is_set``; thread-safe."""

Lock = threading.Lock
AsyncLock = asyncio.Lock
"""``with lock`` / ``async with lock``."""


class AsyncEvent:
    """``threading.Event``'s surface on asyncio: ``await wait(timeout)`` returns whether it was set."""

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
    """A sync shell calls plain functions only: the value itself; an awaitable (a coroutine function passed where a
    plain one belongs) is refused, never dropped unawaited as if it had run."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise ConfigurationError(
            "a callback returned an awaitable, which a sync API cannot await: pass a plain function, or use the "
            "redis_txmq.asyncio API"
        )
    return value


def async_refuse_coroutine_function(function: Any, where: str) -> None:
    """An asyncio shell takes ``async def`` callbacks and plain ones alike."""


def refuse_coroutine_function(function: Any, where: str) -> None:
    """A sync shell refuses an ``async def`` callback at once (its result would never run)."""
    if inspect.iscoroutinefunction(function):
        raise ConfigurationError(
            f"{where}: {getattr(function, '__name__', function)!r} is an async def function, which a sync API cannot "
            "await: pass a plain function, or use the redis_txmq.asyncio API"
        )


Condition = threading.Condition
"""``with cond``; ``wait(timeout)`` and ``wait_for(predicate, timeout)`` return whether they were woken or the
predicate holds; ``notify_all``."""


class AsyncCondition:
    """``threading.Condition``'s surface on asyncio: ``async with cond``, ``await cond.wait(timeout)``,
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


def _weak(method: Callable[..., Any]) -> Callable[[], Callable[..., Any] | None]:
    """A weak reference to a bound method (a plain function is held as it is)."""
    if inspect.ismethod(method):
        return weakref.WeakMethod(method)
    return lambda: method


class Periodic:
    """Calls ``method`` every ``interval`` seconds on a daemon thread of its own, beside whatever the caller's thread
    is doing, until ``stop``. The method's object is held weakly: an object dropped without being closed is collected,
    and its calls end, as if its process had died. What ``method`` raises is logged; the calls go on."""

    def __init__(self, method: Callable[[], Any], interval: float, name: str) -> None:
        self._method = _weak(method)
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval):
            method = self._method()
            if method is None:
                return
            try:
                method()
            except Exception:
                logger.exception("%s failed; called again in %.1f s", self._thread.name, self._interval)
            del method

    def stop(self, timeout: float) -> bool:
        """No call after the one under way, which is waited for up to ``timeout`` seconds; whether none is left."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()


class AsyncPeriodic:
    """``Periodic`` on asyncio: awaits ``method()`` every ``interval`` seconds in a task of its own; ``await
    stop(timeout)`` cancels a call still under way after ``timeout``."""

    def __init__(self, method: Callable[[], Coroutine[Any, Any, Any]], interval: float, name: str) -> None:
        self._method = _weak(method)
        self._interval = interval
        self._name = name
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self._name)

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self._interval)
            if self._stopped.is_set():
                return
            method = self._method()
            if method is None:
                return
            try:
                await method()
            except Exception:
                logger.exception("%s failed; called again in %.1f s", self._name, self._interval)
            del method

    async def stop(self, timeout: float) -> bool:
        self._stopped.set()
        task = self._task
        if task is None or task.done() or task is asyncio.current_task():
            return True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), timeout)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return True


class WorkerPool:
    """Runs calls on at most ``size`` threads, one per key at a time; the keys in hand are the calls queued or
    running. ``shutdown`` lets the running calls finish and returns the keys of those that never started."""

    def __init__(self, size: int, name: str) -> None:
        self._executor = ThreadPoolExecutor(size, thread_name_prefix=name)
        self._in_hand: dict[str, Future[Any]] = {}
        self._room = threading.Condition()

    def submit(self, key: str, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` unless a call of ``key`` is in hand already."""
        with self._room:
            if key in self._in_hand:
                return
            future = self._executor.submit(function, *args)
            self._in_hand[key] = future
        future.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: str, future: Future[Any]) -> None:
        with self._room:
            if self._in_hand.get(key) is future and not future.cancelled():
                del self._in_hand[key]
            self._room.notify_all()

    def wait_for_room(self, limit: int, timeout: float) -> int:
        """How many more calls may be in hand below ``limit``; waits up to ``timeout`` while none may."""
        with self._room:
            self._room.wait_for(lambda: len(self._in_hand) < limit, timeout)
            return max(0, limit - len(self._in_hand))

    def shutdown(self) -> list[str]:
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._room:
            return [key for key, future in self._in_hand.items() if future.cancelled()]


class AsyncWorkerPool:
    """``WorkerPool`` on asyncio: a task per call, at most ``size`` running at once (the others wait)."""

    def __init__(self, size: int, name: str) -> None:
        self._slots = asyncio.Semaphore(size)
        self._name = name
        self._in_hand: dict[str, asyncio.Task[Any]] = {}
        self._started: set[str] = set()

    def submit(self, key: str, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        if key in self._in_hand:
            return
        task = asyncio.create_task(self._run(key, function, *args), name=f"{self._name}-{key}")
        self._in_hand[key] = task
        task.add_done_callback(functools.partial(self._done, key))

    async def _run(self, key: str, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        async with self._slots:
            self._started.add(key)
            await function(*args)

    def _done(self, key: str, task: asyncio.Task[Any]) -> None:
        if self._in_hand.get(key) is task:
            del self._in_hand[key]
            self._started.discard(key)

    async def wait_for_room(self, limit: int, timeout: float) -> int:
        if len(self._in_hand) >= limit:
            await asyncio.wait(list(self._in_hand.values()), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return max(0, limit - len(self._in_hand))

    async def shutdown(self) -> list[str]:
        waiting = [key for key in self._in_hand if key not in self._started]
        for key in waiting:
            self._in_hand[key].cancel()
        await asyncio.gather(*list(self._in_hand.values()), return_exceptions=True)
        return waiting


class Background:
    """Work that outlives the call that started it: on asyncio a task that a shutdown waits for; a sync call has
    run by the time it is handed here (nothing runs in the background), so this only passes its value on."""

    def spawn(self, value: Any) -> Any:
        return value

    def wait(self) -> None:
        """Nothing is under way."""


class AsyncBackground:
    """Tasks started by calls that may be cancelled (an end call under way, a failed send's marking); ``wait``
    waits for those still running (a producer's shutdown)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def spawn(self, work: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def async_shield(work: Any) -> Any:
    """``asyncio.shield``: the work goes on when the caller is cancelled."""
    return await asyncio.shield(work)


def shield(value: Any) -> Any:
    """A sync call cannot be cancelled half-way: its value, as it is."""
    return value


AsyncCancelled = asyncio.CancelledError
"""What a cancelled asyncio call raises."""


class Cancelled(BaseException):
    """Never raised: a sync call is not cancelled (the twin of ``asyncio.CancelledError`` in generated code)."""
