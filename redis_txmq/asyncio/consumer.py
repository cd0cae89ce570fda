"""The asyncio consumer: :class:`redis_txmq.Consumer` on ``redis.asyncio``.

The steps and their decisions are :class:`redis_txmq.consuming.ConsumerProtocol`'s, shared with the sync
consumer; this module only awaits the Redis calls, the pauses and the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

from .. import tracing
from ..consuming import SETUP_ERRORS, Command, ConsumerProtocol, Driver, Effect, Pause, Steps, T
from ..entries import ConsumedMessage
from .scripts import preload

logger = logging.getLogger(__name__)


class Consumer(ConsumerProtocol):
    """Reads one topic through a consumer group, on a ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster`` client; the constructor options, the settings and the errors are those
    of :class:`redis_txmq.Consumer`::

        async with Consumer("orders", "billing", redis_url=url) as consumer:
            async for message in consumer:
                await bill(message)
                await consumer.ack(message)

    The constructor does no I/O: ``async with`` (or :meth:`start`) reads the topic's partitions and creates the
    group, and raises :class:`~redis_txmq.errors.TxMQConnectionError` when Redis cannot be reached; a consumer
    used without it does the same on its first call. A call that is cancelled (``task.cancel()``, a timeout)
    leaves the consumer usable; a message read by a cancelled poll is re-delivered after ``min_idle_time``.
    """

    _logger = logger
    _asyncio = True
    _event_type = asyncio.Event

    async def _drive(self, steps: Steps[T]) -> T:
        with Driver(steps) as driver:
            for effect in driver:
                with driver.outcome():
                    driver.reply = await self._perform(effect)
        return driver.result

    async def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, Command):
            return await effect.apply(self.client, self._scripts)
        if isinstance(effect, Pause):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), effect.seconds)
            return None
        message = effect.message
        with tracing.span_for(
            "process",
            message.topic,
            transaction_id=message.transaction_id,
            group=self.group,
            properties=message.properties,
        ):
            result = effect.handler(message)
            return (await result) if inspect.isawaitable(result) else result

    async def start(self) -> Consumer:
        """Read the topic's partitions, create the group on each where it is missing, load the scripts.

        Raises :class:`~redis_txmq.errors.TxMQConnectionError` when Redis cannot be reached."""
        try:
            await self._drive(self._ready_steps())
            await preload(*self._scripts.values())
        except SETUP_ERRORS as exc:
            raise self._setup_error(exc) from exc
        return self

    async def poll(self, timeout: float | None = None) -> list[ConsumedMessage]:
        """Up to ``batch_size`` messages, abandoned ones first; new ones are awaited up to ``timeout`` (``block``
        when None). Raises :class:`~redis_txmq.errors.TxMQConnectionError` when Redis fails."""
        return await self._drive(self._poll_steps(timeout))

    async def ack(self, message: ConsumedMessage) -> None:
        """Mark the message processed; when this raises, the message stays pending (re-delivered later)."""
        await self._drive(self._ack_steps(message))

    async def dead_letter(self, message: ConsumedMessage, reason: str) -> bool:
        """Move the message to the group's dead-letter stream with ``reason``, and ack it; False if it was not
        pending any more."""
        return await self._drive(self._dead_letter_steps(message, reason))

    async def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, bytes]]]:
        """Up to ``count`` dead letters of each partition, oldest first, as ``(entry id, fields)``."""
        return await self._drive(self._dead_letters_steps(count))

    async def delete_group(self) -> None:
        """Stop, and remove the group from every partition (stop its other consumers first)."""
        await self._drive(self._delete_group_steps())

    async def __aiter__(self) -> AsyncIterator[ConsumedMessage]:
        """Messages until :meth:`stop` or :meth:`close`, riding out outages with backoff; the caller acks each."""
        while (batch := await self._drive(self._batch_steps())) is not None:
            for message in batch:
                yield message

    async def run(
        self, handler: Callable[[ConsumedMessage], Awaitable[Any] | Any], *, max_messages: int | None = None
    ) -> int:
        """Give each message to ``handler`` and ack it when the handler returns; returns how many were handled.

        ``handler`` may be an ``async def`` (awaited) or a plain function, which is called on the event loop:
        keep it quick, or hand blocking work to a thread (``await asyncio.to_thread(...)`` in an async handler).
        A handler that raises leaves the message pending for re-delivery; outages are ridden out as in iteration."""
        return await self._drive(self._run_steps(handler, max_messages))

    async def close(self) -> None:
        """Stop, and close the client if this consumer made it (from ``redis_url``)."""
        self.stop()
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> Consumer:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
