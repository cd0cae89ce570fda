"""The producer's side of the check-back: answer check requests of its group (RocketMQ's checkTransactionState).

Every live producer instance of a group reads the group's check-request stream through one consumer group, so each
request goes to one instance; ``listener.check_local_transaction`` runs on a bounded pool of workers (tasks of the
asyncio producer, threads of the sync one) and the answer goes to the reply stream, which the checkers apply with the
same end script as the producer. A request left unanswered by an instance that died is taken over by another one after
``claim_idle``. What a request is and how it is finished lives in ``redis_txmq.core.check_requests``; the asyncio
handler's module is the source, the sync one's is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..core import entries, tracing
from ..core.check_requests import (
    READ_BLOCK_MS,
    CheckRequest,
    FailingRegistrations,
    Registrations,
    hand_back,
    queue_finish,
    read_failed,
)
from ..core.clients import REDIS_ERRORS, is_cluster
from ..core.config import Settings
from ..core.errors import CorruptEntryError, TxMQConnectionError
from ..core.groups import (
    Backoff,
    TakeoverWalk,
    ensure_group_call,
    ensure_group_error,
    forget_consumers_call,
    read_group,
    removed_names,
)
from ..core.heartbeat import Heartbeat
from ..core.keys import PRODUCERS_CONSUMER_GROUP, REPLY_STREAM, GroupKeys
from ..transport.synchronization import AsyncEvent, AsyncWorker, AsyncWorkerPool
from .listener import local_state
from .preload import preload

__all__ = ["AsyncCheckRequestHandler", "Registrations", "queue_finish"]

logger = logging.getLogger(__name__)

ROOM_WAIT = 0.5
"""How long the reader waits for a worker to free up before it looks at its stop event and heartbeat again."""


class AsyncCheckRequestHandler:
    """Reads check requests of one producer group and answers them with ``listener.check_local_transaction`` on at
    most ``check_threads`` workers, holding at most ``check_queue_size`` requests at once."""

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
        self._cluster = is_cluster(client)
        self.heartbeat = Heartbeat.of_producer(client, self.keys, instance_id, settings)
        self._walk = TakeoverWalk(self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, instance_id, settings.claim_idle)
        self._pool = AsyncWorkerPool(settings.check_threads, f"txmq-check-{producer_group}")
        self._stop = AsyncEvent()
        self._reader = AsyncWorker(self._read_loop, name=f"txmq-checks-{producer_group}")
        self._needs_set_up = True
        self._failing = FailingRegistrations(producer_group)

    async def start(self) -> None:
        """Join the group's readers and begin answering. On a Redis Cluster whose master of this group's slot is
        down, the set-up is logged and retried by the reader until it works: the producer can send meanwhile."""
        try:
            await self._set_up()
        except (*REDIS_ERRORS, TxMQConnectionError) as exc:
            if not self._cluster:
                raise
            logger.warning("group=%s cannot serve check requests yet (%s); retrying", self.producer_group, exc)
        self._reader.start()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Stop reading, let the running checks finish, hand the requests not started back to other instances."""
        self._stop.set()
        await self._reader.join(timeout)
        handed_back = await self._pool.shutdown()
        try:
            if handed_back:
                await hand_back(self.client, self.keys, self.instance_id, handed_back, self.settings.claim_idle)
                logger.info("group=%s handed back %d check requests", self.producer_group, len(handed_back))
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
        """Heartbeat, and re-assert the registries (this group, and the producer's ``registrations``: the topic
        streams it wrote to and its topics' partition counts): a Redis that lost its data (restart without
        persistence, failover to a lagging replica) heals within a beat. Only the heartbeat's failure fails the
        beat: a registration that fails (on a cluster master that is down) is logged and tried again next beat."""
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
        next_beat = time.monotonic() + self.settings.heartbeat_interval
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                if self._needs_set_up:
                    await self._set_up()
                    logger.info("group=%s serving check requests", self.producer_group)
                if time.monotonic() >= next_beat:
                    await self._beat()
                    next_beat = time.monotonic() + self.settings.heartbeat_interval
                await self._read_once()
                backoff.reset()
            except Exception as exc:  # noqa: BLE001 - the reader must outlive any failure: it answers check-backs
                delay = read_failed(self.producer_group, exc, backoff)
                if delay is None:
                    self._needs_set_up = True
                    continue
                await self._stop.wait(delay)

    async def _read_once(self) -> None:
        room = await self._pool.wait_for_room(self.settings.check_queue_size, ROOM_WAIT)
        if room == 0:
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
            self._pool.submit(request_id, self._answer, request_id, fields)

    async def _answer(self, request_id: str, raw: Any) -> None:
        try:
            request = CheckRequest.parse(self.producer_group, request_id, raw)
        except CorruptEntryError as exc:
            logger.error("group %r, check request %s skipped: %s", self.producer_group, request_id, exc)
            await self._finish(request_id)
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

    async def _finish(self, request_id: str, reply: dict[str, Any] | None = None) -> None:
        """Send the answer, then delete and acknowledge the request: never the request gone without its answer.

        Standalone: one MULTI / EXEC (a refused XADD, e.g. out of memory, discards the whole of it). Cluster: the
        two streams live in different slots, so the answer first, the rest after it succeeded."""
        if reply is not None and self._cluster:
            await self.client.xadd(REPLY_STREAM, reply)
            reply = None
        async with self.client.pipeline(transaction=reply is not None) as pipe:
            queue_finish(pipe, self.keys.check_requests, request_id, reply)
            await pipe.execute()
