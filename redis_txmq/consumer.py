"""Consumer groups over topic streams: ack, re-delivery of abandoned entries, a delivery limit.

A topic stream holds committed messages only, so nothing here can see a half or rolled-back message.
Any Redis client can read the same streams with XREADGROUP; this class adds what a broker user expects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import redis

from .config import Settings
from .connection import instance_id, resolve_client
from .entries import ConsumedMessage, decode_topic_entry, stream_batches, text
from .errors import ConfigurationError, CorruptEntryError, TxMQConnectionError
from .groups import CURSOR_START, ensure_consumer_group
from .keys import TopicKeys
from .message import validate_name
from .scripts import CONSUMER_PRELUDE, preload, register_script
from .topics import partition_keys

logger = logging.getLogger(__name__)


class Consumer:
    """Reads one topic through a consumer group; each message goes to one consumer of the group.

    Unacked messages of a consumer that died are claimed by a live one after ``min_idle_time`` seconds;
    a message delivered more than ``max_deliveries`` times moves to the group's dead-letter stream
    (``txmq:{<topic>}:consumer-dead:<group>``) with its reason instead of being delivered again.
    ``start_id`` is where a new group starts: ``"0"`` (default, nothing committed is missed) or ``"$"``.
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
        self.batch_size = batch_size
        self.block = block
        self.min_idle_time = min_idle_time
        self.max_deliveries = max_deliveries
        self.client, self.settings, self._owns_client = resolve_client(redis_url, client, settings)
        self.partitions = partition_keys(self.client, topic)
        self._by_stream = {keys.topic_stream: keys for keys in self.partitions}
        self._claim = register_script(self.client, "consumer_claim", CONSUMER_PRELUDE)
        self._dead_letter = register_script(self.client, "consumer_dead_letter", CONSUMER_PRELUDE)
        self._claim_cursors = {keys.topic_stream: CURSOR_START for keys in self.partitions}
        self._next_claim = 0.0
        self._next_partition = 0
        self._stop = threading.Event()
        for keys in self.partitions:
            ensure_consumer_group(self.client, keys.topic_stream, self.group, start_id)
        preload(self._claim, self._dead_letter)

    @property
    def dead_streams(self) -> list[str]:
        """The keys of this group's dead-letter streams, one per partition."""
        return [keys.consumer_dead_stream(self.group) for keys in self.partitions]

    def _script_keys(self, keys: TopicKeys) -> list[str]:
        return [keys.topic_stream, keys.consumer_dead_stream(self.group)]

    def poll(self, timeout: float | None = None) -> list[ConsumedMessage]:
        """Up to ``batch_size`` messages: abandoned ones first, then new ones (waiting up to ``timeout``)."""
        block_ms = int((self.block if timeout is None else timeout) * 1000)
        try:
            messages = self._claim_abandoned()
            if messages:
                return messages
            return self._read_new(block_ms)
        except redis.RedisError as exc:
            raise TxMQConnectionError(f"topic {self.topic!r}, group {self.group!r}: read failed: {exc}") from exc

    def _read_new(self, block_ms: int) -> list[ConsumedMessage]:
        """New entries of the partitions, in turn; blocks on one of them when none has any (a blocking read of
        several streams in one call would cross hash slots on Cluster)."""
        count = len(self.partitions)
        for turn in range(count):
            keys = self.partitions[(self._next_partition + turn) % count]
            last = turn == count - 1
            reply = self.client.xreadgroup(
                self.group,
                self.consumer_name,
                {keys.topic_stream: ">"},
                count=self.batch_size,
                block=(block_ms or None) if last else None,
            )
            raw = [(entry_id, fields, 1) for _, batch in stream_batches(reply) for entry_id, fields in batch]
            if raw:
                self._next_partition = (self._next_partition + turn + 1) % count
                return self._decode_all(keys, raw)
        self._next_partition = (self._next_partition + 1) % count
        return []

    def _claim_abandoned(self) -> list[ConsumedMessage]:
        """XAUTOCLAIM through ``lua/consumer_claim.lua``, at most every ``min_idle_time / 2`` once a scan ends."""
        now = time.monotonic()
        scanning = any(cursor != CURSOR_START for cursor in self._claim_cursors.values())
        if not scanning and now < self._next_claim:
            return []
        messages: list[ConsumedMessage] = []
        for keys in self.partitions:
            cursor = self._claim_cursors[keys.topic_stream]
            if scanning and cursor == CURSOR_START:
                continue
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
            self._claim_cursors[keys.topic_stream] = text(reply[0]) or CURSOR_START
            claimed = [(entry_id, fields, int(count)) for entry_id, count, fields in reply[1:]]
            for entry_id, _, count in claimed:
                logger.info(
                    "topic=%s group=%s re-delivering %s (delivery %d)", self.topic, self.group, text(entry_id), count
                )
            messages.extend(self._decode_all(keys, claimed))
        if all(cursor == CURSOR_START for cursor in self._claim_cursors.values()):
            self._next_claim = now + self.min_idle_time / 2
        return messages

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
        """Mark the message processed; an unacked message is re-delivered after ``min_idle_time``."""
        self.client.xack(message.stream, self.group, message.id)

    def dead_letter(self, message: ConsumedMessage, reason: str) -> bool:
        """Give up on a message now: move it to the dead-letter stream with ``reason`` (and ack it)."""
        return self._move_to_dead(self._by_stream[message.stream], message.id, reason, message.delivery_count)

    def _move_to_dead(self, keys: TopicKeys, entry_id: str, reason: str, delivery_count: int) -> bool:
        moved = self._dead_letter(keys=self._script_keys(keys), args=[self.group, entry_id, reason, delivery_count])
        return bool(int(moved))

    def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, bytes]]]:
        """Up to ``count`` entries of each partition's dead-letter stream, oldest first, as ``(entry id, fields)``."""
        return [
            (text(entry_id) or "", {text(k) or "": v for k, v in fields.items()})
            for stream in self.dead_streams
            for entry_id, fields in self.client.xrange(stream, count=count)
        ]

    def delete_group(self) -> None:
        """Remove this consumer group from every partition (its position and pending entries are gone)."""
        for keys in self.partitions:
            self.client.xgroup_destroy(keys.topic_stream, self.group)

    def __iter__(self) -> Iterator[ConsumedMessage]:
        """Messages until :meth:`stop` or :meth:`close`; the caller acks each one."""
        while not self._stop.is_set():
            yield from self.poll()

    def run(self, handler: Callable[[ConsumedMessage], Any], *, max_messages: int | None = None) -> int:
        """Call ``handler`` for each message and ack it when the handler returns; a handler that raises leaves
        the message pending for re-delivery. Returns how many were handled, when stopped or at ``max_messages``."""
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
            self.ack(message)
            handled += 1
            if max_messages is not None and handled >= max_messages:
                break
        return handled

    def stop(self) -> None:
        """Make iteration and :meth:`run` return after the current poll (thread-safe)."""
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
