"""The transaction handle (RocketMQ 5.x's ``Transaction``): the local transaction is the body of a ``with`` block.

with producer.transaction(Message("orders", body, keys="order-1")) as tx:   # the half message is written
    db.insert_order(order, transaction_id=tx.transaction_id)
# the block ended normally: COMMIT; it raised: ROLLBACK, and the exception goes on; tx.result after
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

from .config import Settings
from .message import LocalTransactionState, Message, TransactionSendResult
from .sending import HandleState, InFlight, ManyHandleState, ManyState, outcome_of_block


class TransactionSender(Protocol):
    """What a transaction handle needs from its producer (:class:`redis_txmq.TransactionProducer` is one): the
    handle calls the producer's send steps, and the producer module imports the handles, not the other way round."""

    producer_group: str
    settings: Settings

    def _prepare(self, message: Message, of: ManyState | None = None) -> InFlight:
        """Write the half message of ``message`` (one message of ``of`` when given)."""
        ...

    def _end(self, tx: InFlight, state: LocalTransactionState, remark: str | None) -> TransactionSendResult:
        """End the transaction of one message with ``state``."""
        ...

    def _end_many(
        self, many: ManyState, state: LocalTransactionState, remark: str | None
    ) -> list[TransactionSendResult]:
        """Decide the transaction of several messages once, then end each of its messages with the decision."""
        ...


class Transaction(HandleState):
    """One transaction of a sync producer. Entering the block writes the half message (:class:`PrepareError` if it
    cannot: the block does not run); leaving it commits, or rolls back when it raised, or leaves the transaction to
    the check-back when it was interrupted (``KeyboardInterrupt``). :meth:`commit` / :meth:`rollback` end it early;
    :attr:`result` is the send result once ended."""

    def __init__(self, producer: TransactionSender, message: Message) -> None:
        super().__init__(message)
        self._producer = producer

    def __enter__(self) -> Transaction:
        self._in_flight = self._producer._prepare(self._message)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.ended and self._in_flight is not None:
            self._end(*outcome_of_block(exc_type, exc))

    def commit(self) -> TransactionSendResult:
        """Commit now: the message becomes visible; leaving the block later changes nothing."""
        return self._end(LocalTransactionState.COMMIT, None)

    def rollback(self) -> TransactionSendResult:
        """Roll back now, without an exception: the message is dropped."""
        return self._end(LocalTransactionState.ROLLBACK, None)

    def _end(self, state: LocalTransactionState, remark: str | None) -> TransactionSendResult:
        if self.result is None:
            self.result = self._producer._end(self.in_flight, state, remark)
        return self.result


class TransactionOfMany(ManyHandleState):
    """A transaction of several messages of a sync producer (``producer.transaction()`` without a message).
    Entering the block writes nothing; each :meth:`send` writes one half message (:class:`PrepareError` if it
    cannot: that message is never published, whatever the transaction decides; the block decides what then).
    Leaving the block decides as :class:`Transaction` does, writes the decision once and ends every message with
    it; :attr:`results` holds one send result per message whose send returned."""

    def __init__(self, producer: TransactionSender) -> None:
        super().__init__(producer.producer_group, producer.settings.max_transaction_messages)
        self._producer = producer

    def __enter__(self) -> TransactionOfMany:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.state.ended:
            self.end(*outcome_of_block(exc_type, exc))

    def send(self, message: Message) -> Message:
        """Write ``message`` as a half message of this transaction; returns the copy that was written, whose
        ``transaction_id`` is ``<transaction id>.<index>``."""
        return self._producer._prepare(message, self.state).message

    def commit(self) -> list[TransactionSendResult]:
        """Commit now: every message becomes visible; leaving the block later changes nothing."""
        return self.end(LocalTransactionState.COMMIT, None)

    def rollback(self) -> list[TransactionSendResult]:
        """Roll back now, without an exception: every message is dropped."""
        return self.end(LocalTransactionState.ROLLBACK, None)

    def end(self, state: LocalTransactionState, remark: str | None) -> list[TransactionSendResult]:
        """End with ``state`` (UNKNOWN leaves the transaction to the check-back); once."""
        if self.state.results is None:
            self._producer._end_many(self.state, state, remark)
        return self.results
