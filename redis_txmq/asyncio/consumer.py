"""The consumer's I/O shell: performs the effects of ``redis_txmq.core.consuming.ConsumerProtocol``'s steps.

The steps and their decisions (what is sent, how replies are read, retries, the error messages) are written once in
``redis_txmq.core.consuming``; this module only performs them: the Redis calls, the pauses, the user's handler. The
asyncio consumer's module is the source, and the sync consumer's is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

from ..core import tracing
from ..core.clients import connection_errors
from ..core.config import Settings
from ..core.consuming import (
    HEARTBEAT_STOP_WAIT,
    SETUP_ERRORS,
    Command,
    ConsumerProtocol,
    Driver,
    Effect,
    Heartbeat,
    Pause,
    Steps,
    T,
)
from ..core.entries import ConsumedMessage
from ..transport.connection import resolve_client
from ..transport.synchronization import AsyncEvent, AsyncPeriodic, async_maybe_await, async_refuse_coroutine_function
from .preload import preload

logger = logging.getLogger(__name__)


class Consumer(ConsumerProtocol):
    """Reads one topic through a consumer group; each message goes to one consumer of the group::

        async with Consumer("orders", "billing", redis_url=url) as consumer:
            async for message in consumer:
                await bill(message)
                await consumer.ack(message)

    Pass ``redis_url`` or ``client`` (a ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``).
    A consumer holds the messages it read under a lease that a heartbeat renews every
    ``settings.heartbeat_interval`` seconds beside the handler, however long the handler takes (on asyncio the
    heartbeat is a task: a handler that blocks the event loop blocks it too). The unacked messages of a consumer
    that died (its lease ran out, three intervals after its last beat) are claimed by a live one once idle
    ``min_idle_time`` seconds, those of a consumer that stopped at once, and the gone consumer's name is then
    removed from the group; a consumer's own unacked messages come back to it after ``min_idle_time``. A live
    consumer's messages are never taken. A message delivered more than ``max_deliveries`` times
    moves to the group's dead-letter stream (``txmq:{<topic>}:consumer-dead:<group>``) with its reason instead of
    being delivered again. ``start_id`` is where a new group starts: ``"0"`` (default, nothing committed is missed)
    or ``"$"``; a group that Redis lost (restart without persistence, failover to a lagging replica) is created
    again from ``start_id`` too.

    The group is set up by [`start`][redis_txmq.asyncio.consumer.Consumer.start] (``with`` calls it; the sync consumer's
    constructor too, so that a consumer that cannot reach Redis is not made), which raises
    [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when Redis cannot be reached. Iteration and
    [`run`][redis_txmq.asyncio.consumer.Consumer.run] ride out dropped connections and restarts, retrying with backoff
    until ``stop``; the other methods raise [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when
    Redis fails. On asyncio, a call that is cancelled (``task.cancel()``, a timeout) leaves the consumer usable; a
    message read by a cancelled poll is re-delivered after ``min_idle_time``.
    """

    _logger = logger
    _asyncio = True  # async-only
    # sync-only: _asyncio = False
    _event_type = AsyncEvent
    _started = False
    _heartbeat: AsyncPeriodic | None = None

    def _created(self) -> None:
        """The sync consumer starts in its constructor; the asyncio one does no I/O there."""
        # sync-only: self._start_or_close()

    def _client_of(self, redis_url: str | None, client: Any, settings: Settings | None) -> tuple[Any, Settings, bool]:
        return resolve_client(redis_url, client, settings, asyncio=self._asyncio)

    async def _drive(self, steps: Steps[T]) -> T:
        with Driver(steps) as driver:
            for effect in driver:
                with driver.outcome():
                    driver.reply = await self._perform(effect)
        return driver.result

    async def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, Command):
            with connection_errors():
                return await effect.apply(self.client, self._scripts)
        if isinstance(effect, Pause):
            return await self._stop.wait(effect.seconds)
        if isinstance(effect, Heartbeat):
            return await self._switch_heartbeat(effect.running)
        message = effect.message
        with tracing.span_for(
            "process",
            message.topic,
            transaction_id=message.transaction_id,
            group=self.group,
            properties=message.properties,
        ):
            return await async_maybe_await(effect.handler(message))

    async def _switch_heartbeat(self, running: bool) -> None:
        if running:
            if self._heartbeat is None:
                name = f"txmq-consumer-heartbeat-{self.consumer_name}"
                self._heartbeat = AsyncPeriodic(self._beat, self.settings.heartbeat_interval, name)
                self._heartbeat.start()
            return
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            await heartbeat.stop(HEARTBEAT_STOP_WAIT)

    async def _beat(self) -> None:
        await self._drive(self._heartbeat_steps())

    async def start(self) -> Consumer:
        """Read the topic's partitions, create the group on each where it is missing, load the scripts, take the
        lease and start its heartbeat; once.

        Raises [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when Redis cannot be reached."""
        if self._started:
            return self
        try:
            await self._drive(self._ready_steps())
            await preload(*self._scripts.values())
            await self._drive(self._lease_steps())
        except SETUP_ERRORS as exc:
            raise self._setup_error(exc) from exc
        self._started = True
        return self

    async def _start_or_close(self) -> Consumer:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def poll(self, timeout: float | None = None) -> list[ConsumedMessage]:
        """Up to ``batch_size`` messages: abandoned ones first, then new ones (waiting up to ``timeout``, ``block``
        when None).

        Raises [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when Redis cannot be reached
        (iteration and [`run`][redis_txmq.asyncio.consumer.Consumer.run] retry instead). A consumer group that Redis
        lost is created again from ``start_id``."""
        return await self._drive(self._poll_steps(timeout))

    async def ack(self, message: ConsumedMessage) -> None:
        """Mark the message processed; an unacked message is re-delivered after ``min_idle_time``.

        Raises [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when Redis fails: the message stays
        pending."""
        await self._drive(self._ack_steps(message))

    async def dead_letter(self, message: ConsumedMessage, reason: str) -> bool:
        """Give up on a message now: move it to the dead-letter stream with ``reason`` (and ack it); False if it
        was not pending any more."""
        return await self._drive(self._dead_letter_steps(message, reason))

    async def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, bytes]]]:
        """Up to ``count`` entries of each partition's dead-letter stream, oldest first, as ``(entry id, fields)``."""
        return await self._drive(self._dead_letters_steps(count))

    async def delete_group(self) -> None:
        """Remove this consumer group from every partition (its position and pending entries are gone), and stop
        this consumer. Stop the group's other consumers first: one still reading creates the group again."""
        await self._drive(self._delete_group_steps())

    async def __aiter__(self) -> AsyncIterator[ConsumedMessage]:
        """Messages until ``stop`` or [`close`][redis_txmq.asyncio.consumer.Consumer.close]; the caller acks each one.
        Once stopped, no further message is given, and those read and not given yet are handed back.

        A dropped connection, a restart or a failover does not end the loop: it is logged and the read is retried
        with backoff (0.1 s doubling to 5 s)."""
        while (message := await self._next_message()) is not None:
            yield message
        await self._drive(self._release_steps())

    async def _next_message(self) -> ConsumedMessage | None:
        self._busy = True
        try:
            message = await self._drive(self._next_message_steps())
        finally:
            self._busy = False
        if self._closed:  # closed while it was chosen: it goes back with the rest, and the close is finished here
            if message is not None:
                self._unhandled.insert(0, message)
            await self._close_now()
            return None
        return message

    async def run(self, handler: Callable[[ConsumedMessage], Any], *, max_messages: int | None = None) -> int:
        """Call ``handler`` for each message and ack it when the handler returns; a handler that raises leaves
        the message pending for re-delivery. Returns how many were handled, when stopped (once the message in hand
        is handled; the rest of the batch is handed back to the group) or at ``max_messages``. A message another
        consumer took over meanwhile is not handed to ``handler``. Lost connections are retried with backoff, as
        in iteration; so is the ack.

        On asyncio, ``handler`` may be a coroutine function (awaited) or a plain function, which is called on the event
        loop: keep it quick, or hand blocking work to a thread (``asyncio.to_thread``). The sync consumer takes plain
        functions only (a coroutine function raises
        [`ConfigurationError`][redis_txmq.core.errors.ConfigurationError])."""
        async_refuse_coroutine_function(handler, f"{self._where}: run()")
        self._busy = True
        try:
            return await self._drive(self._run_steps(handler, max_messages))
        finally:
            self._busy = False
            if self._closed:  # close() came while it ran: hand back and close now that nothing is in hand
                await self._close_now()

    async def close(self) -> None:
        """Stop, hand back what this consumer holds (another consumer takes it at once), and close the client if
        this consumer made it (from ``redis_url``). While [`run`][redis_txmq.asyncio.consumer.Consumer.run] is under way
        (or iteration is choosing its next message), it does both once its message in hand is handled and acked."""
        self.stop()
        self._closed = True
        if not self._busy:
            await self._close_now()

    async def _close_now(self) -> None:
        if self._close_done:  # run() and close() from two threads may both get here
            return
        self._close_done = True
        await self._drive(self._release_steps())
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> Consumer:
        return await self._start_or_close()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
