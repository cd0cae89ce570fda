"""The transactional producer (RocketMQ's TransactionMQProducer).

The steps of a send (``redis_txmq.core.sending``), the scripts' arguments and replies (``redis_txmq.core.protocol``) and
the check-request format (``redis_txmq.core.check_requests``) are written once; this module does the I/O between them.
The asyncio producer's module is the source, the sync one's is generated from it by ``scripts/unasync.py``.

On asyncio, cancellation is an outcome, never a loss: cancelled before the half message is written, nothing is
written; during the local transaction, the transaction stays in flight for the check-back (never a blind COMMIT or
ROLLBACK); during the end call, the end goes on in the background (shielded) and, should it fail, the check-back
resolves it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Any

from ..core import tracing
from ..core.clients import REDIS_ERRORS, connection_errors, instance_id
from ..core.config import Settings
from ..core.errors import InvalidMessageError, ProducerStateError, TxMQConnectionError, TxMQError
from ..core.keys import topic_meta_key
from ..core.listener import TransactionListener as SyncTransactionListener  # async-only
from ..core.log_rows import settle, take_watches
from ..core.message import LocalTransactionState, Message, TransactionSendResult, validate_name
from ..core.protocol import EndCall, EndSource, RecordAction, TransactionRecord
from ..core.sending import CheckerListener, InFlight, ManyState, listener_of, new_send, routing_error
from ..core.topics import PartitionRouter, count_of
from ..transport.connection import resolve_client
from ..transport.synchronization import AsyncBackground, AsyncCancelled, AsyncLock, async_shield
from .broker import AsyncRedisBroker
from .check_handler import AsyncCheckRequestHandler, Registrations
from .listener import TransactionListener, local_state
from .oneway import AsyncEndFlusher
from .transaction import AsyncTransaction, AsyncTransactionOfMany, commit_after_outer

logger = logging.getLogger(__name__)

Listener = TransactionListener | SyncTransactionListener  # async-only
# sync-only: Listener = TransactionListener
LISTENER_TYPES = (TransactionListener, SyncTransactionListener)  # async-only
# sync-only: LISTENER_TYPES = (TransactionListener,)


class _State:
    CREATED = "created"
    RUNNING = "running"
    SHUT_DOWN = "shut down"


class TransactionProducer:
    """Sends messages in transactions: half message, local transaction, then an atomic commit or rollback.
    While started, it also answers check-backs of its group (``listener.check_local_transaction``).

    Pass ``redis_url`` or ``client`` (a ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster`` with
    ``decode_responses=False``); with neither, ``TXMQ_REDIS_URL`` or the default URL is used. The sync producer is
    thread-safe: one producer may be shared by the threads of a service. The asyncio producer takes an asyncio
    ``TransactionListener`` or a sync one (its methods run in a thread), or only ``checker=`` for a producer used
    through [`transaction`][redis_txmq.asyncio.producer.TransactionProducer.transaction] handles.

    With ``oneway_end=True`` a send returns right after the local transaction and the end call is queued for a
    background flusher that pipelines them (RocketMQ's ``endTransactionOneway``);
    [`flush`][redis_txmq.asyncio.producer.TransactionProducer.flush] waits until they are applied and
    [`shutdown`][redis_txmq.asyncio.producer.TransactionProducer.shutdown] flushes. An end lost with the process is
    resolved by the check-back, as any end that never arrived.

    ``durability`` (``"master"``, ``"replica"`` or ``"aof"``) overrides ``settings.durability`` for this producer: what
    a prepare and an end wait for before they count as done (``redis_txmq.core.durability``).
    """

    def __init__(
        self,
        producer_group: str,
        listener: Listener | None = None,
        *,
        checker: Callable[[Message], Any] | None = None,
        redis_url: str | None = None,
        client: Any = None,
        settings: Settings | None = None,
        oneway_end: bool = False,
        durability: str | None = None,
    ) -> None:
        self.producer_group = validate_name(producer_group, "producer group")
        self.listener: Any = listener_of(producer_group, listener, checker, LISTENER_TYPES)
        if durability is not None:  # checked by Settings (a ConfigurationError names the levels) before connecting
            settings = replace(settings if settings is not None else Settings.from_env(), durability=durability)
        try:
            self.client, self.settings, self._owns_client = resolve_client(
                redis_url,
                client,
                settings,
                asyncio=True,  # async-only
            )
        except REDIS_ERRORS as exc:  # a sync cluster client connects when it is made
            raise TxMQConnectionError(
                f"producer group {self.producer_group!r}: could not connect to Redis: {exc}; check redis_url (or "
                "TXMQ_REDIS_URL) and that Redis is reachable, then create the producer again"
            ) from exc
        self.broker = AsyncRedisBroker(self.client, self.settings)
        self.instance_id = instance_id("producer")
        self._check_handler = AsyncCheckRequestHandler(
            self.client, self.producer_group, self.listener, self.settings, self.instance_id, self._registrations
        )
        self._router = PartitionRouter(self.client)
        self.oneway_end = oneway_end
        self._flusher = AsyncEndFlusher(self.broker, self.settings, self.producer_group) if oneway_end else None
        self._state = _State.CREATED
        self._lock = AsyncLock()
        self._background = AsyncBackground()

    async def start(self) -> TransactionProducer:
        """Load the scripts and begin accepting sends and serving check requests. Idempotent while running; a
        shut-down producer cannot restart. Raises [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError]
        when Redis cannot be reached."""
        async with self._lock:
            if self._state == _State.SHUT_DOWN:
                raise ProducerStateError(
                    f"producer group {self.producer_group!r}: this producer was shut down; create a new one"
                )
            if self._state == _State.CREATED:
                await self.broker.load_scripts()
                try:
                    await self._check_handler.start()
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

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every end a one-way producer queued before this call has been applied (or has failed,
        which the log says and the check-back repairs); sends of other threads meanwhile are not waited for.
        False if ``timeout`` seconds passed first; True at once for a producer that is not one-way."""
        if self._flusher is None:
            return True
        return await self._flusher.flush(timeout)

    @property
    def pending_ends(self) -> int:
        """Ends a one-way producer has queued and not yet applied."""
        return 0 if self._flusher is None else self._flusher.pending

    async def shutdown(self) -> None:
        """Stop accepting sends and check requests: queued one-way ends and ends under way are applied, running
        checks finish, queued check requests are handed back to the group's other instances. Releases the
        connection pool the producer made itself."""
        async with self._lock:
            if self._state == _State.SHUT_DOWN:
                return
            was_running = self._state == _State.RUNNING
            self._state = _State.SHUT_DOWN
        if was_running:
            if self._flusher is not None:
                await self._flusher.close()
            await self._background.wait()
            await self._check_handler.shutdown()
        await self.broker.close()
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> TransactionProducer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    async def send_message_in_transaction(self, message: Message, arg: Any = None) -> TransactionSendResult:
        """Prepare the half message, run the local transaction, then commit or roll back.

        The send works on its own copy of ``message`` (the listener receives that copy, with ``transaction_id``
        set); the caller's object is left unchanged, so concurrent sends may share one ``Message``.

        Raises [`InvalidMessageError`][redis_txmq.core.errors.InvalidMessageError] (nothing written) or
        [`PrepareError`][redis_txmq.core.errors.PrepareError] (the local transaction did not run). Once the local
        transaction has run, the result is always returned: a failed end call is logged and reported in ``end_error``,
        and the check-back resolves the transaction.
        """
        if isinstance(self.listener, CheckerListener):
            self.listener.execute_local_transaction(message, arg)
        tx = await self._prepare(message)
        try:
            state, remark = await local_state(
                self.listener.execute_local_transaction, tx.message, "local transaction", tx.message, arg
            )
        except BaseException:
            take_watches(tx.transaction_id)  # interrupted: the check-back settles it, the rows are not followed
            raise
        settled = settle(tx.transaction_id, tx.message.topic, state, remark)
        if settled.waiting:
            commit_after_outer(settled.waiting, partial(self._commit_after_outer, tx))
            return tx.result(settled.state, settled.remark)
        return await self._end(tx, settled.state, settled.remark)

    async def _commit_after_outer(self, tx: InFlight) -> None:
        """The COMMIT that waited for the outer database transaction; a failure is left to the check-back."""
        try:
            await self._end(tx, LocalTransactionState.COMMIT, None)
        except TxMQError as exc:
            logger.warning("tx=%s the COMMIT after the outer database commit failed: %s", tx.transaction_id, exc)

    async def send_messages_in_transaction(
        self, messages: list[Message], arg: Any = None
    ) -> list[TransactionSendResult]:
        """Several messages, possibly on several topics, in one transaction: all become visible, each once, or
        none. Their half messages are written first ([`PrepareError`][redis_txmq.core.errors.PrepareError]: the local
        transaction did not run, and those written are rolled back), then the listener runs once with the first message
        carrying the transaction's id; the check-back asks about that id. Returns one result per message, in order."""
        if not messages:
            raise InvalidMessageError(f"producer group {self.producer_group!r}: no messages to send")
        if isinstance(self.listener, CheckerListener):
            self.listener.execute_local_transaction(messages[0], arg)
        async with AsyncTransactionOfMany(self) as tx:
            for message in messages:
                await tx.send(message)
            first = tx.state.listener_message()
            try:
                state, remark = await local_state(
                    self.listener.execute_local_transaction, first, "local transaction", first, arg
                )
            except BaseException:
                take_watches(tx.transaction_id, tx)  # interrupted: the check-back settles it
                raise
            await tx.settle(state, remark)
        return tx.results

    def transaction(self, message: Message | None = None) -> AsyncTransaction | AsyncTransactionOfMany:
        """A transaction handle: ``async with producer.transaction(message) as tx:`` writes the half message, the
        block is the local transaction (store ``tx.transaction_id`` with its data), and leaving it commits — or
        rolls back when the block raised. The check-back asks the listener's ``check_local_transaction`` (or
        ``checker``).

        Without a message, the transaction holds the messages the block sends with ``await tx.send(message)``
        (each half message is written by that call, before the local transaction commits): all of them become
        visible at the end, each once, or none does.
        """
        if message is None:
            return AsyncTransactionOfMany(self)
        return AsyncTransaction(self, message)

    async def _prepare(self, message: Message, of: ManyState | None = None) -> InFlight:
        if self._state != _State.RUNNING:
            raise ProducerStateError(
                f"producer group {self.producer_group!r}: call `await start()` (or use `async with`) before sending"
            )
        if of is None:
            sent = new_send(self.producer_group, message, self.settings.max_message_size)
        else:
            await self._void_failed_sends(of, raise_error=True)
            sent = of.next_send(message, self.settings.max_message_size)
        trace = tracing.start_send(sent, self.producer_group)
        keys = None
        try:
            partitions = self._router.known(sent.topic)
            if partitions is None:
                try:
                    with connection_errors():
                        count = count_of(await self.client.hget(topic_meta_key(sent.topic), "partitions"))
                except REDIS_ERRORS as exc:
                    raise routing_error(sent, exc) from exc
                partitions = self._router.remember(sent.topic, count)
            keys = self._router.pick(sent, partitions)
            prepared = await self.broker.prepare_half(
                keys, sent, sent.transaction_id or "", self.producer_group, of.transaction_id if of else ""
            )
            in_flight = InFlight.of(prepared, keys, sent, self.producer_group, trace)
        except BaseException as exc:
            tracing.finish_send(trace, None, exc)
            if of is None:
                raise
            of.send_failed(sent, keys)
            if not isinstance(exc, Exception):  # interrupted: marked in the background (shutdown() waits for it)
                self._background.spawn(self._void_failed_sends(of))
                raise
            raise of.failed_send_error(sent, exc, await self._void_failed_sends(of)) from exc
        if of is not None:
            of.parts.append(in_flight)
        return in_flight

    async def _void_failed_sends(self, many: ManyState, raise_error: bool = False) -> TransactionRecord | None:
        """Mark the sends of ``many`` that did not return in its record (they are never published), then roll back
        the half messages they may have written. Returns the record, or None when it could not be written (then
        ``raise_error`` raises: no further message may be sent before the failed ones are marked)."""
        if raise_error and many.decided_by_other is not None:
            raise many.decided_while_open(many.decided_by_other)
        pending = set(many.unvoided)
        if not pending:
            return None
        try:
            record = await self.broker.decide(
                many.transaction_id, self.producer_group, RecordAction.VOID, EndSource.PRODUCER, pending
            )
        except TxMQError as exc:
            refusal = many.not_marked(pending, exc)
            if raise_error:
                raise refusal from exc
            return None
        many.voided(pending, record)
        await self._roll_back_failed_sends(many, many.to_roll_back(record, pending))
        if raise_error and record.outcome is not None:
            raise many.decided_while_open(record)
        return record

    async def _release(self, many: ManyState, indices: set[int]) -> None:
        """Best effort: a record left pinned is released when its messages are ended or resolved later."""
        if not indices:
            return
        try:
            await self.broker.decide(
                many.transaction_id, self.producer_group, RecordAction.UNPIN, EndSource.PRODUCER, indices
            )
        except TxMQError as exc:
            logger.info("tx=%s record not released for %s: %s", many.transaction_id, sorted(indices), exc)

    async def _roll_back_failed_sends(self, many: ManyState, indices: set[int]) -> None:
        """Best effort: a half message left behind is rolled back by the checker (the record voids it)."""
        try:
            await self.broker.end_transactions(many.rollback_calls(indices))
        except TxMQError as exc:
            logger.info("tx=%s failed sends %s left to the check-back: %s", many.transaction_id, sorted(indices), exc)

    async def _end_many(
        self, many: ManyState, state: LocalTransactionState, remark: str | None
    ) -> list[TransactionSendResult]:
        """Decide once (with the sends that did not return, never published), then end every message with the
        decision in one batch. A decision that cannot be written leaves every message in flight: the check-back
        asks about the transaction's id. Shielded on asyncio: once the decision is under way, a cancelled caller
        does not stop it half-way (the check-back would finish it)."""
        ended: Any = None
        if many.decides(state):
            try:
                state, ended = await async_shield(self._decide_and_end(many, state, remark))
            except TxMQError as exc:
                ended = exc
        elif many.failed:
            await async_shield(self._void_failed_sends(many))
        return many.finish(state, remark, ended)

    async def _decide_and_end(
        self, many: ManyState, state: LocalTransactionState, remark: str | None
    ) -> tuple[LocalTransactionState, list[Any]]:
        record = await self.broker.decide(
            many.transaction_id, self.producer_group, state, EndSource.PRODUCER, many.failed, unconfirmed_ok=True
        )
        many.voided(set(many.failed))
        state = many.standing(state, record)
        ended = await self.broker.end_transactions(many.end_calls(state, remark))
        await self._release(many, many.ended_while_pinned(record, ended))
        if many.failed:
            await self._roll_back_failed_sends(many, many.to_roll_back(record, set(many.failed)))
        return state, ended

    async def _end(
        self,
        tx: InFlight,
        state: LocalTransactionState,
        remark: str | None,
        on_cancel: Callable[[TransactionSendResult], None] | None = None,
    ) -> TransactionSendResult:
        if tx.trace is None:
            return await self._end_call(tx, state, remark, on_cancel)
        try:
            result = await self._end_call(tx, state, remark, on_cancel)
        except BaseException as exc:
            tracing.finish_send(tx.trace, None, exc)
            raise
        tracing.finish_send(tx.trace, result)
        return result

    async def _end_call(
        self,
        tx: InFlight,
        state: LocalTransactionState,
        remark: str | None,
        on_cancel: Callable[[TransactionSendResult], None] | None,
    ) -> TransactionSendResult:
        end = tx.end_call(state, remark)
        if end is None:
            return tx.result(state, remark)
        if self._flusher is not None:
            try:
                await self._flusher.submit(end)
            except TxMQError as exc:
                return tx.result(state, remark, end_error=tx.end_failed(state, exc))
            return tx.result(state, remark, end_queued=True)
        try:
            committed_id = await async_shield(self._background.spawn(self._apply(end)))
        except TxMQError as exc:
            return tx.result(state, remark, end_error=tx.end_failed(state, exc))
        except AsyncCancelled:
            if on_cancel is not None:
                on_cancel(
                    tx.result(
                        state,
                        remark,
                        end_error="cancelled while the end call was under way: it goes on in the background, and "
                        "the check-back resolves the transaction if it fails",
                    )
                )
            raise
        return tx.result(state, remark, committed_id=committed_id)

    async def _apply(self, end: EndCall) -> str | None:
        """The end call; on asyncio it runs to its end even when the send that started it was cancelled."""
        return (await self.broker.apply_end(end)).committed_id
