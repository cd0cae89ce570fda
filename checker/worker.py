"""The check-back worker (RocketMQ's TransactionalMessageCheckService), run as ``txmq checker``.

One round: for every topic stream the checkers' schedule says is due (``redis_txmq.checker.schedule``; on a full pass,
also every registered topic it does not cover), claim the transactions due for a check (``lua/claim_checks.lua``:
counted, rescheduled or dead-lettered atomically, so N checkers never check one transaction twice per interval) and send
a check request to the transaction's producer group; then apply the answers of the reply stream through the producer's
own end script. Checkers read the reply stream through one consumer group: the answers a dead checker had read are
claimed by a live one after ``claim_idle``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from redis_txmq.core import entries, tracing
from redis_txmq.core.clients import REDIS_ERRORS, blocking_slice, socket_timeout_of
from redis_txmq.core.clients import instance_id as new_instance_id
from redis_txmq.core.config import Settings
from redis_txmq.core.errors import TransactionError, TxMQConnectionError, TxMQError
from redis_txmq.core.groups import (
    CURSOR_START,
    Backoff,
    PendingTakeover,
    ensure_consumer_group,
    is_missing_group,
    read_group,
)
from redis_txmq.core.heartbeat import Heartbeat
from redis_txmq.core.keys import (
    CHECKERS_CONSUMER_GROUP,
    PRODUCERS_CONSUMER_GROUP,
    REPLY_STREAM,
    TOPIC_REGISTRY,
    GroupKeys,
    TopicKeys,
    topic_keys_of_stream,
)
from redis_txmq.core.layout import legacy_producers
from redis_txmq.core.message import LocalTransactionState
from redis_txmq.core.protocol import (
    DueCheck,
    EndCall,
    EndResult,
    EndSource,
    GivenUp,
    RecordAction,
    SentCheck,
    TransactionRecord,
    message_index,
)
from redis_txmq.jobs.settling import settle_jobs
from redis_txmq.ops.admin import registered_topics, resolve_dead_part
from redis_txmq.sync.broker import RedisBroker
from redis_txmq.sync.preload import preload

from .metrics import CheckerMetrics
from .schedule import TopicProbe, due_topic_keys, probe_topics

logger = logging.getLogger(__name__)

ROUND_LOGGER = "redis_txmq.checker.rounds"
"""The logger of the one line each round that did something says (INFO): a logger of its own, so that an operator
sees the check-backs at work without the per-transaction INFO lines; ``txmq checker`` shows it by default."""
round_logger = logging.getLogger(ROUND_LOGGER)


@dataclass
class RoundStats:
    """What one round did; ``Checker.run`` and ``Checker.run_round`` log it as one line unless it is idle."""

    checks_sent: int = 0
    dead_lettered: int = 0
    replies_applied: int = 0
    more_due: bool = False
    """A topic had more due than one scan claims (``SCAN_BATCHES`` × ``batch_size``)."""
    committed: int = 0
    """Transactions the answers applied this round committed (of ``replies_applied``)."""
    rolled_back: int = 0
    answers: int = 0
    """Answers read from the reply stream, applied or not (UNKNOWN, or for a transaction that had ended)."""
    seconds: float = 0.0
    """Time spent scanning and applying answers; not the time spent waiting for answers."""

    @property
    def idle(self) -> bool:
        return not (self.checks_sent or self.dead_lettered or self.answers)

    def summary(self) -> str:
        """``3 check-backs sent, 2 committed, 1 rolled back, 0 dead-lettered, 12 ms``."""
        line = (
            f"{self.checks_sent} check-backs sent, {self.committed} committed, {self.rolled_back} rolled back, "
            f"{self.dead_lettered} dead-lettered"
        )
        unchanged = self.answers - self.replies_applied
        if unchanged > 0:
            line += f", {unchanged} answer{'s' if unchanged > 1 else ''} changed nothing"
        return f"{line}, {self.seconds * 1000:.0f} ms"


_FAILED = object()
"""What a guarded step of ``Checker.run`` returns when it failed."""

_RECORD_UNREAD = TxMQConnectionError("the record of its transaction cannot be read")
"""Why a claimed message of a transaction of several was not asked about: its record's master is down."""


class _NotSentAfterUnread(Exception):
    """A check request that could not be sent after the request it replaces was deleted, unread: both checks are
    given back (the claim's, and the one counted for the request no producer read)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))


SCAN_BATCHES = 10
"""Claim calls per topic in one scan (each up to ``batch_size`` transactions)."""

DUE_TOPICS_PER_ROUND = 1000
"""Topics of the schedule looked at in one round; more due: the next round starts right away."""

FAILED_LOOK_HOLD_MS = 5000
"""A topic whose look failed is held this far on in the schedule (it is retried each round all the same): topics
that keep failing (a cluster master down) do not fill the rounds' read of what is due."""

_Look = tuple[str, str, str]
"""What a look at a topic saw, for the schedule: ``(topic stream, seen_ms, next_ms)``."""


class Checker:
    """One checker instance. ``run`` loops until its stop event is set; ``run_round`` does one round."""

    def __init__(
        self,
        client: Any,
        settings: Settings | None = None,
        *,
        instance_id: str | None = None,
        batch_size: int = 100,
        scan_interval: float | None = None,
        sweep_interval: float = 60.0,
        full_pass_interval: float = 60.0,
        only_topics: Collection[str] | None = None,
        metrics: CheckerMetrics | None = None,
    ) -> None:
        self.client = client
        self.settings = settings or Settings()
        self.broker = RedisBroker(client, self.settings)
        self.instance_id = instance_id or new_instance_id("checker")
        self.batch_size = batch_size
        self.scan_interval = scan_interval or min(1.0, self.settings.check_interval / 2)
        self.sweep_interval = sweep_interval
        self.full_pass_interval = full_pass_interval
        """Seconds between two full passes over every registered topic (``redis_txmq.checker.schedule``)."""
        self.only_topics = frozenset(only_topics) if only_topics is not None else None
        """The topics this checker looks after (None: all): a demo or a benchmark must not check other services'
        transactions with its short timeouts."""
        self.metrics = metrics or CheckerMetrics()
        self.metrics.watch(self.settings)
        self.heartbeat = Heartbeat.of_checker(client, self.instance_id, self.settings)
        self._takeover = PendingTakeover(
            client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP, self.instance_id, self.settings.claim_idle
        )
        self._next_sweep = 0.0
        self._next_full_pass = 0.0
        self._next_legacy_check = 0.0
        self._legacy: list[tuple[str, str]] = []
        self._bad_schedule_members: set[str] = set()
        self._failed_looks: dict[str, TopicKeys] = {}
        self._in_flight: dict[str, dict[str, int]] = {}
        self._sweep_cursors: dict[str, str] = {}
        self._bad_registry_members: set[str] = set()
        self._last_topics: list[TopicKeys] | None = None
        self._registry_unreachable = False
        self._started = False
        self._answered = RoundStats()
        """What the answers applied since the last round line did (they come between scans)."""

    def start(self) -> None:
        """Load the scripts and join the checkers; raises
        [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when Redis cannot be reached (``run``
        retries it with backoff instead)."""
        try:
            self.broker.load_scripts()
            preload(self.heartbeat.script)
            self._join_reply_group()
            self.heartbeat.beat()
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(f"checker {self.instance_id}: could not start: {exc}") from exc
        self._started = True
        self.metrics.started()

    def _join_reply_group(self) -> None:
        ensure_consumer_group(self.client, REPLY_STREAM, CHECKERS_CONSUMER_GROUP)

    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set; each step ends its state changes before the next check of ``stop``.

        Rides out outages: the start is retried with backoff until Redis answers, and a failing step (a topic
        whose keys are damaged, a cluster master that is down, the reply stream unreachable) is logged, counted in
        ``txmq_checker_errors`` and retried, while the other steps and topics go on. While answers cannot be read,
        no check is sent: a check whose answer cannot be applied would only count towards ``check_max``."""
        if not self._start_until_stopped(stop):
            return
        logger.info("checker %s started", self.instance_id)
        next_scan = next_beat = 0.0
        backoff = Backoff(first=0.2, cap=5.0)
        replies_ok = True
        current = RoundStats()
        """The round under way: its scan, and the answers applied until the next scan (one line per round)."""
        try:
            while not stop.is_set():
                healthy = True
                now = time.monotonic()
                if now >= next_beat:
                    healthy &= self._guarded("heartbeat", self._beat) is not _FAILED
                    next_beat = now + self.settings.heartbeat_interval
                if now >= next_scan and replies_ok:
                    stats = self._guarded("scan", self.scan)
                    healthy &= stats is not _FAILED
                    # more due than one scan claims: scan again right after applying the answers at hand
                    more_due = isinstance(stats, RoundStats) and stats.more_due
                    next_scan = now if more_due else now + self.scan_interval
                    if isinstance(stats, RoundStats):
                        self._say_round(current)
                        current = stats
                wait = max(0.0, min(next_scan - time.monotonic(), 1.0))
                block_ms = int(blocking_slice(wait, socket_timeout_of(self.client)) * 1000)
                replies = self._guarded("replies", functools.partial(self.process_replies, block_ms))
                replies_ok = replies is not _FAILED
                healthy &= replies_ok
                current.replies_applied += replies if replies_ok else 0
                if not healthy:
                    # the scan observes the masters; while Redis is away it does not run (or fails before): PING
                    # them here, so that txmq_redis_master_up says so
                    self.metrics.observe_masters(self.client)
                self.metrics.round_done()
                if healthy:
                    backoff.reset()
                else:
                    stop.wait(backoff.next())
        finally:
            self._say_round(current)
            try:
                self.heartbeat.leave()
            except REDIS_ERRORS:
                pass
            self.broker.close()
            logger.info("checker %s stopped", self.instance_id)

    def _start_until_stopped(self, stop: threading.Event) -> bool:
        """Start, retrying with backoff while Redis cannot be reached; False if ``stop`` was set first."""
        backoff = Backoff(first=0.5, cap=30.0)
        while not self._started:
            try:
                self.start()
            except TxMQError as exc:
                delay = backoff.next()
                logger.warning("%s; retrying in %.1f s", exc, delay)
                self.metrics.errors.labels("start").inc()
                self.metrics.step_failed("start", exc)
                self.metrics.observe_masters(self.client)
                self.metrics.round_done()
                if stop.wait(delay):
                    return False
        return not stop.is_set()

    def _guarded(self, step: str, action: Callable[[], Any]) -> Any:
        """Run one step of the loop; a Redis failure is logged and counted, and ``_FAILED`` returned."""
        try:
            return action()
        except (*REDIS_ERRORS, TxMQError) as exc:
            self.metrics.errors.labels(step).inc()
            self.metrics.step_failed(step, exc)
            logger.warning("checker %s: %s failed: %s; retrying", self.instance_id, step, exc)
            return _FAILED

    def _beat(self) -> None:
        self.heartbeat.beat()
        self.metrics.beat()

    def run_round(self) -> RoundStats:
        """One scan and the replies waiting now (no blocking): handy for tests and one-shot runs."""
        if not self._started:
            self.start()
        stats = self.scan()
        stats.replies_applied = self.process_replies(block_ms=None)
        return self._say_round(stats)

    def _say_round(self, stats: RoundStats) -> RoundStats:
        """Add what the answers applied since the last round did to ``stats``, and log the round as one line at
        INFO (``ROUND_LOGGER``) unless it did nothing: an idle checker stays quiet."""
        answered, self._answered = self._answered, RoundStats()
        stats.answers += answered.answers
        stats.committed += answered.committed
        stats.rolled_back += answered.rolled_back
        stats.seconds += answered.seconds
        if not stats.idle:
            round_logger.info("checker %s round: %s", self.instance_id, stats.summary())
        return stats

    def topics(self) -> list[TopicKeys]:
        """The registered topic streams. While the registry cannot be read (its cluster master is down), the last
        list read: the topics on the healthy masters are still checked (logged once until the registry is back)."""
        try:
            topics = registered_topics(self.client, reported=self._bad_registry_members)
        except REDIS_ERRORS as exc:
            if self._last_topics is None:
                raise
            if not self._registry_unreachable:
                self._registry_unreachable = True
                logger.warning(
                    "checker %s: the topic registry %s cannot be read (%s); checking the %d topic streams read last "
                    "until it is back",
                    self.instance_id,
                    TOPIC_REGISTRY,
                    exc,
                    len(self._last_topics),
                )
            return self._last_topics
        if self.only_topics is not None:
            topics = [keys for keys in topics if keys.topic in self.only_topics]
        if self._registry_unreachable:
            self._registry_unreachable = False
            logger.info("checker %s: the topic registry %s can be read again", self.instance_id, TOPIC_REGISTRY)
        self._last_topics = topics
        return topics

    def scan(self) -> RoundStats:
        """Look at the topics due in the checkers' schedule (on a full pass, also at every registered topic the
        schedule does not cover): claim their due transactions, send the check requests, write back when to look
        at each next. A topic that fails (damaged keys, its cluster master down) is logged, counted in
        ``txmq_checker_topic_errors`` and skipped: it is tried again each round, and held in the schedule a few
        seconds on (so that many failing topics never hide the others' due ones); the other topics and the
        replies go on."""
        stats = RoundStats()
        now = time.monotonic()
        legacy = self._legacy_producers(now)
        sweep_due = now >= self._next_sweep
        if sweep_due:
            self._next_sweep = now + self.sweep_interval
        probes: list[TopicProbe] | None = None
        looked: list[TopicKeys] = []
        every_topic = legacy or self.only_topics is not None
        if every_topic or now >= self._next_full_pass or sweep_due:
            self._next_full_pass = now + self.full_pass_interval
            topics = self.topics()
            if every_topic:
                # a producer that never wakes a topic is about (every topic, every round, as its version's checker
                # did); or a checker of a few topics (demo, bench), whom other services' due topics must not hide
                looked = topics
            else:
                probes = probe_topics(self.client, topics, self.settings)
                looked = [probe.keys for probe in probes if probe.uncovered]
        seen_ms, due = "", []
        if self.only_topics is None:
            try:
                seen_ms, due = self._due_topics(stats)
            except TxMQError as exc:
                logger.warning("checker %s: %s; looking at every topic this round", self.instance_id, exc)
                due = [] if legacy else self.topics()
        retried = list(self._failed_looks.values())  # a topic whose look failed is tried again each round
        looking = list({keys.topic_stream: keys for keys in [*due, *looked, *retried]}.values())
        failed: dict[str, BaseException] = {}
        looks: list[_Look] = []
        for keys in looking:
            try:
                looks.append(self._scan_topic(keys, stats))
            except (*REDIS_ERRORS, TxMQError) as exc:
                failed[keys.topic_stream] = exc
                self.metrics.topic_errors.labels(keys.topic).inc()
                logger.error(
                    "checker %s: topic=%s stream %s skipped this round: %s",
                    self.instance_id,
                    keys.topic,
                    keys.topic_stream,
                    exc,
                )
                if seen_ms:
                    looks.append((keys.topic_stream, seen_ms, str(int(seen_ms) + FAILED_LOOK_HOLD_MS)))
        self._failed_looks = {stream: keys for keys in looking if (stream := keys.topic_stream) in failed}
        self._guarded("schedule", functools.partial(self.broker.schedule_topics, looks))
        self._guarded("write jobs", lambda: settle_jobs(self.client, self.settings))
        if sweep_due:
            stats.dead_lettered += self._sweep(self._last_topics or [], probes)
        self._observe_in_flight(looking, probes)
        self.metrics.topics_scanned(looking, failed)
        self._guarded("observe", functools.partial(self.metrics.observe, self.client, self._last_topics or looking))
        stats.seconds = time.monotonic() - now
        return stats

    def _due_topics(self, stats: RoundStats) -> tuple[str, list[TopicKeys]]:
        """The server time and the topics the schedule says are due by then (a member that is no topic stream key
        is dropped from it)."""
        seen_ms, streams = self.broker.due_topics(DUE_TOPICS_PER_ROUND)
        stats.more_due |= len(streams) >= DUE_TOPICS_PER_ROUND
        due, bad = due_topic_keys(streams, self._bad_schedule_members)
        if bad:
            self.broker.schedule_topics([(stream, seen_ms, "") for stream in bad])
        return seen_ms, due

    def _legacy_producers(self, now: float) -> list[tuple[str, str]]:
        """The producers of a layout before the schedule (they never wake a topic) present now, read once per
        heartbeat interval; while there are any, every round looks at every topic, as their version's checker
        did. Unreadable (a master down): as if there were one."""
        if now < self._next_legacy_check:
            return self._legacy
        self._next_legacy_check = now + self.settings.heartbeat_interval
        try:
            legacy = legacy_producers(self.client, self.settings.heartbeat_interval)
        except (*REDIS_ERRORS, TxMQError) as exc:
            # cannot tell: behave as if one were there (the rounds of the version before the schedule)
            legacy = [("?", f"unknown ({exc})")]
        if legacy and not self._legacy:
            logger.warning(
                "checker %s: %d producer(s) of an earlier version (%s) present: every round looks at every topic "
                "until they are gone (upgrade them: docs/upgrade.md)",
                self.instance_id,
                len(legacy),
                ", ".join(f"{group}/{instance}" for group, instance in legacy[:5]),
            )
        elif self._legacy and not legacy:
            logger.info(
                "checker %s: no producer of an earlier version left: rounds follow the schedule",
                self.instance_id,
            )
        self._legacy = legacy
        return legacy

    def _scan_topic(self, keys: TopicKeys, stats: RoundStats) -> _Look:
        # at most SCAN_BATCHES claims per topic per scan: a backlog of one topic does not hold back the
        # answers (and the other topics) until all of it has been requested
        for batch in range(SCAN_BATCHES):
            claimed = self.broker.claim_checks(keys, self.batch_size)
            for transaction_id, reason in claimed.dead_lettered:
                logger.warning("tx=%s topic=%s dead-lettered: %s", transaction_id, keys.topic, reason)
                self.metrics.dead_letters.labels(keys.topic).inc()
            stats.dead_lettered += len(claimed.dead_lettered)
            if claimed.given_up:
                stats.dead_lettered += self._give_up(keys, claimed.given_up)
            self.broker.drop_check_requests(claimed.abandoned_requests)
            stats.checks_sent += self._send_requests(keys, claimed.to_check)
            if len(claimed.to_check) + len(claimed.dead_lettered) + len(claimed.given_up) < self.batch_size:
                break
            if batch == SCAN_BATCHES - 1:
                stats.more_due = True
        return keys.topic_stream, claimed.seen_ms, claimed.next_ms

    def _settle_decided(self, keys: TopicKeys, due: list[DueCheck]) -> tuple[list[DueCheck], list[DueCheck]]:
        """End the messages of transactions of several messages that their record settles without asking anybody:
        decided ones (their producer died before ending them all) with the decision, those whose send did not
        return with ROLLBACK (whatever the decision). Returns the claimed transactions left to ask about, and those
        whose record could not be read (its cluster master is down): they are not asked this round, and their
        check is given back."""
        parents = sorted({check.parent_transaction_id for check in due if check.parent_transaction_id})
        if not parents:
            return due, []
        records = self._records(parents)
        ends: list[EndCall] = []
        left: list[DueCheck] = []
        unread: list[DueCheck] = []
        for check in due:
            if check.parent_transaction_id and check.parent_transaction_id not in records:
                unread.append(check)
                continue
            record = records.get(check.parent_transaction_id)
            outcome = record.outcome_of(check.transaction_id) if record is not None else None
            if outcome is None:
                left.append(check)
                continue
            ends.append(self._end_by_record(keys, check.transaction_id, check.producer_group, check.half_id, outcome))
        self._end_by_records(keys, ends)
        return left, unread

    def _records(self, parents: list[str]) -> dict[str, TransactionRecord]:
        """The records of ``parents``, read in one pipeline; when that fails (a cluster master is down), one by
        one, leaving out those that cannot be read."""
        try:
            return self.broker.decisions(parents)
        except REDIS_ERRORS:
            pass
        records: dict[str, TransactionRecord] = {}
        for parent in parents:
            try:
                records.update(self.broker.decisions([parent]))
            except REDIS_ERRORS as exc:
                self.metrics.errors.labels("records").inc()
                logger.warning("tx=%s its record cannot be read: %s; its messages wait", parent, exc)
        return records

    @staticmethod
    def _end_by_record(
        keys: TopicKeys, transaction_id: str, group: str, half_id: str, outcome: LocalTransactionState
    ) -> EndCall:
        parent = transaction_id.rpartition(".")[0]
        return EndCall(
            keys,
            transaction_id,
            group,
            outcome,
            EndSource.CHECKER,
            remark=f"ended with the record of transaction {parent}",
            half_id=half_id,
        )

    def _end_by_records(self, keys: TopicKeys, ends: list[EndCall]) -> None:
        if ends:
            for end, result in zip(ends, self.broker.end_transactions(ends), strict=True):
                if self._account(end, result):
                    logger.info(
                        "tx=%s topic=%s ended %s by its transaction's record",
                        end.transaction_id,
                        keys.topic,
                        end.outcome.value,
                    )

    def _give_up(self, keys: TopicKeys, given_up: list[GivenUp]) -> int:
        """Messages of transactions of several messages past ``check_max`` or ``max_age``: the record of each
        transaction is pinned first (so it outlives the dead letters); a message whose transaction is decided (or
        whose send did not return) is ended by the record, never dead-lettered; the others are dead-lettered. A
        decision that lands between the pin and the burial resolves the new dead letter at once. A message whose
        record cannot be reached (its cluster master is down) fails alone and is given up again one
        ``check_interval`` later. Returns the number dead-lettered."""
        ends: list[EndCall] = []
        buried: list[GivenUp] = []
        for part in given_up:
            try:
                outcome = self._pin(part)
                if outcome is not None:
                    ends.append(
                        self._end_by_record(keys, part.transaction_id, part.producer_group, part.half_id, outcome)
                    )
                    self._unpin(part)  # pinned by an earlier give-up whose burial failed
                    continue
                dead_id = self.broker.bury_half(
                    keys, part.transaction_id, part.half_id, part.reason, part.producer_group
                )
                if not dead_id:  # ended meanwhile: nothing of it is dead-lettered
                    self._unpin(part)
                    continue
            except (*REDIS_ERRORS, TxMQError) as exc:
                self.metrics.errors.labels("give up").inc()
                logger.warning("tx=%s topic=%s not given up this round: %s", part.transaction_id, keys.topic, exc)
                with contextlib.suppress(*REDIS_ERRORS, TxMQError):
                    self._unpin(part)  # it stays in flight: given up again one check_interval later
                continue
            logger.warning("tx=%s topic=%s dead-lettered: %s", part.transaction_id, keys.topic, part.reason)
            self.metrics.dead_letters.labels(keys.topic).inc()
            buried.append(part)
        self._end_by_records(keys, ends)
        if buried:
            self._resolve_decided(keys, [(part.transaction_id, part.producer_group) for part in buried])
        return len(buried)

    def _pin(self, part: GivenUp) -> LocalTransactionState | None:
        """Pin the record of ``part``'s transaction; the outcome the record gives ``part`` (None: undecided)."""
        index = message_index(part.parent_transaction_id, part.transaction_id)
        try:
            record = self.broker.decide(
                part.parent_transaction_id,
                part.producer_group,
                RecordAction.PIN,
                EndSource.CHECKER,
                [] if index is None else [index],
            )
        except TransactionError as exc:  # a record of another producer group: not this message's transaction
            logger.error("tx=%s its transaction's record refused: %s", part.transaction_id, exc)
            return None
        return record.outcome_of(part.transaction_id)

    def _unpin(self, part: GivenUp) -> None:
        index = message_index(part.parent_transaction_id, part.transaction_id)
        if index is not None:
            self.broker.decide(
                part.parent_transaction_id, part.producer_group, RecordAction.UNPIN, EndSource.CHECKER, [index]
            )

    def _resolve_decided(self, keys: TopicKeys, dead: list[tuple[str, str]]) -> int:
        """Resolve the dead letters ``(transaction id, producer group)`` of messages whose transaction has been
        decided since they were dead-lettered (by its producer, a check-back or an operator) with the outcome its
        record gives each; returns how many."""
        parents = sorted({txid.rpartition(".")[0] for txid, _ in dead})
        records = self.broker.decisions(parents)
        resolved = 0
        for txid, group in dead:
            outcome = records[txid.rpartition(".")[0]].outcome_of(txid)
            if outcome is not None:
                resolve_dead_part(self.broker, keys, txid, group, outcome)
                logger.info(
                    "tx=%s topic=%s dead letter resolved %s by its transaction's record",
                    txid,
                    keys.topic,
                    outcome.value,
                )
                resolved += 1
        return resolved

    def _send_requests(self, keys: TopicKeys, due: list[DueCheck]) -> int:
        """Send one check request per claimed transaction, replacing the one still pending from its last check (at
        most one request per transaction, however long its group has no live producer), then index them. A
        message of a transaction of several whose decision is written is ended with it instead. Returns how many
        were sent.

        ``check_max`` counts the checks that reached a producer: a replaced request that no producer instance read
        (none alive, or none reading: a failover, a reconnect) gives its check back, so an outage of any length
        does not spend the budget. Read means delivered: the request was in a consumer's pending list, or gone (a
        producer deletes what it answers); one still in the stream and in no pending list was never read.

        The requests go out in a pipeline per master of the groups' request streams (one in all off a cluster): a
        group whose stream cannot be written (its cluster master is down) fails alone, logged and counted in
        ``txmq_checker_errors`` (step ``check requests``), and the checks it was not sent give their count back (a
        check never sent is no answer): they are asked again one ``check_interval`` later."""
        due, unread = self._settle_decided(keys, due)
        if not due and not unread:
            return 0
        outcomes: list[tuple[DueCheck, SentCheck | Exception]] = [(check, _RECORD_UNREAD) for check in unread]
        for batch in self._by_master(due):
            outcomes += self._send_batch(keys, batch)
        sent = [note for _, note in outcomes if isinstance(note, SentCheck)]
        failed = [(check, exc) for check, exc in outcomes if isinstance(exc, Exception)]
        self._not_sent(keys, [(check, exc) for check, exc in failed if exc is not _RECORD_UNREAD])
        notes = [*sent, *(note for check, exc in failed for note in self._never_sent(check, exc))]
        stale = set(self.broker.note_check_requests(keys, notes).stale)
        if stale:
            groups = {check.transaction_id: check.producer_group for check in due}
            self.broker.drop_check_requests(
                [(groups[s.transaction_id], s.request_id) for s in sent if s.request_id in stale]
            )
        return len(sent)

    def _by_master(self, checks: list[DueCheck]) -> list[list[DueCheck]]:
        """``checks`` in batches whose producer groups' request streams share a master; one batch off a cluster."""
        if not isinstance(self.client, RedisCluster):
            return [checks]
        batches: dict[str, list[DueCheck]] = {}
        for check in checks:
            stream = GroupKeys(check.producer_group).check_requests
            try:
                master = self.client.get_node_from_key(stream).name
            except REDIS_ERRORS:
                master = stream  # no master known for its slot: its checks go (and fail) on their own
            batches.setdefault(master, []).append(check)
        return list(batches.values())

    def _send_batch(self, keys: TopicKeys, batch: list[DueCheck]) -> list[tuple[DueCheck, SentCheck | Exception]]:
        """Send the check requests of ``batch`` (streams on one master): retire the requests they replace, then
        add theirs. Each check comes back with what was sent, or with the error that kept it from being sent."""
        replaced = [check for check in batch if check.previous_request]
        unread: set[str] = set()  # a retire that failed tells nothing: its checks stay counted
        try:
            unread = self._retire(replaced) if replaced else set()
            counted = {check.transaction_id: check.check_times - (check.transaction_id in unread) for check in batch}
            requested_ms = str(int(time.time() * 1000)).encode()
            pipe = self.client.pipeline(transaction=False)
            for check in batch:
                request = dict(check.fields)
                request.update(
                    {
                        entries.STREAM: keys.topic_stream.encode(),
                        entries.HALF_ID: check.half_id.encode(),
                        entries.CHECK_TIMES: str(counted[check.transaction_id]).encode(),
                        entries.REQUESTED_MS: requested_ms,
                    }
                )
                pipe.xadd(GroupKeys(check.producer_group).check_requests, request)
            replies = pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            return [(check, _NotSentAfterUnread(exc) if check.transaction_id in unread else exc) for check in batch]
        outcomes: list[tuple[DueCheck, SentCheck | Exception]] = []
        for check, request_id in zip(batch, replies, strict=True):
            if isinstance(request_id, Exception):  # refused (out of memory; on a cluster, the slot moved)
                outcomes.append(
                    (check, _NotSentAfterUnread(request_id) if check.transaction_id in unread else request_id)
                )
                continue
            was_unread = check.transaction_id in unread
            outcomes.append(
                (
                    check,
                    SentCheck(
                        check.transaction_id,
                        entries.text(request_id) or "",
                        check.previous_request if was_unread else "",
                    ),
                )
            )
            logger.debug(
                "tx=%s topic=%s check %d sent to group %s%s",
                check.transaction_id,
                keys.topic,
                counted[check.transaction_id],
                check.producer_group,
                "; the last one was never read: it does not count" if was_unread else "",
            )
            self.metrics.checks_sent.labels(check.producer_group).inc()
        return outcomes

    def _retire(self, replaced: list[DueCheck]) -> set[str]:
        """Delete the requests that ``replaced`` checks replace; returns the transactions whose request no producer
        instance had read. A request that could not be deleted (an error of its own) stays behind: a producer
        answers it as a repeat."""
        pipe = self.client.pipeline(transaction=False)
        for check in replaced:
            stream = GroupKeys(check.producer_group).check_requests
            pipe.xack(stream, PRODUCERS_CONSUMER_GROUP, check.previous_request)
            pipe.xdel(stream, check.previous_request)
        retired = iter(pipe.execute(raise_on_error=False))
        unread: set[str] = set()
        for check in replaced:
            acked, deleted = next(retired), next(retired)
            if isinstance(acked, Exception) or isinstance(deleted, Exception):
                continue
            if deleted and not acked:
                unread.add(check.transaction_id)
        return unread

    def _not_sent(self, keys: TopicKeys, failed: list[tuple[DueCheck, Exception]]) -> None:
        """Log and count the check requests that could not be sent, once per producer group."""
        by_group: dict[str, list[Exception]] = {}
        for check, exc in failed:
            by_group.setdefault(check.producer_group, []).append(exc)
        for group, errors in by_group.items():
            self.metrics.errors.labels("check requests").inc()
            logger.warning(
                "checker %s: topic=%s: %d check request(s) to producer group %s (%s) not sent: %s; their checks are "
                "not counted and are asked again in %g s",
                self.instance_id,
                keys.topic,
                len(errors),
                group,
                GroupKeys(group).check_requests,
                errors[0],
                self.settings.check_interval,
            )

    @staticmethod
    def _never_sent(check: DueCheck, why: Exception | None = None) -> list[SentCheck]:
        """The notes of a claimed check whose request was never sent: no request id, and the check count its claim
        left in place of a replaced request (``lua/note_requests.lua`` gives that check back). When the request it
        replaces was deleted unread before the send failed, a second note gives that one's check back too (the
        script gives back while the count is the one the note names: the two in order, each once)."""
        notes = [SentCheck(check.transaction_id, "", str(check.check_times))]
        if isinstance(why, _NotSentAfterUnread) and check.check_times > 1:
            notes.append(SentCheck(check.transaction_id, "", str(check.check_times - 1)))
        return notes

    def _sweep(self, topics: list[TopicKeys], probes: list[TopicProbe] | None) -> int:
        """Look at a slice of the half streams for entries no transaction owns (written by another tool), and
        resolve the dead letters of decided transactions of several messages: of the topics a full pass found
        with half entries or dead letters (every topic when there was no probe)."""
        if probes is not None:
            with_half = [probe.keys for probe in probes if probe.half_entries or probe.error]
            with_dead = {probe.keys.topic_stream for probe in probes if probe.dead_letters or probe.error}
        else:
            with_half, with_dead = topics, {keys.topic_stream for keys in topics}
        self._sweep_cursors = {
            stream: c
            for stream, c in self._sweep_cursors.items()
            if stream in with_dead | {keys.topic_stream for keys in with_half}
        }
        buried_total = 0
        for keys in with_half:
            cursor = self._sweep_cursors.get(keys.topic_stream, CURSOR_START)
            try:
                cursor, buried = self.broker.sweep_half(keys, cursor, self.batch_size)
            except (*REDIS_ERRORS, TxMQError) as exc:
                self.metrics.topic_errors.labels(keys.topic).inc()
                logger.error(
                    "checker %s: topic=%s sweep of %s failed: %s", self.instance_id, keys.topic, keys.half_stream, exc
                )
                continue
            self._sweep_cursors[keys.topic_stream] = cursor
            for entry_id, reason in buried:
                logger.error("topic=%s half entry %s dead-lettered: %s", keys.topic, entry_id, reason)
                self.metrics.dead_letters.labels(keys.topic).inc()
            buried_total += len(buried)
        for keys in topics:
            if keys.topic_stream not in with_dead:
                continue
            try:
                self._resolve_dead_of_decided(keys)
            except (*REDIS_ERRORS, TxMQError) as exc:
                self.metrics.topic_errors.labels(keys.topic).inc()
                logger.error("checker %s: topic=%s dead letters not reconciled: %s", self.instance_id, keys.topic, exc)
        return buried_total

    def _resolve_dead_of_decided(self, keys: TopicKeys) -> int:
        """Dead letters of messages of transactions of several messages whose transaction was decided after they
        were dead-lettered (its producer's block committed later, or a check-back answered for another of its
        messages): resolved with the decision, so the transaction does not stay half published until an operator
        looks. Dead letters are few: one HSCAN of the topic's dead-letter index per sweep."""
        dead = [entries.text(member) or "" for member, _ in self.client.hscan_iter(keys.dead_index, match="*.*")]
        parents = sorted({txid.rpartition(".")[0] for txid in dead})
        if not parents:
            return 0
        records = self._records(parents)
        decided = [
            (txid, records[parent].producer_group)
            for txid in dead
            if (parent := txid.rpartition(".")[0]) in records and records[parent].outcome is not None
        ]
        return self._resolve_decided(keys, decided) if decided else 0

    def _observe_in_flight(self, looked: list[TopicKeys], probes: list[TopicProbe] | None) -> None:
        """``txmq_in_flight{topic}``: the sum over the topic's partitions, as a full pass read them and as read
        again of the topics looked at this round (only the gauges of those topics are set again)."""
        changed: set[str] = set()
        if probes is not None:
            self._in_flight = {}
            for probe in probes:
                if probe.error is None:
                    self._in_flight.setdefault(probe.keys.topic, {})[probe.keys.topic_stream] = probe.in_flight
            changed = set(self._in_flight)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for keys in looked:
                    pipe.hlen(keys.inflight)
                counts = pipe.execute(raise_on_error=False)
        except REDIS_ERRORS:
            counts = []  # counted as topic errors by the scan; the gauges keep their last values
        for keys, count in zip(looked, counts, strict=False):
            if not isinstance(count, Exception):
                self._in_flight.setdefault(keys.topic, {})[keys.topic_stream] = int(count)
                changed.add(keys.topic)
        for topic in changed:
            self.metrics.in_flight.labels(topic).set(sum(self._in_flight[topic].values()))

    def process_replies(self, block_ms: int | None) -> int:
        """Apply the answers of the reply stream: abandoned ones first, then new ones. A reply stream or consumer
        group that Redis lost (restart without persistence, failover to a lagging replica) is recreated."""
        try:
            return self._process_replies(block_ms)
        except redis.ResponseError as exc:
            if not is_missing_group(exc):
                raise
            logger.warning("checker %s: the reply stream's consumer group is gone; recreating it", self.instance_id)
            self._join_reply_group()
            return 0

    def _process_replies(self, block_ms: int | None) -> int:
        applied = 0
        claimed = self._takeover.claim(self.batch_size)
        if claimed:
            logger.info("checker %s took over %d answers of a dead checker", self.instance_id, len(claimed))
            applied += self._apply_all(claimed)
        reply = read_group(
            self.client, CHECKERS_CONSUMER_GROUP, self.instance_id, REPLY_STREAM, self.batch_size, block_ms or None
        )
        for _, batch in entries.stream_batches(reply):
            applied += self._apply_all(batch)
        return applied

    def _apply_all(self, batch: list[Any]) -> int:
        """Apply a batch of answers in one pipeline of end calls (each still one atomic script), then ack them.

        A connection error raises before the ack: the answers stay pending and are applied later."""
        started = time.monotonic()
        done: list[str] = []
        ends: list[EndCall] = []
        contexts: list[dict[str, str]] = []
        for entry_id, fields in batch:
            reply_id = entries.text(entry_id) or ""
            done.append(reply_id)
            if fields is not None:
                field_map = entries.field_map(fields)
                end = self._end_of(reply_id, field_map)
                if end is not None:
                    ends.append(end)
                    contexts.append(tracing.context_of_fields(field_map))
        applied = 0
        if ends:
            for end, result, context in zip(ends, self.broker.end_transactions(ends), contexts, strict=True):
                with tracing.span_for(
                    "settle",
                    end.keys.topic,
                    transaction_id=end.transaction_id,
                    group=end.producer_group,
                    properties=context,
                    consumer=False,
                ) as span:
                    tracing.set_state(span, end.outcome)
                    applied += self._account(end, result)
        if done:
            pipe = self.client.pipeline(transaction=False)
            pipe.xack(REPLY_STREAM, CHECKERS_CONSUMER_GROUP, *done)
            pipe.xdel(REPLY_STREAM, *done)
            pipe.execute()
        self._answered.answers += len(done)
        self._answered.seconds += time.monotonic() - started
        return applied

    def _end_of(self, reply_id: str, fields: dict[str, bytes]) -> EndCall | None:
        """The end call an answer asks for; None (logged) when the answer is malformed."""
        text = entries.text
        stream, txid = text(fields.get(entries.STREAM)), text(fields.get(entries.TRANSACTION_ID))
        group, state_name = text(fields.get(entries.PRODUCER_GROUP)), text(fields.get(entries.STATE))
        try:
            state = LocalTransactionState(state_name)
        except ValueError:
            state = None
        try:
            keys = topic_keys_of_stream(stream) if stream else None
        except ValueError:  # e.g. 'orders#x': not a topic stream key
            keys = None
        if not (keys and txid and group and state):
            logger.error(
                "check answer %s skipped: malformed (needs the stream key of a topic, transaction_id, producer_group "
                "and a state of COMMIT, ROLLBACK or UNKNOWN)",
                reply_id,
            )
            return None
        self.metrics.replies.labels(state.value).inc()
        self._observe_latency(fields)
        parent = text(fields.get(entries.PARENT_TRANSACTION_ID))
        if parent and state is not LocalTransactionState.UNKNOWN:
            # every message of the transaction follows its first decision, whatever later answers say, and one
            # whose send did not return is rolled back; a connection error raises (the answer stays pending), a
            # refused decision skips the answer
            try:
                record = self.broker.decide(parent, group, state, EndSource.CHECKER, unconfirmed_ok=True)
            except TransactionError as exc:
                logger.error("tx=%s check answer %s skipped: %s", txid, state.value, exc)
                return None
            state = record.outcome_of(txid) or state
        return EndCall(
            keys,
            txid,
            group,
            state,
            EndSource.CHECKER,
            remark=text(fields.get(entries.REMARK)) or None,
            half_id=text(fields.get(entries.HALF_ID)) or None,
        )

    def _account(self, end: EndCall, result: EndResult | TxMQError) -> int:
        """Log and count the outcome of one end; 1 if it ended the transaction."""
        topic, txid, state = end.keys.topic, end.transaction_id, end.outcome.value
        if isinstance(result, TransactionError):
            logger.info("tx=%s topic=%s check answer %s not applied: %s", txid, topic, state, result)
            return 0
        if isinstance(result, TxMQError):
            logger.error("tx=%s topic=%s check answer %s refused: %s", txid, topic, state, result)
            return 0
        if not result.applied:
            return 0
        if result.state == LocalTransactionState.COMMIT.value:
            self.metrics.commits.labels(topic).inc()
            self._answered.committed += 1
        elif result.state == LocalTransactionState.ROLLBACK.value:
            self.metrics.rollbacks.labels(topic).inc()
            self._answered.rolled_back += 1
        logger.info("tx=%s topic=%s resolved by check-back: %s", txid, topic, result.state)
        return 1

    def _observe_latency(self, fields: dict[str, bytes]) -> None:
        try:
            requested_ms = int(fields.get(entries.REQUESTED_MS) or b"0")
        except ValueError:
            return
        if requested_ms:
            self.metrics.check_latency.observe(max(0.0, time.time() - requested_ms / 1000))
