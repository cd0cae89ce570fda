"""Consumer groups over topic streams: ack, re-delivery of abandoned entries, a delivery limit.

A topic stream holds committed messages only, so nothing here can see a half or rolled-back message.
Any Redis client can read the same streams with XREADGROUP; this class adds what a broker user expects.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from .config import Settings
from .connection import instance_id, redact_url, resolve_client
from .entries import ConsumedMessage, decode_topic_entry, stream_batches, text
from .errors import ConfigurationError, CorruptEntryError, TxMQConnectionError
from .groups import CURSOR_START, ensure_consumer_group, forget_dead_consumers, is_missing_group
from .keys import TopicKeys
from .message import validate_name
from .scripts import CONSUMER_PRELUDE, preload, register_script
from .topics import partition_keys

logger = logging.getLogger(__name__)

# What a lost connection, a restart or a failover looks like from redis-py (the cluster client's
# RedisClusterException is not a RedisError).
REDIS_ERRORS = (redis.RedisError, RedisClusterException)
RETRY_FIRST_DELAY = 0.1
RETRY_MAX_DELAY = 5.0


class _Backoff:
    """Delays between attempts while Redis fails: doubling from ``RETRY_FIRST_DELAY`` up to ``RETRY_MAX_DELAY``,
    with jitter so that the consumers of a restarted server do not all come back in the same millisecond."""

    def __init__(self) -> None:
        self.failures = 0

    def next_delay(self) -> float:
        delay = min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2 ** min(self.failures, 16))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography


class Consumer:
    """Reads one topic through a consumer group; each message goes to one consumer of the group.

    Unacked messages of a consumer that died are claimed by a live one after ``min_idle_time`` seconds, and the
    dead consumer's name is then removed from the group; a message delivered more than ``max_deliveries`` times
    moves to the group's dead-letter stream (``txmq:{<topic>}:consumer-dead:<group>``) with its reason instead of
    being delivered again. ``start_id`` is where a new group starts: ``"0"`` (default, nothing committed is missed)
    or ``"$"``; a group that Redis lost (restart without persistence, failover to a lagging replica) is created
    again from ``start_id`` too.

    Iteration and :meth:`run` ride out dropped connections and restarts, retrying with backoff until :meth:`stop`;
    the other methods raise :class:`~redis_txmq.errors.TxMQConnectionError` when Redis fails.
    """

    def __init__(
        self,
        topic: str,
        group: str,
        consumer_name: str | None = None,
        *,
        redis_url: str | None = None,
        client: Any = None,
        settings: Settings | None = None,
        start_id: str = "0",
        batch_size: int = 16,
        block: float = 1.0,
        min_idle_time: float = 30.0,
        max_deliveries: int = 16,
    ) -> None:
        validate_name(topic, "topic")
        self.group = validate_name(group, "consumer group")
        if not 1 <= batch_size <= 1000:
            raise ConfigurationError(f"topic {topic!r}: batch_size must be 1..1000, got {batch_size}")
        if block < 0 or min_idle_time <= 0 or max_deliveries < 1:
            raise ConfigurationError(f"topic {topic!r}: need block >= 0, min_idle_time > 0 and max_deliveries >= 1")
        self.topic = topic
        self.consumer_name = consumer_name or instance_id("consumer")
        self.start_id = start_id
        self.batch_size = batch_size
        self.block = block
        self.min_idle_time = min_idle_time
        self.max_deliveries = max_deliveries
        self._stop = threading.Event()
        self._next_claim = 0.0
        self._next_partition = 0
        try:
            self.client, self.settings, self._owns_client = resolve_client(redis_url, client, settings)
        except REDIS_ERRORS as exc:  # a cluster client connects when it is made
            raise TxMQConnectionError(
                f"{self._where}: could not connect to Redis: {exc}; check redis_url (or TXMQ_REDIS_URL) and that "
                "Redis is reachable, then create the consumer again"
            ) from exc
        try:
            self.partitions = partition_keys(self.client, topic)
            self._by_stream = {keys.topic_stream: keys for keys in self.partitions}
            self._claim = register_script(self.client, "consumer_claim", CONSUMER_PRELUDE)
            self._dead_letter = register_script(self.client, "consumer_dead_letter", CONSUMER_PRELUDE)
            self._claim_cursors = {keys.topic_stream: CURSOR_START for keys in self.partitions}
            for keys in self.partitions:
                ensure_consumer_group(self.client, keys.topic_stream, self.group, start_id)
            preload(self._claim, self._dead_letter)
        except (TxMQConnectionError, *REDIS_ERRORS) as exc:
            if self._owns_client:
                self.client.close()
            where = redact_url(self.settings.redis_url) if self._owns_client else "the client's server"
            raise TxMQConnectionError(
                f"{self._where}: could not set up the consumer group: {exc}; check that Redis ({where}) is "
                "reachable, then create the consumer again"
            ) from exc

    @property
    def _where(self) -> str:
        return f"topic {self.topic!r}, group {self.group!r}"

    def _error(self, action: str, exc: BaseException, then: str) -> TxMQConnectionError:
        return TxMQConnectionError(f"{self._where}: {action} failed: {exc}; {then}")

    @property
    def dead_streams(self) -> list[str]:
        """The keys of this group's dead-letter streams, one per partition."""
        return [keys.consumer_dead_stream(self.group) for keys in self.partitions]

    def _script_keys(self, keys: TopicKeys) -> list[str]:
        return [keys.topic_stream, keys.consumer_dead_stream(self.group)]

    def poll(self, timeout: float | None = None) -> list[ConsumedMessage]:
        """Up to ``batch_size`` messages: abandoned ones first, then new ones (waiting up to ``timeout``).

        Raises :class:`~redis_txmq.errors.TxMQConnectionError` when Redis cannot be reached (iteration and
        :meth:`run` retry instead). A consumer group that Redis lost is created again from ``start_id``."""
        block_ms = int((self.block if timeout is None else timeout) * 1000)
        try:
            messages = self._claim_abandoned()
            if messages:
                return messages
            return self._read_new(block_ms)
        except REDIS_ERRORS as exc:
            raise self._error(
                "read", exc, "check that Redis is up and poll again (iteration and run() retry by themselves)"
            ) from exc

    def _recreate_group(self, keys: TopicKeys, exc: redis.ResponseError) -> None:
        """The stream or its group is gone (Redis lost its data, or someone deleted it): create the group again
        from ``start_id``. What was lost stays lost; what the stream holds now is read from ``start_id``."""
        logger.warning(
            "topic=%s group=%s stream=%s: consumer group is gone (%s); Redis lost its data? recreating it from %s",
            self.topic,
            self.group,
            keys.topic_stream,
            exc,
            self.start_id,
        )
        self._claim_cursors[keys.topic_stream] = CURSOR_START
        ensure_consumer_group(self.client, keys.topic_stream, self.group, self.start_id)

    def _read_new(self, block_ms: int) -> list[ConsumedMessage]:
        """New entries of the partitions, in turn; blocks on one of them when none has any (a blocking read of
        several streams in one call would cross hash slots on Cluster)."""
        count = len(self.partitions)
        for turn in range(count):
            keys = self.partitions[(self._next_partition + turn) % count]
            last = turn == count - 1
            try:
                reply = self.client.xreadgroup(
                    self.group,
                    self.consumer_name,
                    {keys.topic_stream: ">"},
                    count=self.batch_size,
                    block=(block_ms or None) if last else None,
                )
            except redis.ResponseError as exc:
                if not is_missing_group(exc):
                    raise
                self._recreate_group(keys, exc)
                continue
            raw = [(entry_id, fields, 1) for _, batch in stream_batches(reply) for entry_id, fields in batch]
            if raw:
                self._next_partition = (self._next_partition + turn + 1) % count
                return self._decode_all(keys, raw)
        self._next_partition = (self._next_partition + 1) % count
        return []

    def _claim_abandoned(self) -> list[ConsumedMessage]:
        """XAUTOCLAIM through ``lua/consumer_claim.lua``, at most every ``min_idle_time / 2`` once a scan ends.

        The script also removes, when its walk of the pending list ends, the consumers that hold nothing and were
        idle ``min_idle_time``: dead instances whose entries the walk took over."""
        now = time.monotonic()
        scanning = any(cursor != CURSOR_START for cursor in self._claim_cursors.values())
        if not scanning and now < self._next_claim:
            return []
        messages: list[ConsumedMessage] = []
        for keys in self.partitions:
            cursor = self._claim_cursors[keys.topic_stream]
            if scanning and cursor == CURSOR_START:
                continue
            try:
                reply = self._claim(
                    keys=self._script_keys(keys),
                    args=[
                        self.group,
                        self.consumer_name,
                        int(self.min_idle_time * 1000),
                        cursor,
                        min(self.batch_size, 100),
                        self.max_deliveries,
                    ],
                )
            except redis.ResponseError as exc:
                if not is_missing_group(exc):
                    raise
                self._recreate_group(keys, exc)
                continue
            self._claim_cursors[keys.topic_stream] = text(reply[0]) or CURSOR_START
            if self._claim_cursors[keys.topic_stream] == CURSOR_START:
                self._forget_dead_consumers(keys)
            claimed = [(entry_id, fields, int(count)) for entry_id, count, fields in reply[1:]]
            for entry_id, _, count in claimed:
                logger.info(
                    "topic=%s group=%s re-delivering %s (delivery %d)", self.topic, self.group, text(entry_id), count
                )
            messages.extend(self._decode_all(keys, claimed))
        if all(cursor == CURSOR_START for cursor in self._claim_cursors.values()):
            self._next_claim = now + self.min_idle_time / 2
        return messages

    def _forget_dead_consumers(self, keys: TopicKeys) -> None:
        """A walk of the pending list ended: the consumers it took entries over from are dead; drop their names."""
        idle_ms = int(self.min_idle_time * 1000)
        gone = forget_dead_consumers(self.client, keys.topic_stream, self.group, self.consumer_name, idle_ms)
        if gone:
            logger.info("topic=%s group=%s removed dead consumers %s", self.topic, self.group, ", ".join(gone))

    def _decode_all(self, keys: TopicKeys, raw: list[tuple[Any, Any, int]]) -> list[ConsumedMessage]:
        messages = []
        for entry_id, fields, count in raw:
            if fields is None:
                continue
            try:
                messages.append(
                    decode_topic_entry(self.topic, keys.topic_stream, entry_id, fields, count, partition=keys.partition)
                )
            except CorruptEntryError as exc:
                logger.error("topic=%s group=%s dead-lettering malformed entry: %s", self.topic, self.group, exc)
                self._move_to_dead(keys, text(entry_id) or "", f"malformed entry: {exc}", count)
        return messages

    def ack(self, message: ConsumedMessage) -> None:
        """Mark the message processed; an unacked message is re-delivered after ``min_idle_time``.

        Raises :class:`~redis_txmq.errors.TxMQConnectionError` when Redis fails: the message stays pending."""
        try:
            self.client.xack(message.stream, self.group, message.id)
        except REDIS_ERRORS as exc:
            raise self._error(
                f"ack of {message.id}",
                exc,
                f"the message stays pending: ack it again, or it is re-delivered after {self.min_idle_time} s",
            ) from exc

    def dead_letter(self, message: ConsumedMessage, reason: str) -> bool:
        """Give up on a message now: move it to the dead-letter stream with ``reason`` (and ack it)."""
        try:
            return self._move_to_dead(self._by_stream[message.stream], message.id, reason, message.delivery_count)
        except REDIS_ERRORS as exc:
            raise self._error(
                f"dead-lettering {message.id}", exc, "the message stays pending: call dead_letter() again"
            ) from exc

    def _move_to_dead(self, keys: TopicKeys, entry_id: str, reason: str, delivery_count: int) -> bool:
        moved = self._dead_letter(keys=self._script_keys(keys), args=[self.group, entry_id, reason, delivery_count])
        return bool(int(moved))

    def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, bytes]]]:
        """Up to ``count`` entries of each partition's dead-letter stream, oldest first, as ``(entry id, fields)``."""
        try:
            return [
                (text(entry_id) or "", {text(k) or "": v for k, v in fields.items()})
                for stream in self.dead_streams
                for entry_id, fields in self.client.xrange(stream, count=count)
            ]
        except REDIS_ERRORS as exc:
            raise self._error("reading the dead letters", exc, "check that Redis is up and retry") from exc

    def delete_group(self) -> None:
        """Remove this consumer group from every partition (its position and pending entries are gone), and stop
        this consumer. Stop the group's other consumers first: one still reading creates the group again."""
        self.stop()
        for keys in self.partitions:
            try:
                self.client.xgroup_destroy(keys.topic_stream, self.group)
            except redis.ResponseError as exc:
                if not is_missing_group(exc):
                    raise self._error("deleting the group", exc, "check the stream's type and retry") from exc
            except REDIS_ERRORS as exc:
                raise self._error("deleting the group", exc, "check that Redis is up and retry") from exc

    def __iter__(self) -> Iterator[ConsumedMessage]:
        """Messages until :meth:`stop` or :meth:`close`; the caller acks each one.

        A dropped connection, a restart or a failover does not end the loop: it is logged and the read is retried
        with backoff (0.1 s doubling to 5 s)."""
        backoff = _Backoff()
        while not self._stop.is_set():
            try:
                messages = self.poll()
            except TxMQConnectionError as exc:
                if self._stop.is_set():
                    break
                self._wait_after_failure(backoff, "read", exc)
                continue
            if backoff.failures:
                logger.info(
                    "topic=%s group=%s reading again after %d failed attempts", self.topic, self.group, backoff.failures
                )
                backoff = _Backoff()
            yield from messages

    def _wait_after_failure(self, backoff: _Backoff, action: str, exc: TxMQConnectionError) -> None:
        delay = backoff.next_delay()
        logger.warning(
            "topic=%s group=%s consumer=%s %s failed (attempt %d): %s; retrying in %.2f s",
            self.topic,
            self.group,
            self.consumer_name,
            action,
            backoff.failures,
            exc.__cause__ or exc,
            delay,
        )
        self._stop.wait(delay)

    def _ack_until_stopped(self, message: ConsumedMessage) -> None:
        """Ack, retrying while Redis is unreachable (an ack that never lands means the message is handled twice)."""
        backoff = _Backoff()
        while True:
            try:
                self.ack(message)
                return
            except TxMQConnectionError as exc:
                if self._stop.is_set():
                    logger.warning(
                        "topic=%s group=%s stopped before %s could be acked (%s); it will be re-delivered",
                        self.topic,
                        self.group,
                        message.id,
                        exc.__cause__ or exc,
                    )
                    return
                self._wait_after_failure(backoff, f"ack of {message.id}", exc)

    def run(self, handler: Callable[[ConsumedMessage], Any], *, max_messages: int | None = None) -> int:
        """Call ``handler`` for each message and ack it when the handler returns; a handler that raises leaves
        the message pending for re-delivery. Returns how many were handled, when stopped or at ``max_messages``.
        Lost connections are retried with backoff, as in iteration; so is the ack."""
        handled = 0
        for message in self:
            try:
                handler(message)
            except Exception:  # noqa: BLE001 - a failing handler must not kill the consumer
                logger.exception(
                    "topic=%s group=%s tx=%s handler failed on %s (delivery %d); will re-deliver",
                    self.topic,
                    self.group,
                    message.transaction_id,
                    message.id,
                    message.delivery_count,
                )
                continue
            self._ack_until_stopped(message)
            handled += 1
            if max_messages is not None and handled >= max_messages:
                break
        return handled

    def stop(self) -> None:
        """Make iteration and :meth:`run` return after the current poll, or at once while they wait to retry
        (thread-safe)."""
        self._stop.set()

    def close(self) -> None:
        self.stop()
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
