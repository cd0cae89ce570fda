"""The consumer without I/O: what it sends to Redis, how it reads the replies, and what it decides.

``ConsumerProtocol`` holds a consumer's settings and state (its partitions, claim cursors, whose turn it is to be read,
the batch in hand) and writes each operation as a generator of *effects*: a ``Command`` for Redis, a ``Pause`` before a
retry, a ``Handle`` of a message by the user's handler, a ``Heartbeat`` started or stopped. The outcome of each effect
is sent back into the generator (or, when it failed, thrown into it), so the decisions — claim before read, the lease on
what the consumer holds, the delivery limit, NOGROUP recovery, backoff, error messages — are written once.
[`redis_txmq.Consumer`][redis_txmq.sync.consumer.Consumer] performs the effects with blocking calls (its heartbeat on a
thread), [`redis_txmq.asyncio.Consumer`][redis_txmq.asyncio.consumer.Consumer] with ``await`` (its heartbeat a task);
that is all they do: both subclass ``ConsumerProtocol``, which also holds the constructor, its validation and the error
messages.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ..core.clients import CLUSTER_UNAVAILABLE, REDIS_ERRORS, blocking_slice, instance_id, redact_url, socket_timeout_of
from .config import Settings
from .entries import ConsumedMessage, decode_topic_entry, stream_batches, text
from .errors import ConfigurationError, CorruptEntryError, TxMQConnectionError
from .groups import (
    CURSOR_START,
    ensure_group_call,
    ensure_group_error,
    is_missing_group,
    read_group,
    removed_names,
)
from .keys import TopicKeys, topic_meta_key
from .message import validate_name
from .scripts import CONSUMER_PRELUDE, register_script
from .topics import count_of, partition_keys_of

T = TypeVar("T")

SETUP_ERRORS: tuple[type[Exception], ...] = (TxMQConnectionError, *REDIS_ERRORS)
"""What setting up a consumer can raise, wrapped by ``ConsumerProtocol._setup_error``."""
RETRY_FIRST_DELAY = 0.1
RETRY_MAX_DELAY = 5.0
CLAIM = "consumer_claim"
DEAD_LETTER = "consumer_dead_letter"
HEARTBEAT = "consumer_heartbeat"
HOLD = "consumer_hold"
HAND_BACK = "consumer_hand_back"
FORGET = "forget_consumers"
CONSUMER_SCRIPTS = (CLAIM, DEAD_LETTER, HEARTBEAT, HOLD, HAND_BACK)
"""The scripts with the consumer prelude (``lua/consumer_keys.lua``); ``forget_consumers`` has none."""
LEASE_HEARTBEATS = 3
"""A consumer's lease lasts this many heartbeat intervals (``Settings.heartbeat_interval``): a late beat or two do
not lose it, as for the producers' and checkers' heartbeats."""
HEARTBEAT_STOP_WAIT = 2.0
"""Seconds a stopping consumer waits for a heartbeat under way before it hands its messages back."""


READ_GROUP = "read_group"
CALLS_WITH_CLIENT: Mapping[str, Callable[..., Any]] = {READ_GROUP: read_group}
"""Calls that are functions of the client rather than its methods: ``read_group`` sends
XREADGROUP to the master of the stream on a cluster."""


@dataclass(frozen=True, slots=True)
class Command:
    """One Redis call: a method of the client (``eval``, ``xack``...), one of ``CALLS_WITH_CLIENT``, or one of
    the consumer's scripts."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, client: Any, scripts: Mapping[str, Any]) -> Any:
        """The reply; with an asyncio client, the awaitable of the reply."""
        if self.name in scripts:
            return scripts[self.name](*self.args, **self.kwargs)
        if self.name in CALLS_WITH_CLIENT:
            return CALLS_WITH_CLIENT[self.name](client, *self.args, **self.kwargs)
        return getattr(client, self.name)(*self.args, **self.kwargs)


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` before a retry; less when the consumer is stopped meanwhile."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Handle:
    """Give ``message`` to the user's ``handler``; what it raises is thrown back into the steps."""

    handler: Callable[[ConsumedMessage], Any]
    message: ConsumedMessage


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Start the heartbeat that renews the consumer's lease every ``Settings.heartbeat_interval``, beside the
    handler (a thread, or a task on asyncio); or (``running`` False) stop it, waiting for a beat under way, so that
    no beat lands after the lease is handed back."""

    running: bool


Effect = Command | Pause | Handle | Heartbeat
Steps = Generator[Effect, Any, T]


class Driver(Generic[T]):
    """Runs steps for a consumer that performs their effects: hands the effects out one by one, and sends each
    outcome back in. An ``Exception`` from performing one is thrown into the steps, which decide what it means;
    anything else (``KeyboardInterrupt``, ``asyncio.CancelledError``) ends them where they stand::

        with Driver(steps) as driver:
            for effect in driver:
                with driver.outcome():
                    driver.reply = perform(effect)
        return driver.result
    """

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._error: Exception | None = None
        self.reply: Any = None
        self.result: T

    def __iter__(self) -> Iterator[Effect]:
        while True:
            reply, error = self.reply, self._error
            self.reply = self._error = None
            try:
                effect = self._steps.send(reply) if error is None else self._steps.throw(error)
            except StopIteration as done:
                self.result = done.value
                return
            yield effect

    @contextlib.contextmanager
    def outcome(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the steps decide what a failure means
            self._error = exc

    def __enter__(self) -> Driver[T]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._steps.close()


def is_asyncio_client(client: Any) -> bool:
    """True for a ``redis.asyncio`` client (fakeredis' included): its calls return awaitables."""
    return isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster))


_OTHER_API = {
    False: "is an asyncio client; use redis_txmq.asyncio.Consumer",
    True: "is not an asyncio client; pass a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster, or use "
    "redis_txmq.Consumer",
}


class Backoff:
    """Delays between attempts while Redis fails: doubling from ``RETRY_FIRST_DELAY`` up to ``RETRY_MAX_DELAY``,
    with jitter so that the consumers of a restarted server do not all come back in the same millisecond."""

    def __init__(self) -> None:
        self.failures = 0

    def next_delay(self) -> float:
        delay = min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2 ** min(self.failures, 16))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography


class ConsumerProtocol:
    """A consumer's settings, its state (partitions, claim cursors, whose turn it is) and its steps, without I/O:
    the constructor validates the options and resolves the client, the ``*_steps`` generators decide. What the options
    mean is [`redis_txmq.Consumer`][redis_txmq.sync.consumer.Consumer]'s docstring; the two consumers subclass this
    one."""

    _logger: ClassVar[logging.Logger]
    _asyncio: ClassVar[bool]
    """Whether the subclass awaits a ``redis.asyncio`` client."""
    _event_type: ClassVar[type[Any]]
    """``threading.Event`` or ``asyncio.Event``: the steps only ask ``is_set()``."""

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
        self.partitions: list[TopicKeys] = []
        self._by_stream: dict[str, TopicKeys] = {}
        self._claim_cursors: dict[str, str] = {}
        self._next_claim = 0.0
        self._next_partition = 0
        self._failed_partitions: set[str] = set()
        """Partitions that could not be reached in the current poll."""
        self._unready: set[str] = set()
        """Partitions whose group could not be set up (on a cluster, their master was down): set up at each poll."""
        self._acks_due: list[ConsumedMessage] = []
        """Messages handled by ``run()`` whose ack failed on a cluster (their master is down): acked at each poll."""
        self._unhandled: list[ConsumedMessage] = []
        """What ``run()`` or iteration read and has not handed out yet: handed out first, or handed back on stop."""
        self._busy = False
        self._close_done = False
        """Whether ``run()``, or iteration's choice of the next message, is under way: a ``close()`` meanwhile
        leaves the hand-back (and closing its own client) to it, so that nothing it is about to handle, or handling,
        is handed to another consumer."""
        """The message ``run()``'s handler has: a ``close()`` meanwhile leaves the hand-back to ``run()``."""
        self._lease_held = False
        """Whether the consumer holds its lease (and its heartbeat runs): from its first read until it stops."""
        self._closed = False
        self._stop = self._event_type()
        try:
            self.client, self.settings, self._owns_client = self._resolve_client(redis_url, client, settings)
        except REDIS_ERRORS as exc:  # a cluster client connects when it is made
            raise TxMQConnectionError(
                f"{self._where}: could not connect to Redis: {exc}; check redis_url (or TXMQ_REDIS_URL) and that "
                "Redis is reachable, then create the consumer again"
            ) from exc
        self._scripts = {name: register_script(self.client, name, CONSUMER_PRELUDE) for name in CONSUMER_SCRIPTS}
        self._scripts[FORGET] = register_script(self.client, FORGET)
        self._created()

    def _resolve_client(
        self, redis_url: str | None, client: Any, settings: Settings | None
    ) -> tuple[Any, Settings, bool]:
        """The client, the effective settings, and whether this consumer made the client (and closes it)."""
        if client is not None and is_asyncio_client(client) != self._asyncio:
            raise ConfigurationError(f"{self._where}: {type(client).__name__} {_OTHER_API[self._asyncio]}")
        return self._client_of(redis_url, client, settings)

    def _client_of(self, redis_url: str | None, client: Any, settings: Settings | None) -> tuple[Any, Settings, bool]:
        """The shell's: the client made from the URL (or ``client`` checked), the settings, whether it made it."""
        raise NotImplementedError

    def _created(self) -> None:
        """Called at the end of the constructor: the sync consumer sets up its groups here."""

    @property
    def _where(self) -> str:
        return f"topic {self.topic!r}, group {self.group!r}"

    def _error(self, action: str, exc: BaseException, then: str) -> TxMQConnectionError:
        return TxMQConnectionError(f"{self._where}: {action} failed: {exc}; {then}")

    def _setup_error(self, exc: BaseException) -> TxMQConnectionError:
        where = redact_url(self.settings.redis_url) if self._owns_client else "the client's server"
        return TxMQConnectionError(
            f"{self._where}: could not set up the consumer group: {exc}; check that Redis ({where}) is "
            "reachable, then create the consumer again"
        )

    @property
    def dead_streams(self) -> list[str]:
        """The keys of this group's dead-letter streams, one per partition."""
        return [keys.consumer_dead_stream(self.group) for keys in self.partitions]

    def stop(self) -> None:
        """Make ``run`` return once the message in hand is handled (iteration: before the next message), and hand
        the messages read and not handled yet back to the group, for another consumer to take at once; at once
        while they wait for messages or to retry.

        Thread-safe in the sync consumer (a signal handler may call it); call the asyncio consumer's from its event
        loop."""
        self._stop.set()

    def _script_keys(self, keys: TopicKeys) -> list[str]:
        return [keys.topic_stream, keys.consumer_dead_stream(self.group), keys.consumer_leases(self.group)]

    @property
    def _lease_ms(self) -> int:
        return int(LEASE_HEARTBEATS * self.settings.heartbeat_interval * 1000)

    def _lease_steps(self) -> Steps[None]:
        """Take the lease on what this consumer reads, before it reads, and start the heartbeat that renews it: only
        a consumer without a live lease (it stopped, died or froze) has its messages taken over. Once per start; again
        by a poll after a stop (which handed the lease back)."""
        if self._lease_held or self._closed or not self.partitions:
            return
        yield from self._heartbeat_steps(acquire=True)
        self._lease_held = True
        yield Heartbeat(True)

    def _heartbeat_steps(self, *, acquire: bool = False) -> Steps[None]:
        """Renew the lease on each partition (``lua/consumer_heartbeat.lua``). A beat that fails is logged: the lease
        lasts ``LEASE_HEARTBEATS`` intervals. When other consumers hold messages without a live lease, the next poll
        makes a claim walk, instead of waiting its turn (every ``min_idle_time / 2``)."""
        mode = "acquire" if acquire else "renew"
        orphaned = False
        for keys in self.partitions:
            args = [self.group, self.consumer_name, self._lease_ms, mode]
            try:
                reply = yield Command(HEARTBEAT, (), {"keys": self._script_keys(keys), "args": args})
            except REDIS_ERRORS as exc:
                self._logger.warning(
                    "topic=%s group=%s consumer=%s stream=%s: heartbeat failed (%s); the lease lasts %.1f s from the "
                    "last one that landed",
                    self.topic,
                    self.group,
                    self.consumer_name,
                    keys.topic_stream,
                    exc,
                    self._lease_ms / 1000,
                )
                continue
            orphaned = orphaned or int(reply) > 0
        if orphaned:
            self._next_claim = 0.0

    def _release_steps(self) -> Steps[None]:
        """Stop the heartbeat, then hand back what this consumer holds (``lua/consumer_hand_back.lua``): its lease
        becomes 0, so that another consumer takes its messages at once, and the messages it read but never handed
        out lose that delivery. A hand-back that fails leaves them to be taken over as a dead consumer's."""
        rest, self._unhandled = self._unhandled, []
        if not self._lease_held and not rest:
            return
        if self._lease_held:
            self._lease_held = False
            yield Heartbeat(False)
        for keys in self.partitions:
            ids = [message.id for message in rest if message.stream == keys.topic_stream]
            try:
                yield Command(
                    HAND_BACK, (), {"keys": self._script_keys(keys), "args": [self.group, self.consumer_name, *ids]}
                )
            except REDIS_ERRORS as exc:
                self._logger.warning(
                    "topic=%s group=%s consumer=%s stream=%s: handing back failed (%s); its messages are taken over "
                    "once its lease ran out (%.1f s) and they were idle min_idle_time (%s s)",
                    self.topic,
                    self.group,
                    self.consumer_name,
                    keys.topic_stream,
                    exc,
                    self._lease_ms / 1000,
                    self.min_idle_time,
                )
        if rest:
            self._logger.info(
                "topic=%s group=%s consumer=%s stopped: handed back %d messages it had not handled",
                self.topic,
                self.group,
                self.consumer_name,
                len(rest),
            )

    def _setup_steps(self) -> Steps[None]:
        """Read the topic's partitions and create the group on each (where it does not exist yet).

        On a cluster, a partition whose master cannot be reached is set up at a later poll, and the others are read
        meanwhile: a consumer restarted during the outage of one master starts. It raises when no partition was
        set up."""
        count = count_of((yield Command("hget", (topic_meta_key(self.topic), "partitions"))))
        partitions = partition_keys_of(self.topic, count)
        unready: set[str] = set()
        for keys in partitions:
            try:
                yield from self._ensure_group_steps(keys)
            except TxMQConnectionError as exc:
                if not self._partition_may_fail(exc.__cause__) or len(unready) == len(partitions) - 1:
                    raise
                self._partition_failed(keys, "setting up the group", exc.__cause__ or exc)
                unready.add(keys.topic_stream)
        self._unready = unready
        self._by_stream = {keys.topic_stream: keys for keys in partitions}
        self._claim_cursors = {keys.topic_stream: CURSOR_START for keys in partitions}
        self.partitions = partitions

    def _ready_steps(self) -> Steps[None]:
        if not self.partitions:
            yield from self._setup_steps()

    def _ensure_group_steps(self, keys: TopicKeys) -> Steps[None]:
        try:
            yield Command("eval", ensure_group_call(keys.topic_stream, self.group, self.start_id))
        except REDIS_ERRORS as exc:
            raise ensure_group_error(keys.topic_stream, self.group, exc) from exc

    def _partition_ready_steps(self, keys: TopicKeys) -> Steps[bool]:
        """Whether the partition can be read: its group is set up now if that failed before."""
        if keys.topic_stream not in self._unready:
            return True
        try:
            yield from self._ensure_group_steps(keys)
        except TxMQConnectionError as exc:
            self._partition_failed(keys, "setting up the group", exc.__cause__ or exc)
            return False
        self._unready.discard(keys.topic_stream)
        return True

    def _partition_may_fail(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` concerns one partition only, so that the others are read on: on a cluster (partitions on
        several masters), a dropped connection or a slot not served (CLUSTERDOWN, MASTERDOWN, TRYAGAIN of a master
        just restarted). On one server every error is the server's: the poll fails and run() backs off."""
        if not self._on_cluster or not isinstance(exc, REDIS_ERRORS):
            return False
        return not isinstance(exc, redis.ResponseError) or isinstance(exc, CLUSTER_UNAVAILABLE)

    def _poll_steps(self, timeout: float | None) -> Steps[list[ConsumedMessage]]:
        if self._unhandled:  # read by run() or iteration, never handed out: this consumer's still
            messages, self._unhandled = self._unhandled, []
            return messages
        wait = self.block if timeout is None else timeout
        self._failed_partitions = set()
        try:
            yield from self._ready_steps()
            yield from self._lease_steps()
            messages = yield from self._claim_steps()
            if messages:
                return messages
            return (yield from self._wait_steps(wait))
        except REDIS_ERRORS as exc:
            raise self._error(
                "read", exc, "check that Redis is up and poll again (iteration and run() retry by themselves)"
            ) from exc

    def _recreate_group_steps(self, keys: TopicKeys, exc: Exception) -> Steps[None]:
        """The stream or its group is gone (Redis lost its data, or someone deleted it): create the group again
        from ``start_id``. What was lost stays lost; what the stream holds now is read from ``start_id``."""
        self._logger.warning(
            "topic=%s group=%s stream=%s: consumer group is gone (%s); Redis lost its data? recreating it from %s",
            self.topic,
            self.group,
            keys.topic_stream,
            exc,
            self.start_id,
        )
        self._claim_cursors[keys.topic_stream] = CURSOR_START
        yield from self._ensure_group_steps(keys)

    def _wait_steps(self, wait: float) -> Steps[list[ConsumedMessage]]:
        """New entries, waiting up to ``wait`` seconds for some: in blocking reads each shorter than the client's
        socket timeout (a read blocked past it fails on a healthy, idle server), until one brings entries or the
        time is up."""
        socket_timeout = socket_timeout_of(self.client)
        deadline = time.monotonic() + wait
        slice_s = blocking_slice(wait, socket_timeout)
        while True:
            messages = yield from self._read_steps(int(slice_s * 1000))
            remaining = deadline - time.monotonic()
            if messages or slice_s >= wait or remaining < 0.001 or self._stop.is_set():
                return messages
            slice_s = blocking_slice(remaining, socket_timeout)

    def _read_steps(self, block_ms: int) -> Steps[list[ConsumedMessage]]:
        """New entries of the partitions, in turn; blocks on one of them when none has any (a blocking read of
        several streams in one call would cross hash slots on Cluster)."""
        count = len(self.partitions)
        failure: Exception | None = None
        reached = False
        for turn in range(count):
            keys = self.partitions[(self._next_partition + turn) % count]
            last = turn == count - 1
            if not (yield from self._partition_ready_steps(keys)):
                failure = failure or TxMQConnectionError(f"{self._where}: no partition could be set up")
                continue
            try:
                # read_group: on a cluster, to the master of the stream, not to the one redis-py looks keys up on
                reply = yield Command(
                    READ_GROUP,
                    (self.group, self.consumer_name, keys.topic_stream),
                    {"count": self.batch_size, "block_ms": (block_ms or None) if last else None},
                )
            except REDIS_ERRORS as exc:
                if is_missing_group(exc):
                    yield from self._recreate_group_steps(keys, exc)
                    continue
                if not self._partition_may_fail(exc):  # on one server: the poll fails (run() backs off)
                    raise
                self._partition_failed(keys, "read", exc)  # its master is down: the others are read all the same
                failure = failure or exc
                continue
            reached = True
            raw = [(entry_id, fields, 1) for _, batch in stream_batches(reply) for entry_id, fields in batch]
            if raw:
                self._next_partition = (self._next_partition + turn + 1) % count
                return (yield from self._decode_steps(keys, raw))
        self._next_partition = (self._next_partition + 1) % count
        if failure is not None and not reached:
            raise failure
        return []

    def _partition_failed(self, keys: TopicKeys, what: str, exc: Exception) -> Exception:
        """One partition could not be reached (on a cluster, its master is down): logged, the others go on."""
        self._failed_partitions.add(keys.topic_stream)
        self._logger.warning(
            "topic=%s group=%s stream=%s: %s failed (%s); the other partitions go on",
            self.topic,
            self.group,
            keys.topic_stream,
            what,
            exc,
        )
        return exc

    @property
    def _on_cluster(self) -> bool:
        """Partitions live on several masters only on a cluster; on one server an error is the server's."""
        return isinstance(self.client, (RedisCluster, AsyncRedisCluster))

    def _claim_steps(self) -> Steps[list[ConsumedMessage]]:
        """A walk of the pending list through ``lua/consumer_claim.lua``, at most every ``min_idle_time / 2`` once
        a walk ends (sooner when a heartbeat saw messages without a live lease): it takes over the messages of
        consumers that stopped (at once) or whose lease ran out (once idle ``min_idle_time``), and this
        consumer's own idle ones; never those of a live consumer.

        The script also dead-letters what reached ``max_deliveries``; when a walk of a partition's pending list
        ends, the consumers that hold nothing and are not live (dead instances whose entries the walk took over)
        are removed."""
        now = time.monotonic()
        scanning = any(cursor != CURSOR_START for cursor in self._claim_cursors.values())
        if not scanning and now < self._next_claim:
            return []
        messages: list[ConsumedMessage] = []
        for keys in self.partitions:
            cursor = self._claim_cursors[keys.topic_stream]
            if scanning and cursor == CURSOR_START:
                continue
            if not (yield from self._partition_ready_steps(keys)):
                continue
            args = [self.group, self.consumer_name, self._idle_ms, cursor, min(self.batch_size, 100)]
            try:
                reply = yield Command(
                    CLAIM, (), {"keys": self._script_keys(keys), "args": [*args, self.max_deliveries]}
                )
            except REDIS_ERRORS as exc:
                if is_missing_group(exc):
                    yield from self._recreate_group_steps(keys, exc)
                    continue
                if not self._partition_may_fail(exc):
                    if messages:  # claimed by this walk (now owned by this consumer): delivered now, not dropped
                        self._logger.warning(
                            "topic=%s group=%s stream=%s: claim failed (%s); delivering the %d claimed before it",
                            self.topic,
                            self.group,
                            keys.topic_stream,
                            exc,
                            len(messages),
                        )
                        return messages
                    raise
                self._partition_failed(keys, "claim", exc)  # its master is down: its walk starts again next time
                self._claim_cursors[keys.topic_stream] = CURSOR_START
                continue
            self._claim_cursors[keys.topic_stream] = text(reply[0]) or CURSOR_START
            claimed = [(entry_id, fields, int(count)) for entry_id, count, fields in reply[1:]]
            for entry_id, _, count in claimed:
                self._logger.info(
                    "topic=%s group=%s re-delivering %s (delivery %d)", self.topic, self.group, text(entry_id), count
                )
            messages.extend((yield from self._decode_steps(keys, claimed)))
            if self._claim_cursors[keys.topic_stream] == CURSOR_START:
                yield from self._forget_dead_consumers_steps(keys)
        if all(cursor == CURSOR_START for cursor in self._claim_cursors.values()):
            self._next_claim = now + self.min_idle_time / 2
        return messages

    @property
    def _idle_ms(self) -> int:
        return int(self.min_idle_time * 1000)

    def _forget_dead_consumers_steps(self, keys: TopicKeys) -> Steps[None]:
        """A walk of the pending list ended: the consumers it took entries over from are dead; drop their names,
        and the leases of those that hold nothing."""
        call = {
            "keys": [keys.topic_stream, keys.consumer_leases(self.group)],
            "args": [self.group, self.consumer_name, self._idle_ms],
        }
        try:
            gone = removed_names((yield Command(FORGET, (), call)))
        except REDIS_ERRORS as exc:  # housekeeping: the next walk's end does it; what was claimed is delivered
            self._logger.warning(
                "topic=%s group=%s stream=%s: removing dead consumers failed (%s); tried again after the next walk",
                self.topic,
                self.group,
                keys.topic_stream,
                exc,
            )
            return
        if gone:
            self._logger.info("topic=%s group=%s removed dead consumers %s", self.topic, self.group, ", ".join(gone))

    def _decode_steps(self, keys: TopicKeys, raw: list[tuple[Any, Any, int]]) -> Steps[list[ConsumedMessage]]:
        """The entries as messages; a malformed one (written by another tool) goes to the dead letters."""
        messages = []
        for entry_id, fields, count in raw:
            if fields is None:
                continue
            try:
                messages.append(
                    decode_topic_entry(self.topic, keys.topic_stream, entry_id, fields, count, partition=keys.partition)
                )
            except CorruptEntryError as exc:
                self._logger.error("topic=%s group=%s dead-lettering malformed entry: %s", self.topic, self.group, exc)
                try:
                    yield from self._move_to_dead_steps(keys, text(entry_id) or "", f"malformed entry: {exc}", count)
                except REDIS_ERRORS as move_exc:  # it stays pending: a later claim dead-letters it
                    self._logger.warning(
                        "topic=%s group=%s: dead-lettering %s failed (%s); tried again when it is claimed",
                        self.topic,
                        self.group,
                        text(entry_id),
                        move_exc,
                    )
        return messages

    def _ack_steps(self, message: ConsumedMessage) -> Steps[None]:
        try:
            yield Command("xack", (message.stream, self.group, message.id))
        except REDIS_ERRORS as exc:
            raise self._error(
                f"ack of {message.id}",
                exc,
                f"the message stays pending: ack it again, or it is re-delivered after {self.min_idle_time} s",
            ) from exc

    def _dead_letter_steps(self, message: ConsumedMessage, reason: str) -> Steps[bool]:
        try:
            yield from self._ready_steps()
            return (
                yield from self._move_to_dead_steps(
                    self._by_stream[message.stream], message.id, reason, message.delivery_count
                )
            )
        except REDIS_ERRORS as exc:
            raise self._error(
                f"dead-lettering {message.id}", exc, "the message stays pending: call dead_letter() again"
            ) from exc

    def _move_to_dead_steps(self, keys: TopicKeys, entry_id: str, reason: str, delivery_count: int) -> Steps[bool]:
        moved = yield Command(
            DEAD_LETTER, (), {"keys": self._script_keys(keys), "args": [self.group, entry_id, reason, delivery_count]}
        )
        return bool(int(moved))

    def _dead_letters_steps(self, count: int) -> Steps[list[tuple[str, dict[str, bytes]]]]:
        try:
            yield from self._ready_steps()
            letters: list[tuple[str, dict[str, bytes]]] = []
            for stream in self.dead_streams:
                entries = yield Command("xrange", (stream,), {"count": count})
                letters.extend(
                    (text(entry_id) or "", {text(k) or "": v for k, v in fields.items()})
                    for entry_id, fields in entries
                )
            return letters
        except REDIS_ERRORS as exc:
            raise self._error("reading the dead letters", exc, "check that Redis is up and retry") from exc

    def _delete_group_steps(self) -> Steps[None]:
        self.stop()
        yield from self._release_steps()
        try:
            yield from self._ready_steps()
        except REDIS_ERRORS as exc:
            raise self._error("deleting the group", exc, "check that Redis is up and retry") from exc
        for keys in self.partitions:
            try:
                yield Command("xgroup_destroy", (keys.topic_stream, self.group))
                yield Command("delete", (keys.consumer_leases(self.group),))
            except redis.ResponseError as exc:
                if not is_missing_group(exc):
                    raise self._error("deleting the group", exc, "check the stream's type and retry") from exc
            except REDIS_ERRORS as exc:
                raise self._error("deleting the group", exc, "check that Redis is up and retry") from exc

    def _batch_steps(self) -> Steps[list[ConsumedMessage] | None]:
        """The next poll's messages for iteration, riding out failures with backoff; None once stopped."""
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                messages = yield from self._poll_steps(None)
            except Exception as exc:
                if self._stop.is_set():  # close() from another thread may have closed the client under this read
                    break
                if not isinstance(exc, TxMQConnectionError):
                    raise
                yield self._retry_pause(backoff, "read", exc)
                continue
            if backoff.failures:
                self._logger.info(
                    "topic=%s group=%s reading again after %d failed attempts", self.topic, self.group, backoff.failures
                )
            return messages
        return None

    def _retry_pause(self, backoff: Backoff, action: str, exc: Exception) -> Pause:
        delay = backoff.next_delay()
        self._logger.warning(
            "topic=%s group=%s consumer=%s %s failed (attempt %d): %s; retrying in %.2f s",
            self.topic,
            self.group,
            self.consumer_name,
            action,
            backoff.failures,
            exc.__cause__ or exc,
            delay,
        )
        return Pause(delay)

    def _ack_until_stopped_steps(self, message: ConsumedMessage) -> Steps[None]:
        """Ack, retrying while Redis is unreachable (an ack that never lands means the message is handled twice)."""
        backoff = Backoff()
        while True:
            try:
                yield from self._ack_steps(message)
                return
            except TxMQConnectionError as exc:
                if self._stop.is_set():
                    self._logger.warning(
                        "topic=%s group=%s stopped before %s could be acked (%s); it will be re-delivered",
                        self.topic,
                        self.group,
                        message.id,
                        exc.__cause__ or exc,
                    )
                    return
                yield self._retry_pause(backoff, f"ack of {message.id}", exc)

    def _ack_in_run_steps(self, message: ConsumedMessage) -> Steps[None]:
        """Ack a handled message. On one server, retried until it lands or the consumer stops (nothing else can be
        read meanwhile); on a cluster, one whose master is down is acked at the next polls while the other
        partitions are read on."""
        if not self._on_cluster:
            yield from self._ack_until_stopped_steps(message)
            return
        try:
            yield from self._ack_steps(message)
        except TxMQConnectionError as exc:
            self._logger.warning(
                "topic=%s group=%s tx=%s ack of %s failed (%s); acked again at the next poll",
                self.topic,
                self.group,
                message.transaction_id,
                message.id,
                exc.__cause__ or exc,
            )
            self._acks_due.append(message)

    def _acks_due_steps(self, *, until_stopped: bool) -> Steps[None]:
        """The acks that failed on a cluster, again: those that fail stay due (or, ``until_stopped``, are retried
        until they land or the consumer stops)."""
        due, self._acks_due = self._acks_due, []
        for message in due:
            if until_stopped:
                yield from self._ack_until_stopped_steps(message)
                continue
            try:
                yield from self._ack_steps(message)
            except TxMQConnectionError:
                self._acks_due.append(message)

    def _next_message_steps(self) -> Steps[ConsumedMessage | None]:
        """The next message for ``run()`` or iteration, from the batch in hand or else a new poll (before which the
        acks that failed on a cluster are tried again): only one this consumer still holds. None once stopped: what
        is left of the batch stays in ``_unhandled``, to hand back."""
        while not self._stop.is_set():
            if not self._unhandled:
                yield from self._acks_due_steps(until_stopped=False)
                batch = yield from self._batch_steps()
                if batch is None:
                    break
                self._unhandled = list(batch)
                continue
            message = self._unhandled[0]  # taken off once the check answered: an interrupt leaves it to hand back
            held = yield from self._held_steps(message)
            if held is None or self._stop.is_set():  # stopped meanwhile: it goes back with the rest
                break
            self._unhandled.pop(0)
            if held:
                return message
        return None

    def _held_steps(self, message: ConsumedMessage) -> Steps[bool | None]:
        """Whether this consumer still holds ``message`` (``lua/consumer_hold.lua``, which also restarts its idle
        time): a message another consumer took over is never handed out. Asked again with backoff while Redis
        cannot answer (None once stopped meanwhile); on a cluster, a partition whose master is down answers False:
        the message stays pending, this consumer's to claim again after ``min_idle_time``."""
        keys = self._by_stream[message.stream]
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                held = yield Command(
                    HOLD, (), {"keys": self._script_keys(keys), "args": [self.group, self.consumer_name, message.id]}
                )
            except REDIS_ERRORS as exc:
                if is_missing_group(exc) or self._partition_may_fail(exc):
                    self._partition_failed(keys, f"checking that it still holds {message.id}", exc)
                    return False
                yield self._retry_pause(backoff, f"checking that it still holds {message.id}", exc)
                continue
            if not int(held):
                self._logger.info(
                    "topic=%s group=%s tx=%s %s was taken over by another consumer (or acked): not handled here",
                    self.topic,
                    self.group,
                    message.transaction_id,
                    message.id,
                )
            return bool(int(held))
        return None

    def _run_steps(self, handler: Callable[[ConsumedMessage], Any], max_messages: int | None) -> Steps[int]:
        """Each message to ``handler``, acked when it returns; one that raises stays pending for re-delivery. Once
        stopped, what was read and not handled is handed back."""
        handled = yield from self._handle_steps(handler, max_messages)
        if self._acks_due:
            yield from self._acks_due_steps(until_stopped=True)
        if self._stop.is_set():
            yield from self._release_steps()
        return handled

    def _handle_steps(self, handler: Callable[[ConsumedMessage], Any], max_messages: int | None) -> Steps[int]:
        handled = 0
        while True:
            message = yield from self._next_message_steps()
            if message is None:
                return handled
            try:
                yield Handle(handler, message)
            except Exception:  # noqa: BLE001 - a failing handler must not kill the consumer
                self._logger.exception(
                    "topic=%s group=%s tx=%s handler failed on %s (delivery %d); will re-deliver",
                    self.topic,
                    self.group,
                    message.transaction_id,
                    message.id,
                    message.delivery_count,
                )
                continue
            yield from self._ack_in_run_steps(message)
            handled += 1
            if max_messages is not None and handled >= max_messages:
                return handled
