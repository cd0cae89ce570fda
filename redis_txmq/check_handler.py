"""The producer's side of the check-back: answer check requests of its group (RocketMQ's checkTransactionState).

Every live producer instance of a group reads the group's check-request stream through one consumer group, so
each request goes to one instance; ``listener.check_local_transaction`` runs on a bounded worker pool and the
answer goes to the reply stream, which the checkers apply with the same end script as the producer.
A request left unanswered by an instance that died is taken over by another one after ``claim_idle``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster

from . import entries, tracing
from .config import Settings
from .connection import REDIS_ERRORS
from .errors import CorruptEntryError, TxMQConnectionError
from .groups import Backoff, PendingTakeover, ensure_consumer_group, is_missing_group, read_group
from .heartbeat import Heartbeat
from .keys import GROUP_REGISTRY, PRODUCERS_CONSUMER_GROUP, REPLY_STREAM, TOPIC_REGISTRY, GroupKeys
from .listener import TransactionListener, local_state
from .message import LocalTransactionState, Message, time_of_entry_id
from .topics import restore_partitions_call

logger = logging.getLogger(__name__)

READ_BLOCK_MS = 100
"""How long one read waits for requests: also the longest a shutdown waits for the reader."""


@dataclass(frozen=True)
class Registrations:
    """What a producer re-asserts with every heartbeat: the topic streams it wrote to, its topics' partitions."""

    streams: frozenset[str] = frozenset()
    partitions: dict[str, int] = field(default_factory=dict)

    def calls(self, producer_group: str) -> list[tuple[str, str, tuple[Any, ...]]]:
        """``(what, client method, arguments)`` of each registration: the producer group and the topic streams in
        their registries, each topic's partition count in its own slot. One call each, made and failing on its
        own: on a Redis Cluster they live on different masters, and one that is down must not stop the others."""
        calls: list[tuple[str, str, tuple[Any, ...]]] = [
            (f"producer group in {GROUP_REGISTRY}", "sadd", (GROUP_REGISTRY, producer_group))
        ]
        if self.streams:
            calls.append((f"topic streams in {TOPIC_REGISTRY}", "sadd", (TOPIC_REGISTRY, *sorted(self.streams))))
        for topic, count in sorted(self.partitions.items()):
            calls.append((f"partitions of topic {topic!r}", "eval", restore_partitions_call(topic, count)))
        return calls


class FailingRegistrations:
    """The registrations that failed at the last beat (their master down, say): a failure is logged when it
    starts and when it ends, not at every beat."""

    def __init__(self, producer_group: str) -> None:
        self.producer_group = producer_group
        self._failing: set[str] = set()

    def succeeded(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            logger.info("group=%s re-asserts the %s again", self.producer_group, what)

    def failed(self, what: str, exc: Exception) -> None:
        if what not in self._failing:
            self._failing.add(what)
            logger.warning(
                "group=%s could not re-assert the %s: %s; retried with every heartbeat, the rest goes on",
                self.producer_group,
                what,
                exc,
            )


@dataclass(slots=True)
class CheckRequest:
    """A check request as a producer reads it, and the answer it sends (the protocol both handlers share)."""

    producer_group: str
    request_id: str
    message: Message
    """What the listener checks: for a message of a transaction of several, ``transaction_id`` is that
    transaction's id (the one stored with the local transaction's data), not the message's own."""
    stream: str
    half_id: str
    requested_ms: bytes
    transaction_id: str
    """The half message's own transaction id: what the answer ends."""
    parent_transaction_id: str = ""

    @classmethod
    def parse(cls, producer_group: str, request_id: str, raw: Any) -> CheckRequest:
        """Raises :class:`CorruptEntryError` for a request this library did not write."""
        fields = entries.field_map(raw)
        where = f"group {producer_group!r}, check request {request_id}"
        message = entries.message_from_fields(fields, where)
        stream, half_id = entries.text(fields.get(entries.STREAM)), entries.text(fields.get(entries.HALF_ID))
        if not stream or not half_id:
            raise CorruptEntryError(f"{where}: missing field(s) stream / half_id")
        message.prepared_at = time_of_entry_id(half_id)
        own_id = message.transaction_id or ""
        parent = entries.text(fields.get(entries.PARENT_TRANSACTION_ID)) or ""
        if parent:
            message.transaction_id = parent
        requested_ms = fields.get(entries.REQUESTED_MS, b"")
        return cls(producer_group, request_id, message, stream, half_id, requested_ms, own_id, parent)

    def span(self) -> Any:
        """The ``check <topic>`` span of answering this request, linked to the send (a no-op when tracing is off)."""
        message = self.message
        return tracing.span_for(
            "check",
            message.topic,
            transaction_id=message.transaction_id,
            group=self.producer_group,
            properties=message.properties,
        )

    def answer(self, producer: str, state: LocalTransactionState, remark: str | None) -> dict[str, Any]:
        """The fields of the answer on the reply stream."""
        return {
            entries.STREAM: self.stream,
            entries.TOPIC: self.message.topic,
            entries.TRANSACTION_ID: self.transaction_id,
            entries.PARENT_TRANSACTION_ID: self.parent_transaction_id,
            entries.PRODUCER_GROUP: self.producer_group,
            entries.HALF_ID: self.half_id,
            entries.STATE: state.value,
            entries.REMARK: remark or "",
            entries.REQUESTED_MS: self.requested_ms,
            entries.PRODUCER: producer,
            **tracing.carried(self.message.properties),
        }

    def answer_failed(self, exc: Exception) -> None:
        logger.warning(
            "tx=%s topic=%s could not send the check answer: %s; it will be asked again",
            self.message.transaction_id,
            self.message.topic,
            exc,
        )


def read_failed(producer_group: str, exc: Exception, backoff: Backoff) -> float | None:
    """What the check-request reader does after a failure: None to set up again (the consumer group is gone: Redis
    lost its data), else how long to wait before the next try. Logged; an unexpected error with its traceback."""
    if is_missing_group(exc):
        logger.warning(
            "group=%s: the check-request consumer group is gone (Redis lost its data?); recreating it", producer_group
        )
        return None
    delay = backoff.next()
    expected = isinstance(exc, (*REDIS_ERRORS, TxMQConnectionError))
    logger.warning(
        "group=%s reading check requests failed: %s; retrying in %.1f s",
        producer_group,
        exc,
        delay,
        exc_info=None if expected else exc,
    )
    return delay


def hand_back(client: Any, keys: GroupKeys, instance_id: str, request_ids: list[str], claim_idle: float) -> Any:
    """Requests read and not started, handed back on shutdown: claimed with an idle time that makes them claimable
    by another instance right away. The XCLAIM's reply (an awaitable on a ``redis.asyncio`` client)."""
    return client.xclaim(
        keys.check_requests,
        PRODUCERS_CONSUMER_GROUP,
        instance_id,
        0,
        request_ids,
        idle=int(claim_idle * 1000),
        justid=True,
    )


def queue_finish(pipe: Any, requests_stream: str, request_id: str, reply: dict[str, Any] | None) -> None:
    """Queue on a (sync or asyncio) pipeline the answer (when there is one), then the request's delete and ack.

    Delete before ack: off a MULTI (a cluster), the checker may retire the request between the two, and it takes a
    request that it finds deleted but still pending as read (the ack the other way round would leave one neither
    pending nor deleted: never read, its check given back, so ``check_max`` would never be reached)."""
    if reply is not None:
        pipe.xadd(REPLY_STREAM, reply)
    pipe.xdel(requests_stream, request_id)
    pipe.xack(requests_stream, PRODUCERS_CONSUMER_GROUP, request_id)


class CheckRequestHandler:
    """Reads check requests of one producer group and answers them on ``check_threads`` workers."""

    def __init__(
        self,
        client: Any,
        producer_group: str,
        listener: TransactionListener,
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
        self._cluster = isinstance(client, RedisCluster)
        self.heartbeat = Heartbeat.of_producer(client, self.keys, instance_id, settings)
        self._pool = ThreadPoolExecutor(settings.check_threads, thread_name_prefix=f"txmq-check-{producer_group}")
        self._in_hand: dict[str, Future[None]] = {}
        self._room = threading.Condition()
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        self._takeover = PendingTakeover(
            client, self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, instance_id, settings.claim_idle
        )
        self._needs_set_up = True
        self._failing = FailingRegistrations(producer_group)

    def start(self) -> None:
        """Join the group's readers and begin answering. On a Redis Cluster whose master of this group's slot is
        down, the set-up is logged and retried by the reader until it works: the producer can send meanwhile."""
        try:
            self._set_up()
        except (*REDIS_ERRORS, TxMQConnectionError) as exc:
            if not self._cluster:
                raise
            logger.warning("group=%s cannot serve check requests yet (%s); retrying", self.producer_group, exc)
        self._reader = threading.Thread(target=self._read_loop, name=f"txmq-checks-{self.producer_group}", daemon=True)
        self._reader.start()

    def _set_up(self) -> None:
        ensure_consumer_group(self.client, self.keys.check_requests, PRODUCERS_CONSUMER_GROUP)
        self.heartbeat.load()
        self._beat()
        self._needs_set_up = False

    def _beat(self) -> None:
        """Heartbeat, and re-assert the registries (this group, and the producer's ``registrations``: the topic
        streams it wrote to and its topics' partition counts): a Redis that lost its data (restart without
        persistence, failover to a lagging replica) heals within a beat. Only the heartbeat's failure fails the
        beat: a registration that fails (on a cluster master that is down) is logged and tried again next beat."""
        self.heartbeat.beat()
        registrations = self.registrations() if self.registrations is not None else Registrations()
        for what, method, args in registrations.calls(self.producer_group):
            try:
                getattr(self.client, method)(*args)
            except REDIS_ERRORS as exc:
                self._failing.failed(what, exc)
            else:
                self._failing.succeeded(what)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop reading, finish the checks that are running, hand the queued ones back to other instances."""
        self._stop.set()
        with self._room:
            self._room.notify_all()
        if self._reader is not None:
            self._reader.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._room:
            handed_back = [entry_id for entry_id, future in self._in_hand.items() if future.cancelled()]
        try:
            if handed_back:
                hand_back(self.client, self.keys, self.instance_id, handed_back, self.settings.claim_idle)
                logger.info("group=%s handed back %d check requests", self.producer_group, len(handed_back))
            self.heartbeat.leave()
        except REDIS_ERRORS as exc:
            logger.warning("group=%s could not hand back check requests on shutdown: %s", self.producer_group, exc)

    def _read_loop(self) -> None:
        next_beat = time.monotonic() + self.settings.heartbeat_interval
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                if self._needs_set_up:
                    self._set_up()
                    logger.info("group=%s serving check requests", self.producer_group)
                now = time.monotonic()
                if now >= next_beat:
                    self._beat()
                    next_beat = now + self.settings.heartbeat_interval
                self._read_once()
                backoff.reset()
            except Exception as exc:  # noqa: BLE001 - the reader must outlive any failure: it answers check-backs
                delay = read_failed(self.producer_group, exc, backoff)
                if delay is None:
                    self._needs_set_up = True
                    continue
                self._stop.wait(delay)

    def _read_once(self) -> None:
        room = self._wait_for_room()
        if room == 0:
            return
        abandoned = self._takeover.claim(min(room, 100))
        if abandoned:
            logger.info("group=%s took over %d check requests of a dead instance", self.producer_group, len(abandoned))
            self._dispatch(abandoned)
            return
        stream, count = self.keys.check_requests, min(room, 100)
        reply = read_group(self.client, PRODUCERS_CONSUMER_GROUP, self.instance_id, stream, count, READ_BLOCK_MS)
        for _, batch in entries.stream_batches(reply):
            self._dispatch(batch)

    def _wait_for_room(self) -> int:
        with self._room:
            while len(self._in_hand) >= self.settings.check_queue_size and not self._stop.is_set():
                self._room.wait(0.5)
            return max(0, self.settings.check_queue_size - len(self._in_hand))

    def _dispatch(self, batch: list[Any]) -> None:
        for entry_id, fields in batch:
            request_id = entries.text(entry_id) or ""
            if fields is None:  # deleted while pending
                self.client.xack(self.keys.check_requests, PRODUCERS_CONSUMER_GROUP, request_id)
                continue
            with self._room:
                if request_id in self._in_hand:
                    continue
                future = self._pool.submit(self._answer, request_id, fields)
                self._in_hand[request_id] = future
            future.add_done_callback(functools.partial(self._done, request_id))

    def _done(self, request_id: str, _: Future[None]) -> None:
        with self._room:
            future = self._in_hand.get(request_id)
            if future is not None and not future.cancelled():
                del self._in_hand[request_id]
            self._room.notify_all()

    def _answer(self, request_id: str, raw: Any) -> None:
        try:
            request = CheckRequest.parse(self.producer_group, request_id, raw)
        except CorruptEntryError as exc:
            logger.error("group %r, check request %s skipped: %s", self.producer_group, request_id, exc)
            self._finish(request_id)
            return
        message = request.message
        with request.span() as span:
            state, remark = local_state(
                lambda: self.listener.check_local_transaction(message), message, "check_local_transaction"
            )
            tracing.set_state(span, state)
        try:
            self._finish(request_id, request.answer(self.instance_id, state, remark))
        except REDIS_ERRORS as exc:
            request.answer_failed(exc)
        logger.debug("tx=%s topic=%s answered check: %s", message.transaction_id, message.topic, state.value)

    def _finish(self, request_id: str, reply: dict[str, Any] | None = None) -> None:
        """Send the answer, then acknowledge and delete the request: never the request gone without its answer.

        Standalone: one MULTI / EXEC (a refused XADD, e.g. out of memory, discards the whole of it). Cluster: the
        two streams live in different slots, so the answer first, the acknowledgement after it succeeded."""
        if reply is not None and self._cluster:
            self.client.xadd(REPLY_STREAM, reply)
            reply = None
        pipe = self.client.pipeline(transaction=reply is not None)
        queue_finish(pipe, self.keys.check_requests, request_id, reply)
        pipe.execute()
