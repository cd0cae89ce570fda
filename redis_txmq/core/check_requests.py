"""The check-back as a producer sees it, without I/O: the request it reads, the answer it sends, how it finishes a
request, what it re-asserts with its heartbeat and what a failed read means. The check-request handlers (the
asyncio one and the sync one generated from it) do only the I/O between these steps."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..core.clients import REDIS_ERRORS
from . import entries, tracing
from .errors import CorruptEntryError, TxMQConnectionError
from .groups import Backoff, is_missing_group
from .keys import GROUP_REGISTRY, PRODUCERS_CONSUMER_GROUP, REPLY_STREAM, TOPIC_REGISTRY, GroupKeys
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
        """Raises [`CorruptEntryError`][redis_txmq.core.errors.CorruptEntryError] for a request this library did not
        write."""
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
