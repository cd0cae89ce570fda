"""One send, without I/O: the steps the sync and the asyncio producer take in the same order, and what a
transaction handle decides when its block ends. The producers only do the I/O between these steps."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from . import tracing
from .errors import ConfigurationError, InvalidMessageError, PrepareError, ProducerStateError, TxMQError
from .keys import TopicKeys
from .listener import TransactionListener
from .message import (
    LocalTransactionState,
    Message,
    SendStatus,
    TransactionSendResult,
    exception_text,
    remark_text,
    time_of_entry_id,
)
from .protocol import EndCall, EndResult, EndSource, PrepareResult, TransactionRecord, message_index
from .tracing import SendTrace

logger = logging.getLogger(__name__)


def new_transaction_id() -> str:
    return os.urandom(16).hex()


def new_send(
    producer_group: str, message: Message, max_message_size: int, transaction_id: str | None = None
) -> Message:
    """The send's own copy of ``message``, with a new transaction id (or ``transaction_id``), validated: nothing is
    written for a refused message, and the caller's object is never changed."""
    if not isinstance(message, Message):
        raise InvalidMessageError(
            f"producer group {producer_group!r}: expected a redis_txmq.Message, got {type(message).__name__}"
        )
    sent = message.copy_for_send(transaction_id or new_transaction_id())
    sent.validate(max_message_size)
    return sent


def routing_error(message: Message, exc: Exception) -> PrepareError:
    return PrepareError(
        f"topic {message.topic!r}: could not read the topic's partitions ({exc}); nothing was written, retry the send"
    )


@dataclass(slots=True)
class InFlight:
    """A transaction whose half message is written: what its end call and its result are made of."""

    keys: TopicKeys
    message: Message
    producer_group: str
    half_id: str
    trace: SendTrace | None = None

    @classmethod
    def of(
        cls,
        prepared: PrepareResult,
        keys: TopicKeys,
        message: Message,
        producer_group: str,
        trace: SendTrace | None = None,
    ) -> InFlight:
        if prepared.state != "PREPARED":
            raise PrepareError(
                f"topic {message.topic!r}, transaction {message.transaction_id}: id already used ({prepared.state})"
            )
        message.prepared_at = time_of_entry_id(prepared.half_id)
        return cls(keys, message, producer_group, prepared.half_id, trace)

    @property
    def transaction_id(self) -> str:
        return self.message.transaction_id or ""

    def end_call(self, state: LocalTransactionState, remark: str | None) -> EndCall | None:
        """The end to send; None for UNKNOWN without a remark (nothing to record: the check-back decides)."""
        if state is LocalTransactionState.UNKNOWN and not remark:
            return None
        return EndCall(
            self.keys, self.transaction_id, self.producer_group, state, EndSource.PRODUCER, remark, self.half_id
        )

    def end_failed(self, state: LocalTransactionState, exc: TxMQError) -> str:
        logger.warning("tx=%s topic=%s end %s failed: %s", self.transaction_id, self.message.topic, state.value, exc)
        return str(exc)

    def result(
        self,
        state: LocalTransactionState,
        remark: str | None,
        *,
        committed_id: str | None = None,
        end_error: str | None = None,
        end_queued: bool = False,
    ) -> TransactionSendResult:
        message = self.message
        transaction_id = message.transaction_id or ""
        if logger.isEnabledFor(logging.DEBUG):  # once per send: nothing is formatted or looked up when off
            logger.debug("tx=%s topic=%s half=%s state=%s", transaction_id, message.topic, self.half_id, state)
        # positional, in the order of the fields: a frozen dataclass built once per send costs half as much so
        return TransactionSendResult(
            transaction_id,
            message.topic,
            self.half_id,
            state,
            SendStatus.SEND_OK,
            self.keys.partition,
            committed_id,
            remark,
            end_error,
            end_queued,
        )


def outcome_of_block(
    exc_type: type[BaseException] | None, exc: BaseException | None
) -> tuple[LocalTransactionState, str | None]:
    """What leaving a transaction handle's block decides, and the remark kept with it: COMMIT when it ended normally,
    ROLLBACK when it raised an exception (named in the remark), UNKNOWN (the check-back asks the listener) when it was
    cancelled or interrupted (``CancelledError``, ``KeyboardInterrupt``...) or raised a database error that lost its
    connection (SQLAlchemy's ``connection_invalidated``, Django's ``OperationalError`` and ``InterfaceError``: a COMMIT
    under way may have been applied): the local transaction may have committed, never guess. The remark is made sendable
    whatever the exception's text (``remark_text``): the end is applied and the block's own exception goes on."""
    if exc_type is None:
        return LocalTransactionState.COMMIT, None
    if not issubclass(exc_type, Exception):
        return LocalTransactionState.UNKNOWN, None
    if getattr(exc, "connection_invalidated", False) is True or _is_connection_error(exc_type):
        lost = f"the block lost its database connection ({exc_type.__name__})"
        return LocalTransactionState.UNKNOWN, remark_text(lost)
    described = exception_text(exc) if exc is not None else exc_type.__name__
    return LocalTransactionState.ROLLBACK, remark_text(f"the block raised {described}")


_CONNECTION_ERRORS = {("django.db.utils", "OperationalError"), ("django.db.utils", "InterfaceError")}
"""Django's errors of a connection that failed, a COMMIT among its statements (named, not imported: the core does
not import Django). Unlike SQLAlchemy, Django says nothing of whether the connection is lost; a statement's lock
timeout among them only makes the check-back, which reads the row, settle the transaction a little later."""


def _is_connection_error(exc_type: type[BaseException]) -> bool:
    return any((cls.__module__, cls.__name__) in _CONNECTION_ERRORS for cls in exc_type.__mro__)


class HandleState:
    """The part of a transaction handle that is not I/O: the in-flight transaction, and ending it once."""

    def __init__(self, message: Message) -> None:
        self._message = message
        self._in_flight: InFlight | None = None
        self.result: TransactionSendResult | None = None
        """The send result, once the transaction was ended (or left to the check-back)."""
        self.rows_settled = False
        """Whether the end has taken the watches of its log rows (``redis_txmq.core.log_rows``)."""

    @property
    def in_flight(self) -> InFlight:
        if self._in_flight is None:
            raise ConfigurationError(
                f"topic {self._message.topic!r}: the transaction starts when its block is entered "
                "(`with producer.transaction(message) as tx:`)"
            )
        return self._in_flight

    @property
    def transaction_id(self) -> str:
        """The id to store with the local transaction's data, so that a check-back can find it."""
        return self.in_flight.transaction_id

    @property
    def message(self) -> Message:
        """The transaction's own copy of the message, with ``transaction_id`` set."""
        return self.in_flight.message

    @property
    def ended(self) -> bool:
        return self.result is not None


class ManyState:
    """The part of a transaction of several messages that is not I/O: its id, its messages' half messages, and
    ending it once.

    Message ``i`` of transaction ``X`` is sent as its own half message with transaction id ``X.i`` (unique, so a
    consumer's inbox keeps each) and ``parent_transaction_id`` ``X``. The outcome is first written once as the
    transaction's decision (``lua/decide_transaction.lua``, in the slot of ``X``), then each half message is ended
    with it; whoever finds a half message in flight later (the checker) ends it with the decision, or asks the
    producer group about ``X`` when there is none yet."""

    def __init__(self, producer_group: str, max_messages: int) -> None:
        self.producer_group = producer_group
        self.max_messages = max_messages
        self.transaction_id = new_transaction_id()
        """The id to store with the local transaction's data: a check-back asks about this id."""
        self.parts: list[InFlight] = []
        self.failed: dict[int, TopicKeys | None] = {}
        """Index -> topic keys (None when the send failed before choosing them) of every send that did not return:
        its half message may exist, and it must never be published (``voided`` in the record)."""
        self.decided_by_other: TransactionRecord | None = None
        """The record, when a mark of a failed send found the transaction decided already (by a check-back or an
        operator, while the block was open): no further message may be sent."""
        self.unvoided: set[int] = set()
        """Failed sends not yet marked in the record: the next send marks them first, the decision carries them."""
        self._sends = 0
        """Every send takes the next index, also one whose prepare failed: a half message it may have written (a
        durability shortfall) keeps its own id, and no later message is answered with it as a duplicate."""
        self.results: list[TransactionSendResult] | None = None
        """One send result per message, in order, once the transaction was ended (or left to the check-back)."""

    @property
    def ended(self) -> bool:
        return self.results is not None

    def next_send(self, message: Message, max_message_size: int) -> Message:
        """The validated copy of the next message, with its own transaction id; refuses a message too many."""
        if self.results is not None:
            raise ConfigurationError(
                f"transaction {self.transaction_id}: already ended; send the messages before it commits"
            )
        if self._sends >= self.max_messages:
            raise InvalidMessageError(
                f"transaction {self.transaction_id}: at most {self.max_messages} messages in one transaction "
                "(max_transaction_messages); split the work into several transactions"
            )
        sent = new_send(self.producer_group, message, max_message_size, f"{self.transaction_id}.{self._sends}")
        self._sends += 1
        return sent

    def send_failed(self, message: Message, keys: TopicKeys | None) -> int:
        """Note that the send of ``message`` did not return; returns its index."""
        index = message_index(self.transaction_id, message.transaction_id or "")
        assert index is not None
        self.failed[index] = keys
        self.unvoided.add(index)
        return index

    def voided(self, indices: set[int], record: TransactionRecord | None = None) -> None:
        """``indices`` were marked in the record (or it was decided already: they follow its decision then)."""
        self.unvoided -= indices
        if record is not None and record.outcome is not None:
            self.decided_by_other = record

    def not_marked(self, indices: set[int], exc: TxMQError) -> PrepareError:
        """The failed sends ``indices`` could not be marked in the record: logged; the refusal of the next send."""
        logger.warning("tx=%s could not mark failed sends %s: %s", self.transaction_id, sorted(indices), exc)
        return PrepareError(
            f"transaction {self.transaction_id}: an earlier send did not return and cannot be marked as failed "
            f"({exc}); nothing was written: retry, or leave the block to roll the transaction back"
        )

    def to_roll_back(self, record: TransactionRecord, indices: set[int]) -> set[int]:
        """Of the failed sends ``indices``, those the producer rolls back: all while the transaction is undecided;
        once it is decided, those the record voids (the others follow the decision, as the checker ends them)."""
        return set(indices) if record.outcome is None else set(indices) & set(record.voided)

    def decided_while_open(self, record: TransactionRecord) -> PrepareError:
        """The refusal of a send after the transaction was decided while its block was still open (by a check-back
        or an operator): a message sent now would follow a decision its local transaction did not make."""
        assert record.outcome is not None
        failed = sorted(i for i in self.failed if i not in record.voided)
        follows = f"; the failed send(s) {failed} follow it: do not send them again" if failed else ""
        return PrepareError(
            f"transaction {self.transaction_id}: already decided {record.outcome.value} (by a check-back or an "
            f"operator) while its block is open: nothing more can be sent in it{follows}"
        )

    def ended_while_pinned(self, record: TransactionRecord, ended: list[EndResult | TxMQError]) -> set[int]:
        """Messages the record holds as dead-lettered that this producer's ends ended all the same (the checker
        pinned the record, then could not bury them): the record lets go of them."""
        if not record.dead:
            return set()
        return {
            index
            for part, result in zip(self.parts, ended, strict=True)
            if (index := message_index(self.transaction_id, part.transaction_id)) in record.dead
            and isinstance(result, EndResult)
        }

    def rollback_calls(self, indices: set[int]) -> list[EndCall]:
        """Roll back the half messages the failed sends ``indices`` may have written (those whose topic is known)."""
        return [
            EndCall(
                keys,
                f"{self.transaction_id}.{index}",
                self.producer_group,
                LocalTransactionState.ROLLBACK,
                EndSource.PRODUCER,
                "its send did not return",
            )
            for index, keys in sorted(self.failed.items())
            if index in indices and keys is not None
        ]

    def failed_send_error(self, message: Message, exc: BaseException, record: TransactionRecord | None) -> PrepareError:
        """What a send that raised tells its caller: whether the half message may exist, and what happens to it."""
        where = f"topic {message.topic!r}, transaction {message.transaction_id}"
        cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if (
            record is not None
            and record.outcome is not None
            and record.outcome_of(message.transaction_id or "") is (LocalTransactionState.COMMIT)
        ):
            return PrepareError(
                f"{where}: the send failed ({cause}), but transaction {self.transaction_id} was already decided "
                "COMMIT (by a check-back): if its half message was written, it is published with the transaction"
            )
        if record is None:
            return PrepareError(
                f"{where}: the send failed ({cause}); its half message may have been written and could not be "
                "marked as failed yet: the next send or the end of the transaction marks it, and it is never "
                "published then, unless the transaction was decided meanwhile (by a check-back or an operator: the "
                "next send then says so, and it follows that decision). If this process dies first, the check-back "
                "may publish it with the transaction. Sending the message again adds it as a new message"
            )
        return PrepareError(
            f"{where}: the send failed ({cause}); its half message, if written, is rolled back whatever the "
            "transaction decides. Sending the message again adds it as a new message, published once"
        )

    def listener_message(self) -> Message:
        """What the listener's ``execute_local_transaction`` receives: the first message, with the transaction's
        id (the one a check-back asks about)."""
        return self.parts[0].message.copy_for_send(self.transaction_id)

    def end_calls(self, state: LocalTransactionState, remark: str | None) -> list[EndCall]:
        return [
            EndCall(p.keys, p.transaction_id, self.producer_group, state, EndSource.PRODUCER, remark, p.half_id)
            for p in self.parts
        ]

    def finish(
        self,
        state: LocalTransactionState,
        remark: str | None,
        ended: list[EndResult | TxMQError] | TxMQError | None,
    ) -> list[TransactionSendResult]:
        """The send results: ``ended`` holds each end's result, or the one error that stopped the decision (every
        message then stays in flight for the check-back), or None when nothing was ended (UNKNOWN)."""
        results: list[TransactionSendResult] = []
        for i, part in enumerate(self.parts):
            outcome = ended if ended is None or isinstance(ended, TxMQError) else ended[i]
            if outcome is None:
                result = part.result(state, remark)
            elif isinstance(outcome, TxMQError):
                result = part.result(state, remark, end_error=part.end_failed(state, outcome))
            else:
                result = part.result(state, remark, committed_id=outcome.committed_id)
            if part.trace is not None:
                tracing.finish_send(part.trace, result)
            results.append(result)
        self.results = results
        return results

    def decides(self, state: LocalTransactionState) -> bool:
        """Whether ending with ``state`` writes a decision: UNKNOWN (or no message) leaves it to the check-back."""
        return state is not LocalTransactionState.UNKNOWN and bool(self.parts)

    def standing(self, asked: LocalTransactionState, record: TransactionRecord) -> LocalTransactionState:
        """The decision the messages are ended with: the one that stands, logged when a check-back made another."""
        decided = record.outcome or asked
        if decided is not asked:
            logger.warning(
                "tx=%s asked to %s, but the transaction was already decided %s (by a check-back); that decision stands",
                self.transaction_id,
                asked.value,
                decided.value,
            )
        return decided


class ManyHandleState:
    """The part of a handle of a transaction of several messages that is not I/O (the sync and asyncio handles)."""

    def __init__(self, producer_group: str, max_messages: int) -> None:
        self.state = ManyState(producer_group, max_messages)
        self.rows_settled = False
        """Whether the end has taken the watches of its log rows (``redis_txmq.core.log_rows``)."""

    @property
    def transaction_id(self) -> str:
        """The id to store with the local transaction's data, so that a check-back can find it."""
        return self.state.transaction_id

    @property
    def results(self) -> list[TransactionSendResult]:
        """One send result per message, in order (empty before the end)."""
        return self.state.results or []

    @property
    def ended(self) -> bool:
        return self.state.ended


class CheckerListener(TransactionListener):
    """The listener of a producer used only through transaction handles: a check-back calls ``checker``."""

    def __init__(self, checker: object) -> None:
        if not callable(checker):
            raise ConfigurationError(f"checker must be a callable taking a Message, got {checker!r}")
        self.checker = checker

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState | None:
        raise ConfigurationError(
            f"topic {message.topic!r}: this producer has no listener; use producer.transaction(message), or make it "
            "with a TransactionListener to call send_message_in_transaction"
        )

    def check_local_transaction(self, message: Message) -> LocalTransactionState | None:
        return self.checker(message)  # type: ignore[operator]


def listener_of(producer_group: str, listener: object, checker: object, base: type = TransactionListener) -> object:
    """The producer's listener: the one given, or a ``CheckerListener`` around ``checker``."""
    if listener is not None and checker is not None:
        raise ConfigurationError(f"producer group {producer_group!r}: pass a listener or a checker, not both")
    if checker is not None:
        return CheckerListener(checker)
    if not isinstance(listener, base):
        raise ConfigurationError(
            f"producer group {producer_group!r}: listener must be a TransactionListener (or pass checker= for a "
            f"producer used only through transaction handles), got {listener!r}"
        )
    return listener


def account_batch(name: str, batch: list[EndCall], results: list[EndResult | TxMQError] | Exception) -> tuple[int, int]:
    """Log what a batch of a one-way producer's queued ends did; returns (applied, failed). A failed end stays in
    flight and the check-back resolves it."""
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


def forked_error(end: EndCall) -> ProducerStateError:
    return ProducerStateError(
        f"producer group {end.producer_group!r}, transaction {end.transaction_id}: this one-way producer was created "
        "in another process (before a fork); create the producer in the child. The check-back will resolve this "
        "transaction"
    )
