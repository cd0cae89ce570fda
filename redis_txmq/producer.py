"""The transactional producer (RocketMQ's TransactionMQProducer) and the listener contract."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from . import tracing
from .broker import RedisBroker
from .check_handler import CheckRequestHandler, Registrations
from .config import Settings
from .connection import REDIS_ERRORS, instance_id, resolve_client
from .errors import (
    InvalidMessageError,
    ProducerStateError,
    TxMQConnectionError,
    TxMQError,
)
from .listener import TransactionListener, local_state
from .message import (
    LocalTransactionState,
    Message,
    TransactionSendResult,
    validate_name,
)
from .oneway import EndFlusher
from .protocol import EndSource, RecordAction, TransactionRecord
from .sending import (
    CheckerListener,
    InFlight,
    ManyState,
    listener_of,
    new_send,
    routing_error,
)
from .topics import PartitionRouter
from .transaction import Transaction, TransactionOfMany

logger = logging.getLogger(__name__)


class _State:
    CREATED = "created"
    RUNNING = "running"
    SHUT_DOWN = "shut down"


class TransactionProducer:
    """Sends messages in transactions: half message, local transaction, then an atomic commit or rollback.
    While started, it also answers check-backs of its group (``listener.check_local_transaction``).

    Thread-safe: one producer may be shared by the threads of a service. Pass ``redis_url`` or ``client``
    (a ``redis.Redis`` or ``redis.cluster.RedisCluster`` with ``decode_responses=False``); with neither,
    ``TXMQ_REDIS_URL`` or the default URL is used.

    With ``oneway_end=True`` a send returns right after the local transaction and the end call is queued
    for a background flusher that pipelines them (RocketMQ's ``endTransactionOneway``); :meth:`flush`
    waits until they are applied and :meth:`shutdown` flushes. An end lost with the process is resolved by
    the check-back, as any end that never arrived.

    ``durability`` (``"master"``, ``"replica"`` or ``"aof"``) overrides ``settings.durability`` for this producer:
    what a prepare and an end wait for before they count as done (:mod:`redis_txmq.durability`).
    """

    def __init__(
        self,
        producer_group: str,
        listener: TransactionListener | None = None,
        *,
        checker: Callable[[Message], LocalTransactionState | None] | None = None,
        redis_url: str | None = None,
        client: Any = None,
        settings: Settings | None = None,
        oneway_end: bool = False,
        durability: str | None = None,
    ) -> None:
        self.producer_group = validate_name(producer_group, "producer group")
        self.listener: TransactionListener = listener_of(producer_group, listener, checker)  # type: ignore[assignment]
        if durability is not None:  # checked by Settings (a ConfigurationError names the levels) before connecting
            settings = replace(settings if settings is not None else Settings.from_env(), durability=durability)
        try:
            self.client, self.settings, self._owns_client = resolve_client(redis_url, client, settings)
        except REDIS_ERRORS as exc:  # a cluster client connects when it is made
            raise TxMQConnectionError(
                f"producer group {self.producer_group!r}: could not connect to Redis: {exc}; check redis_url (or "
                "TXMQ_REDIS_URL) and that Redis is reachable, then create the producer again"
            ) from exc
        self.broker = RedisBroker(self.client, self.settings)
        self.instance_id = instance_id("producer")
        self._check_handler = CheckRequestHandler(
            self.client, self.producer_group, self.listener, self.settings, self.instance_id, self._registrations
        )
        self._router = PartitionRouter(self.client)
        self.oneway_end = oneway_end
        self._flusher = EndFlusher(self.broker, self.settings, self.producer_group) if oneway_end else None
        self._state = _State.CREATED
        self._lock = threading.Lock()

    def start(self) -> TransactionProducer:
        """Load the scripts and begin accepting sends. Idempotent while running; a shut-down producer cannot
        restart. Raises :class:`TxMQConnectionError` when Redis cannot be reached."""
        with self._lock:
            if self._state == _State.SHUT_DOWN:
                raise ProducerStateError(
                    f"producer group {self.producer_group!r}: this producer was shut down; create a new one"
                )
            if self._state == _State.CREATED:
                self.broker.load_scripts()
                try:
                    self._check_handler.start()
                except REDIS_ERRORS as exc:
                    raise TxMQConnectionError(
                        f"producer group {self.producer_group!r}: could not start serving check requests: {exc}"
                    ) from exc
                if self._flusher is not None:
                    self._flusher.start()
            self._state = _State.RUNNING
        return self

    def _registrations(self) -> Registrations:
        """Re-asserted with every heartbeat: the topic streams this producer wrote to (the checker walks them) and
        the partition counts of its topics (a producer started after Redis lost them would write every message to
        one partition)."""
        return Registrations(self.broker.registered_streams(), self._router.partitioned_topics())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every end a one-way producer queued before this call has been applied (or has failed,
        which the log says and the check-back repairs); sends of other threads meanwhile are not waited for.
        False if ``timeout`` seconds passed first; True at once for a synchronous producer."""
        if self._flusher is None:
            return True
        return self._flusher.flush(timeout)

    @property
    def pending_ends(self) -> int:
        """Ends a one-way producer has queued and not yet applied."""
        return 0 if self._flusher is None else self._flusher.pending

    def shutdown(self) -> None:
        """Stop accepting sends and check requests: queued one-way ends are applied, running checks finish,
        queued check requests are handed back to the group's other instances. Releases the connection pool
        the producer made itself."""
        with self._lock:
            if self._state == _State.SHUT_DOWN:
                return
            was_running = self._state == _State.RUNNING
            self._state = _State.SHUT_DOWN
        if was_running:
            if self._flusher is not None:
                self._flusher.close()
            self._check_handler.shutdown()
        self.broker.close()
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> TransactionProducer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    def send_message_in_transaction(self, message: Message, arg: Any = None) -> TransactionSendResult:
        """Prepare the half message, run the local transaction, then commit or roll back.

        The send works on its own copy of ``message`` (the listener receives that copy, with ``transaction_id``
        set); the caller's object is left unchanged, so threads may send the same ``Message`` at once.

        Raises :class:`InvalidMessageError` (nothing written) or :class:`PrepareError` (the local transaction
        did not run). Once the local transaction has run, the result is always returned: a failed end call is
        logged and reported in ``end_error``, and the check-back resolves the transaction.
        """
        if isinstance(self.listener, CheckerListener):
            self.listener.execute_local_transaction(message, arg)
        tx = self._prepare(message)
        state, remark = local_state(
            self.listener.execute_local_transaction, tx.message, "local transaction", tx.message, arg
        )
        return self._end(tx, state, remark)

    def send_messages_in_transaction(self, messages: list[Message], arg: Any = None) -> list[TransactionSendResult]:
        """Several messages, possibly on several topics, in one transaction: all become visible, each once, or
        none. Their half messages are written first (:class:`PrepareError`: the local transaction did not run,
        and those written are rolled back), then the listener runs once with the first message carrying the
        transaction's id; the check-back asks about that id. Returns one result per message, in order."""
        if not messages:
            raise InvalidMessageError(f"producer group {self.producer_group!r}: no messages to send")
        if isinstance(self.listener, CheckerListener):
            self.listener.execute_local_transaction(messages[0], arg)
        with TransactionOfMany(self) as tx:
            for message in messages:
                tx.send(message)
            first = tx.state.listener_message()
            state, remark = local_state(
                self.listener.execute_local_transaction, first, "local transaction", first, arg
            )
            tx.end(state, remark)
        return tx.results

    def transaction(self, message: Message | None = None) -> Transaction | TransactionOfMany:
        """A transaction handle: ``with producer.transaction(message) as tx:`` writes the half message, the block
        is the local transaction (store ``tx.transaction_id`` with its data), and leaving it commits — or rolls
        back when the block raised. The check-back asks the listener's ``check_local_transaction`` (or ``checker``).

        Without a message, the transaction holds the messages the block sends with ``tx.send(message)`` (each
        half message is written by that call, before the local transaction commits): all of them become visible
        at the end, each once, or none does.
        """
        if message is None:
            return TransactionOfMany(self)
        return Transaction(self, message)

    def _prepare(self, message: Message, of: ManyState | None = None) -> InFlight:
        if self._state != _State.RUNNING:
            raise ProducerStateError(
                f"producer group {self.producer_group!r}: call start() (or use `with`) before sending"
            )
        if of is None:
            sent = new_send(self.producer_group, message, self.settings.max_message_size)
        else:
            self._void_failed_sends(of, raise_error=True)
            sent = of.next_send(message, self.settings.max_message_size)
        trace = tracing.start_send(sent, self.producer_group)
        keys = None
        try:
            try:
                keys = self._router.keys_for(sent)
            except REDIS_ERRORS as exc:
                raise routing_error(sent, exc) from exc
            prepared = self.broker.prepare_half(
                keys, sent, sent.transaction_id or "", self.producer_group, of.transaction_id if of else ""
            )
            in_flight = InFlight.of(prepared, keys, sent, self.producer_group, trace)
        except BaseException as exc:
            tracing.finish_send(trace, None, exc)
            if of is None:
                raise
            of.send_failed(sent, keys)
            record = self._void_failed_sends(of)
            if isinstance(exc, Exception):
                raise of.failed_send_error(sent, exc, record) from exc
            raise
        if of is not None:
            of.parts.append(in_flight)
        return in_flight

    def _void_failed_sends(self, many: ManyState, raise_error: bool = False) -> TransactionRecord | None:
        """Mark the sends of ``many`` that did not return in its record (they are never published), then roll back
        the half messages they may have written. Returns the record, or None when it could not be written (then
        ``raise_error`` raises: no further message may be sent before the failed ones are marked)."""
        if raise_error and many.decided_by_other is not None:
            raise many.decided_while_open(many.decided_by_other)
        pending = set(many.unvoided)
        if not pending:
            return None
        try:
            record = self.broker.decide(
                many.transaction_id, self.producer_group, RecordAction.VOID, EndSource.PRODUCER, pending
            )
        except TxMQError as exc:
            refusal = many.not_marked(pending, exc)
            if raise_error:
                raise refusal from exc
            return None
        many.voided(pending, record)
        self._roll_back_failed_sends(many, many.to_roll_back(record, pending))
        if raise_error and record.outcome is not None:
            raise many.decided_while_open(record)
        return record

    def _end_many(
        self, many: ManyState, state: LocalTransactionState, remark: str | None
    ) -> list[TransactionSendResult]:
        """Decide once (with the sends that did not return, never published), then end every message with the
        decision in one pipeline. A decision that cannot be written leaves every message in flight: the check-back
        asks about the transaction's id."""
        ended: Any = None
        if many.decides(state):
            try:
                record = self.broker.decide(
                    many.transaction_id,
                    self.producer_group,
                    state,
                    EndSource.PRODUCER,
                    many.failed,
                    unconfirmed_ok=True,
                )
                many.voided(set(many.failed))
                state = many.standing(state, record)
                ended = self.broker.end_transactions(many.end_calls(state, remark))
                self._release(many, many.ended_while_pinned(record, ended))
            except TxMQError as exc:
                ended = exc
            else:
                self._roll_back_failed_sends(many, many.to_roll_back(record, set(many.failed)))
        elif many.failed:
            self._void_failed_sends(many)
        return many.finish(state, remark, ended)

    def _release(self, many: ManyState, indices: set[int]) -> None:
        """Best effort: a record left pinned is released when its messages are ended or resolved later."""
        if not indices:
            return
        try:
            self.broker.decide(
                many.transaction_id, self.producer_group, RecordAction.UNPIN, EndSource.PRODUCER, indices
            )
        except TxMQError as exc:
            logger.info("tx=%s record not released for %s: %s", many.transaction_id, sorted(indices), exc)

    def _roll_back_failed_sends(self, many: ManyState, indices: set[int]) -> None:
        """Best effort: a half message left behind is rolled back by the checker (the record voids it)."""
        try:
            self.broker.end_transactions(many.rollback_calls(indices))
        except TxMQError as exc:
            logger.info("tx=%s failed sends %s left to the check-back: %s", many.transaction_id, sorted(indices), exc)

    def _end(self, tx: InFlight, state: LocalTransactionState, remark: str | None) -> TransactionSendResult:
        if tx.trace is None:
            return self._end_call(tx, state, remark)
        try:
            result = self._end_call(tx, state, remark)
        except BaseException as exc:
            tracing.finish_send(tx.trace, None, exc)
            raise
        tracing.finish_send(tx.trace, result)
        return result

    def _end_call(self, tx: InFlight, state: LocalTransactionState, remark: str | None) -> TransactionSendResult:
        end = tx.end_call(state, remark)
        if end is None:
            return tx.result(state, remark)
        try:
            if self._flusher is not None:
                self._flusher.submit(end)
                return tx.result(state, remark, end_queued=True)
            ended = self.broker.end_transaction(
                end.keys,
                end.transaction_id,
                end.producer_group,
                state,
                source=end.source,
                remark=remark,
                half_id=end.half_id,
            )
            return tx.result(state, remark, committed_id=ended.committed_id)
        except TxMQError as exc:
            return tx.result(state, remark, end_error=tx.end_failed(state, exc))
