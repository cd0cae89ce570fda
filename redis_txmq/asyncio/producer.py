"""The transactional producer for asyncio services: the twin of :class:`redis_txmq.TransactionProducer`.

The steps of a send (:mod:`redis_txmq.sending`), the scripts' arguments and replies (:mod:`redis_txmq.protocol`) and
the check-request format are the sync producer's; only the I/O is awaited. Cancellation is an outcome, never a loss:
cancelled before the half message is written, nothing is written; during the local transaction, the transaction
stays in flight for the check-back (never a blind COMMIT or ROLLBACK); during the end call, the end goes on in the
background (shielded) and, should it fail, the check-back resolves it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from .. import tracing
from ..check_handler import Registrations
from ..config import Settings
from ..connection import REDIS_ERRORS, instance_id, resolve_client
from ..errors import InvalidMessageError, ProducerStateError, TxMQConnectionError, TxMQError
from ..keys import topic_meta_key
from ..listener import TransactionListener as SyncTransactionListener
from ..message import LocalTransactionState, Message, TransactionSendResult, validate_name
from ..protocol import EndCall, EndSource, RecordAction, TransactionRecord
from ..sending import (
    CheckerListener,
    HandleState,
    InFlight,
    ManyHandleState,
    ManyState,
    listener_of,
    new_send,
    outcome_of_block,
    routing_error,
)
from ..topics import PartitionRouter, count_of
from .broker import AsyncRedisBroker
from .check_handler import AsyncCheckRequestHandler
from .listener import TransactionListener, local_state
from .oneway import AsyncEndFlusher

logger = logging.getLogger(__name__)

Listener = TransactionListener | SyncTransactionListener


class TransactionProducer:
    """Sends messages in transactions from asyncio code; while started it answers check-backs of its group.

    Takes an asyncio :class:`TransactionListener` (a sync :class:`redis_txmq.TransactionListener` works too: its
    methods run in a thread), or only ``checker=`` for a producer used through :meth:`transaction` handles. Pass
    ``redis_url`` or ``client`` (a ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster`` with
    ``decode_responses=False``). ``oneway_end=True`` queues end calls for a background task (:meth:`flush`).
    ``durability`` (``"master"``, ``"replica"`` or ``"aof"``) overrides ``settings.durability`` for this producer
    (:mod:`redis_txmq.durability`).
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
        self.listener: Any = listener_of(
            producer_group, listener, checker, (TransactionListener, SyncTransactionListener)
        )
        if durability is not None:  # checked by Settings (a ConfigurationError names the levels) before connecting
            settings = replace(settings if settings is not None else Settings.from_env(), durability=durability)
        self.client, self.settings, self._owns_client = resolve_client(redis_url, client, settings, asyncio=True)
        self.broker = AsyncRedisBroker(self.client, self.settings)
        self.instance_id = instance_id("producer")
        self._check_handler = AsyncCheckRequestHandler(
            self.client, self.producer_group, self.listener, self.settings, self.instance_id, self._registrations
        )
        self._router = PartitionRouter(self.client)
        self.oneway_end = oneway_end
        self._flusher = AsyncEndFlusher(self.broker, self.settings, self.producer_group) if oneway_end else None
        self._running = False
        self._shut_down = False
        self._ending: set[asyncio.Task[Any]] = set()

    async def start(self) -> TransactionProducer:
        """Load the scripts and begin serving check requests. Raises :class:`TxMQConnectionError` when Redis cannot
        be reached; a shut-down producer cannot restart."""
        if self._shut_down:
            raise ProducerStateError(
                f"producer group {self.producer_group!r}: this producer was shut down; create a new one"
            )
        if not self._running:
            await self.broker.load_scripts()
            try:
                await self._check_handler.start()
            except REDIS_ERRORS as exc:
                raise TxMQConnectionError(
                    f"producer group {self.producer_group!r}: could not start serving check requests: {exc}"
                ) from exc
            if self._flusher is not None:
                self._flusher.start()
            self._running = True
        return self

    async def shutdown(self) -> None:
        """Stop sending and answering: queued one-way ends and ends under way are applied, running checks finish,
        queued check requests are handed back. Closes the client the producer made itself."""
        if self._shut_down:
            return
        was_running, self._running, self._shut_down = self._running, False, True
        if was_running:
            if self._flusher is not None:
                await self._flusher.close()
            await asyncio.gather(*self._ending, return_exceptions=True)
            await self._check_handler.shutdown()
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> TransactionProducer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every end a one-way producer queued before this call was applied; True at once otherwise."""
        return True if self._flusher is None else await self._flusher.flush(timeout)

    @property
    def pending_ends(self) -> int:
        return 0 if self._flusher is None else self._flusher.pending

    async def send_message_in_transaction(self, message: Message, arg: Any = None) -> TransactionSendResult:
        """Prepare the half message, run the local transaction, then commit or roll back (see the sync producer).
        A task cancelled here: see the module's docstring."""
        if isinstance(self.listener, CheckerListener):
            self.listener.execute_local_transaction(message, arg)
        tx = await self._prepare(message)
        state, remark = await local_state(
            self.listener.execute_local_transaction, tx.message, "local transaction", tx.message, arg
        )
        return await self._end(tx, state, remark)

    async def send_messages_in_transaction(
        self, messages: list[Message], arg: Any = None
    ) -> list[TransactionSendResult]:
        """Several messages in one transaction: all become visible, each once, or none (see the sync producer)."""
        if not messages:
            raise InvalidMessageError(f"producer group {self.producer_group!r}: no messages to send")
        if isinstance(self.listener, CheckerListener):
            self.listener.execute_local_transaction(messages[0], arg)
        async with AsyncTransactionOfMany(self) as tx:
            for message in messages:
                await tx.send(message)
            first = tx.state.listener_message()
            state, remark = await local_state(
                self.listener.execute_local_transaction, first, "local transaction", first, arg
            )
            await tx.end(state, remark)
        return tx.results

    def transaction(self, message: Message | None = None) -> AsyncTransaction | AsyncTransactionOfMany:
        """A transaction handle: ``async with producer.transaction(message) as tx:`` writes the half message, the
        block is the local transaction, leaving it commits (rolls back when it raised; leaves the transaction to
        the check-back when it was cancelled). Without a message, the block sends its messages with
        ``await tx.send(message)``: all of them become visible at the end, each once, or none does."""
        if message is None:
            return AsyncTransactionOfMany(self)
        return AsyncTransaction(self, message)

    async def _prepare(self, message: Message, of: ManyState | None = None) -> InFlight:
        if not self._running:
            raise ProducerStateError(
                f"producer group {self.producer_group!r}: await start() (or use `async with`) before sending"
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
            if not isinstance(exc, Exception):  # cancelled: mark it in the background (shutdown() waits for it)
                self._in_background(self._void_failed_sends(of))
                raise
            raise of.failed_send_error(sent, exc, await self._void_failed_sends(of)) from exc
        if of is not None:
            of.parts.append(in_flight)
        return in_flight

    def _in_background(self, work: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
        return task

    async def _void_failed_sends(self, many: ManyState, raise_error: bool = False) -> TransactionRecord | None:
        """Mark the sends that did not return in the record, then roll back their half messages (see the sync
        producer); None when the record could not be written."""
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
        """Decide once, then end every message with the decision (see the sync producer). Shielded: once the
        decision is under way, a cancelled caller does not stop it half-way (the check-back would finish it)."""
        ended: Any = None
        if many.decides(state):
            try:
                state, ended = await asyncio.shield(self._decide_and_end(many, state, remark))
            except TxMQError as exc:
                ended = exc
        elif many.failed:
            await asyncio.shield(self._void_failed_sends(many))
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
        ending = self._in_background(self._apply(end))
        try:
            committed_id = await asyncio.shield(ending)
        except TxMQError as exc:
            return tx.result(state, remark, end_error=tx.end_failed(state, exc))
        except asyncio.CancelledError:
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
        """The end call; runs to its end even when the send that started it was cancelled (it is shielded)."""
        result = await self.broker.end_transaction(
            end.keys,
            end.transaction_id,
            end.producer_group,
            end.outcome,
            source=end.source,
            remark=end.remark,
            half_id=end.half_id,
        )
        return result.committed_id

    def _registrations(self) -> Registrations:
        """Re-asserted with every heartbeat: the topic streams this producer wrote to (the checker walks them) and
        the partition counts of its topics (a producer started after Redis lost them would write every message to
        one partition)."""
        return Registrations(self.broker.registered_streams(), self._router.partitioned_topics())


class AsyncTransaction(HandleState):
    """One transaction of the asyncio producer (see :class:`redis_txmq.transaction.Transaction`). Leaving the block
    commits, or rolls back when it raised; cancelled (``CancelledError``, an expired ``asyncio.timeout``), the
    transaction stays in flight for the check-back. Cancelled during the end call, :attr:`result` reports it."""

    def __init__(self, producer: TransactionProducer, message: Message) -> None:
        super().__init__(message)
        self._producer = producer

    async def __aenter__(self) -> AsyncTransaction:
        self._in_flight = await self._producer._prepare(self._message)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.ended and self._in_flight is not None:
            await self._end(*outcome_of_block(exc_type, exc))

    async def commit(self) -> TransactionSendResult:
        """Commit now; leaving the block later changes nothing."""
        return await self._end(LocalTransactionState.COMMIT, None)

    async def rollback(self) -> TransactionSendResult:
        """Roll back now, without an exception."""
        return await self._end(LocalTransactionState.ROLLBACK, None)

    async def _end(self, state: LocalTransactionState, remark: str | None) -> TransactionSendResult:
        if self.result is None:
            self.result = await self._producer._end(
                self.in_flight, state, remark, on_cancel=lambda result: setattr(self, "result", result)
            )
        return self.result


class AsyncTransactionOfMany(ManyHandleState):
    """A transaction of several messages of the asyncio producer (see
    :class:`redis_txmq.transaction.TransactionOfMany`); cancelled, it stays in flight for the check-back."""

    def __init__(self, producer: TransactionProducer) -> None:
        super().__init__(producer.producer_group, producer.settings.max_transaction_messages)
        self._producer = producer

    async def __aenter__(self) -> AsyncTransactionOfMany:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.state.ended:
            await self.end(*outcome_of_block(exc_type, exc))

    async def send(self, message: Message) -> Message:
        """Write ``message`` as a half message of this transaction; returns the copy that was written."""
        return (await self._producer._prepare(message, self.state)).message

    async def commit(self) -> list[TransactionSendResult]:
        return await self.end(LocalTransactionState.COMMIT, None)

    async def rollback(self) -> list[TransactionSendResult]:
        return await self.end(LocalTransactionState.ROLLBACK, None)

    async def end(self, state: LocalTransactionState, remark: str | None) -> list[TransactionSendResult]:
        """End with ``state`` (UNKNOWN leaves the transaction to the check-back); once."""
        if self.state.results is None:
            await self._producer._end_many(self.state, state, remark)
        return self.results
