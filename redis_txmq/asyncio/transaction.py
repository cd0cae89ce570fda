"""The transaction handle (RocketMQ 5.x's ``Transaction``): the local transaction is the body of a ``with`` block.

    async with producer.transaction(Message("orders", body, keys="order-1")) as tx:  # the half message is written
        await db.insert_order(order, transaction_id=tx.transaction_id)
    # the block ended normally: COMMIT; it raised: ROLLBACK, and the exception goes on; tx.result after

The asyncio handles' module is the source; the sync ones' is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

import asyncio  # async-only
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from ..core.config import Settings
from ..core.errors import TxMQError
from ..core.log_rows import RowWatch, after_outer_commit, settle, take_watches
from ..core.message import LocalTransactionState, Message, TransactionSendResult
from ..core.sending import HandleState, InFlight, ManyHandleState, ManyState, outcome_of_block

logger = logging.getLogger(__name__)


class AsyncTransactionSender(Protocol):
    """What a transaction handle needs from its producer (the ``TransactionProducer`` is one): the handle calls the
    producer's send steps, and the producer module imports the handles, not the other way round."""

    producer_group: str
    settings: Settings

    async def _prepare(self, message: Message, of: ManyState | None = None) -> InFlight:
        """Write the half message of ``message`` (one message of ``of`` when given)."""
        ...

    async def _end(
        self,
        tx: InFlight,
        state: LocalTransactionState,
        remark: str | None,
        on_cancel: Callable[[TransactionSendResult], None] | None = None,
    ) -> TransactionSendResult:
        """End the transaction of one message with ``state``."""
        ...

    async def _end_many(
        self, many: ManyState, state: LocalTransactionState, remark: str | None
    ) -> list[TransactionSendResult]:
        """Decide the transaction of several messages once, then end each of its messages with the decision."""
        ...


class AsyncTransaction(HandleState):
    """One transaction. Entering the block writes the half message
    ([`PrepareError`][redis_txmq.core.errors.PrepareError] if it cannot: the block does not run); leaving it commits, or
    rolls back when it raised, or leaves the transaction in flight for the check-back when it was interrupted
    (``KeyboardInterrupt``; on asyncio, cancelled: ``CancelledError``, an expired ``asyncio.timeout``).
    [`commit`][redis_txmq.asyncio.transaction.AsyncTransaction.commit] /
    [`rollback`][redis_txmq.asyncio.transaction.AsyncTransaction.rollback] end it early; ``result`` is the send result
    once ended (on asyncio, cancelled during the end call, it says so)."""

    def __init__(self, producer: AsyncTransactionSender, message: Message) -> None:
        super().__init__(message)
        self._producer = producer

    async def __aenter__(self) -> AsyncTransaction:
        self._in_flight = await self._producer._prepare(self._message)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._in_flight is None:
            return
        if self.ended:  # ended early (commit() / rollback()): what the rows say no longer matters
            take_watches(self._in_flight.transaction_id, self)
            return
        await self._settle(*outcome_of_block(exc_type, exc))

    async def _settle(self, state: LocalTransactionState, remark: str | None) -> None:
        """End with ``state``, corrected by where the transaction's log row stands; while it waits in an outer
        database transaction, the COMMIT waits for that transaction's commit (``redis_txmq.core.log_rows``)."""
        tx = self.in_flight
        settled = settle(tx.transaction_id, tx.message.topic, state, remark, self)
        if not settled.waiting:
            await self._end(settled.state, settled.remark)
            return
        self.result = tx.result(settled.state, settled.remark)
        commit_after_outer(settled.waiting, self._commit_after_outer)

    async def _commit_after_outer(self) -> None:
        """The COMMIT that waited for the outer database transaction; a failure is left to the check-back."""
        try:
            self.result = await self._producer._end(self.in_flight, LocalTransactionState.COMMIT, None)
        except TxMQError as exc:
            logger.warning("tx=%s the COMMIT after the outer database commit failed: %s", self.transaction_id, exc)

    async def commit(self) -> TransactionSendResult:
        """Commit now: the message becomes visible (while its log row waits in an outer database transaction, once
        that transaction commits); leaving the block later changes nothing."""
        if self.result is None:
            await self._settle(LocalTransactionState.COMMIT, None)
        assert self.result is not None
        return self.result

    async def rollback(self) -> TransactionSendResult:
        """Roll back now, without an exception: the message is dropped."""
        return await self._end(LocalTransactionState.ROLLBACK, None)

    async def _end(self, state: LocalTransactionState, remark: str | None) -> TransactionSendResult:
        if self.result is None:
            self.result = await self._producer._end(
                self.in_flight, state, remark, on_cancel=lambda result: setattr(self, "result", result)
            )
        return self.result


class AsyncTransactionOfMany(ManyHandleState):
    """A transaction of several messages (``producer.transaction()`` without a message). Entering the block writes
    nothing; each ``send`` writes one half message ([`PrepareError`][redis_txmq.core.errors.PrepareError] if it cannot:
    that message is never published, whatever the transaction decides; the block decides what then). Leaving the block
    decides as [`AsyncTransaction`][redis_txmq.asyncio.transaction.AsyncTransaction] does, writes the decision once and
    ends every message with it; ``results`` holds one send result per message whose send returned. Interrupted
    (cancelled), it stays in flight for the check-back."""

    def __init__(self, producer: AsyncTransactionSender) -> None:
        super().__init__(producer.producer_group, producer.settings.max_transaction_messages)
        self._producer = producer

    async def __aenter__(self) -> AsyncTransactionOfMany:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.state.ended:
            take_watches(self.state.transaction_id, self)
            return
        await self.settle(*outcome_of_block(exc_type, exc))

    async def settle(self, state: LocalTransactionState, remark: str | None) -> None:
        """End with ``state``, or, while the transaction's log row waits in an outer database transaction, when
        that transaction commits (``redis_txmq.core.log_rows``)."""
        topic = self.state.parts[0].message.topic if self.state.parts else ""
        settled = settle(self.state.transaction_id, topic, state, remark, self)
        if not settled.waiting:
            await self.end(settled.state, settled.remark)
            return
        self.state.results = [part.result(settled.state, settled.remark) for part in self.state.parts]
        commit_after_outer(settled.waiting, self._commit_after_outer)

    async def _commit_after_outer(self) -> None:
        """The decision that waited for the outer database transaction; a failure is left to the check-back."""
        try:
            await self._producer._end_many(self.state, LocalTransactionState.COMMIT, None)
        except TxMQError as exc:
            logger.warning("tx=%s the COMMIT after the outer database commit failed: %s", self.transaction_id, exc)

    async def send(self, message: Message) -> Message:
        """Write ``message`` as a half message of this transaction; returns the copy that was written, whose
        ``transaction_id`` is ``<transaction id>.<index>``."""
        return (await self._producer._prepare(message, self.state)).message

    async def commit(self) -> list[TransactionSendResult]:
        """Commit now: every message becomes visible (while the log row waits in an outer database transaction,
        once that transaction commits); leaving the block later changes nothing."""
        if self.state.results is None:
            await self.settle(LocalTransactionState.COMMIT, None)
        return self.results

    async def rollback(self) -> list[TransactionSendResult]:
        """Roll back now, without an exception: every message is dropped."""
        return await self.end(LocalTransactionState.ROLLBACK, None)

    async def end(self, state: LocalTransactionState, remark: str | None) -> list[TransactionSendResult]:
        """End with ``state`` (UNKNOWN leaves the transaction to the check-back); once."""
        if self.state.results is None:
            await self._producer._end_many(self.state, state, remark)
        return self.results


def commit_after_outer(waiting: tuple[RowWatch, ...], commit: Callable[[], Any]) -> bool:
    """Run ``commit`` once an outer database transaction holding the transaction's log row commits; False when
    the watches cannot learn of that commit (the check-back settles the transaction then). On asyncio the commit
    may happen on another thread: ``commit`` is scheduled on this loop."""
    loop = asyncio.get_running_loop()  # async-only
    return after_outer_commit(waiting, lambda: loop.call_soon_threadsafe(_spawn, commit))  # async-only
    # sync-only: return after_outer_commit(waiting, commit)


_DEFERRED: set[asyncio.Future[Any]] = set()  # async-only


def _spawn(commit: Callable[[], Any]) -> None:  # async-only
    task = asyncio.ensure_future(commit())  # async-only
    _DEFERRED.add(task)  # async-only
    task.add_done_callback(_DEFERRED.discard)  # async-only
