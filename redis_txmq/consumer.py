"""Consumer groups over topic streams: ack, re-delivery of abandoned entries, a delivery limit.

A topic stream holds committed messages only, so nothing here can see a half or rolled-back message.
Any Redis client can read the same streams with XREADGROUP; this class adds what a broker user expects.
What is sent and how replies are read lives in :mod:`redis_txmq.consuming`, shared with the asyncio consumer;
this module only does the blocking I/O.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from . import tracing
from .consuming import SETUP_ERRORS, Command, ConsumerProtocol, Driver, Effect, Pause, Steps, T
from .entries import ConsumedMessage
from .scripts import preload

logger = logging.getLogger(__name__)


class Consumer(ConsumerProtocol):
    __doc__ = ConsumerProtocol.__doc__

    _logger = logger
    _asyncio = False
    _event_type = threading.Event

    def _created(self) -> None:
        """Set up the group now: a consumer that cannot reach Redis is not made."""
        try:
            self._drive(self._setup_steps())
            preload(*self._scripts.values())
        except SETUP_ERRORS as exc:
            if self._owns_client:
                self.client.close()
            raise self._setup_error(exc) from exc

    def _drive(self, steps: Steps[T]) -> T:
        with Driver(steps) as driver:
            for effect in driver:
                with driver.outcome():
                    driver.reply = self._perform(effect)
        return driver.result

    def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, Command):
            return effect.apply(self.client, self._scripts)
        if isinstance(effect, Pause):
            return self._stop.wait(effect.seconds)
        message = effect.message
        with tracing.span_for(
            "process",
            message.topic,
            transaction_id=message.transaction_id,
            group=self.group,
            properties=message.properties,
        ):
            return effect.handler(message)

    def poll(self, timeout: float | None = None) -> list[ConsumedMessage]:
        """Up to ``batch_size`` messages: abandoned ones first, then new ones (waiting up to ``timeout``).

        Raises :class:`~redis_txmq.errors.TxMQConnectionError` when Redis cannot be reached (iteration and
        :meth:`run` retry instead). A consumer group that Redis lost is created again from ``start_id``."""
        return self._drive(self._poll_steps(timeout))

    def ack(self, message: ConsumedMessage) -> None:
        """Mark the message processed; an unacked message is re-delivered after ``min_idle_time``.

        Raises :class:`~redis_txmq.errors.TxMQConnectionError` when Redis fails: the message stays pending."""
        self._drive(self._ack_steps(message))

    def dead_letter(self, message: ConsumedMessage, reason: str) -> bool:
        """Give up on a message now: move it to the dead-letter stream with ``reason`` (and ack it)."""
        return self._drive(self._dead_letter_steps(message, reason))

    def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, bytes]]]:
        """Up to ``count`` entries of each partition's dead-letter stream, oldest first, as ``(entry id, fields)``."""
        return self._drive(self._dead_letters_steps(count))

    def delete_group(self) -> None:
        """Remove this consumer group from every partition (its position and pending entries are gone), and stop
        this consumer. Stop the group's other consumers first: one still reading creates the group again."""
        self._drive(self._delete_group_steps())

    def __iter__(self) -> Iterator[ConsumedMessage]:
        """Messages until :meth:`stop` or :meth:`close`; the caller acks each one.

        A dropped connection, a restart or a failover does not end the loop: it is logged and the read is retried
        with backoff (0.1 s doubling to 5 s)."""
        while (batch := self._drive(self._batch_steps())) is not None:
            yield from batch

    def run(self, handler: Callable[[ConsumedMessage], Any], *, max_messages: int | None = None) -> int:
        """Call ``handler`` for each message and ack it when the handler returns; a handler that raises leaves
        the message pending for re-delivery. Returns how many were handled, when stopped or at ``max_messages``.
        Lost connections are retried with backoff, as in iteration; so is the ack."""
        return self._drive(self._run_steps(handler, max_messages))

    def close(self) -> None:
        """Stop, and close the client if this consumer made it (from ``redis_url``)."""
        self.stop()
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
