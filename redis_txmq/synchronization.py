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
from typing import Any

Event = threading.Event
"""``wait(timeout)`` returns whether it was set; ``set``, ``is_set``; thread-safe."""


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
