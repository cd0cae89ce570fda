"""The asyncio producer's side of the check-back: the twin of :class:`redis_txmq.check_handler.CheckRequestHandler`.

One task reads the group's check-request stream (through the consumer group of the group's live producers); each
request is answered by its own task, at most ``check_threads`` at a time and ``check_queue_size`` in hand, with the
request format, the answer and the finishing steps of :mod:`redis_txmq.check_handler`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .. import entries, tracing
from ..check_handler import (
    READ_BLOCK_MS,
    CheckRequest,
    FailingRegistrations,
    Registrations,
    hand_back,
    queue_finish,
    read_failed,
)
from ..config import Settings
from ..connection import REDIS_ERRORS, is_async_cluster
from ..errors import CorruptEntryError, TxMQConnectionError
from ..groups import (
    Backoff,
    TakeoverWalk,
    ensure_group_call,
    ensure_group_error,
    forget_consumers_call,
    read_group,
    removed_names,
)
from ..heartbeat import Heartbeat
from ..keys import PRODUCERS_CONSUMER_GROUP, REPLY_STREAM, GroupKeys
from .listener import local_state
from .scripts import preload

logger = logging.getLogger(__name__)


class AsyncCheckRequestHandler:
    """Reads check requests of one producer group and answers them with ``listener.check_local_transaction``."""

    def __init__(
        self,
        client: Any,
        producer_group: str,
        listener: Any,
        settings: Settings,
        instance_id: str,
        registrations: Callable[[], Registrations] | None = None,
    ) -> None:
        self.client = client
        self.producer_group = producer_group
        self.listener = listener
        self.settings = settings
        self.instance_id = instance_id
        self.registrations = registrations
        self.keys = GroupKeys(producer_group)
        self._cluster = is_async_cluster(client)
        self.heartbeat = Heartbeat.of_producer(client, self.keys, instance_id, settings)
        self._walk = TakeoverWalk(self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, instance_id, settings.claim_idle)
        self._workers = asyncio.Semaphore(settings.check_threads)
        self._in_hand: dict[str, asyncio.Task[None]] = {}
        self._answering: set[str] = set()
        self._stop = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._needs_set_up = True
        self._failing = FailingRegistrations(producer_group)

    async def start(self) -> None:
        """Join the group's readers and begin answering; on a cluster whose master of this group's slot is down,
        the set-up is retried by the reader until it works."""
        try:
            await self._set_up()
        except (*REDIS_ERRORS, TxMQConnectionError) as exc:
            if not self._cluster:
                raise
            logger.warning("group=%s cannot serve check requests yet (%s); retrying", self.producer_group, exc)
        self._reader = asyncio.create_task(self._read_loop(), name=f"txmq-checks-{self.producer_group}")

    async def shutdown(self) -> None:
        """Stop reading, let the running checks finish, hand the requests not started back to other instances."""
        self._stop.set()
        if self._reader is not None:
            await self._reader
        waiting = [rid for rid in self._in_hand if rid not in self._answering]
        for rid in waiting:
            self._in_hand[rid].cancel()
        await asyncio.gather(*list(self._in_hand.values()), return_exceptions=True)
        try:
            if waiting:
                await hand_back(self.client, self.keys, self.instance_id, waiting, self.settings.claim_idle)
                logger.info("group=%s handed back %d check requests", self.producer_group, len(waiting))
            await self.heartbeat.call("leave")
        except REDIS_ERRORS as exc:
            logger.warning("group=%s could not hand back check requests on shutdown: %s", self.producer_group, exc)

    async def _set_up(self) -> None:
        try:
            await self.client.eval(*ensure_group_call(self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, "0"))
        except REDIS_ERRORS as exc:
            raise ensure_group_error(self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, exc) from exc
        await preload(self.heartbeat.script)
        await self._beat()
        self._needs_set_up = False

    async def _beat(self) -> None:
        """Heartbeat, and re-assert the registries (see the sync handler): Redis that lost its data heals. A
        registration that fails (its cluster master down) is logged and tried again next beat, the rest goes on."""
        await self.heartbeat.call("beat")
        registrations = self.registrations() if self.registrations is not None else Registrations()
        for what, method, args in registrations.calls(self.producer_group):
            try:
                await getattr(self.client, method)(*args)
            except REDIS_ERRORS as exc:
                self._failing.failed(what, exc)
            else:
                self._failing.succeeded(what)

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.settings.heartbeat_interval
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                if self._needs_set_up:
                    await self._set_up()
                if loop.time() >= next_beat:
                    await self._beat()
                    next_beat = loop.time() + self.settings.heartbeat_interval
                await self._read_once()
                backoff.reset()
            except Exception as exc:  # noqa: BLE001 - the reader must outlive any failure: it answers check-backs
                delay = read_failed(self.producer_group, exc, backoff)
                if delay is None:
                    self._needs_set_up = True
                    continue
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass

    async def _read_once(self) -> None:
        room = self.settings.check_queue_size - len(self._in_hand)
        if room <= 0:
            await asyncio.wait(list(self._in_hand.values()), timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            return
        count = min(room, 100)
        if self._walk.due():
            stream, group, me = self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, self.instance_id
            cursor, claimed, *_ = await self.client.xautoclaim(
                stream, group, me, self._walk.idle_ms, start_id=self._walk.cursor, count=count
            )
            if self._walk.advance(cursor):
                self._walk.forgot(
                    removed_names(await self.client.eval(*forget_consumers_call(stream, group, me, self._walk.idle_ms)))
                )
            if claimed:
                logger.info(
                    "group=%s took over %d check requests of a dead instance", self.producer_group, len(claimed)
                )
                await self._dispatch(claimed)
                return
        stream = self.keys.check_requests
        reply = await read_group(self.client, PRODUCERS_CONSUMER_GROUP, self.instance_id, stream, count, READ_BLOCK_MS)
        for _, batch in entries.stream_batches(reply):
            await self._dispatch(batch)

    async def _dispatch(self, batch: list[Any]) -> None:
        for entry_id, fields in batch:
            request_id = entries.text(entry_id) or ""
            if fields is None:  # deleted while pending
                await self.client.xack(self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, request_id)
                continue
            if request_id not in self._in_hand:
                task = asyncio.create_task(self._answer(request_id, fields))
                self._in_hand[request_id] = task
                task.add_done_callback(lambda _, rid=request_id: self._done(rid))

    def _done(self, request_id: str) -> None:
        self._in_hand.pop(request_id, None)
        self._answering.discard(request_id)

    async def _answer(self, request_id: str, raw: Any) -> None:
        async with self._workers:
            self._answering.add(request_id)
            try:
                request = CheckRequest.parse(self.producer_group, request_id, raw)
            except CorruptEntryError as exc:
                logger.error("group %r, check request %s skipped: %s", self.producer_group, request_id, exc)
                await self._finish(request_id, None)
                return
            message = request.message
            with request.span() as span:
                state, remark = await local_state(
                    self.listener.check_local_transaction, message, "check_local_transaction", message
                )
                tracing.set_state(span, state)
            try:
                await self._finish(request_id, request.answer(self.instance_id, state, remark))
            except REDIS_ERRORS as exc:
                request.answer_failed(exc)
            logger.debug("tx=%s topic=%s answered check: %s", message.transaction_id, message.topic, state.value)

    async def _finish(self, request_id: str, reply: dict[str, Any] | None) -> None:
        """The answer, then the request's ack and delete (one MULTI on standalone; two steps on a cluster)."""
        if reply is not None and self._cluster:
            await self.client.xadd(REPLY_STREAM, reply)
            reply = None
        async with self.client.pipeline(transaction=reply is not None) as pipe:
            queue_finish(pipe, self.keys.check_requests, request_id, reply)
            await pipe.execute()
