"""What the checker measures besides its own work, for alerting: the oldest in-flight transaction of each topic, the
dead letters waiting for an operator, each consumer group's lag, and which Redis masters answer; and the labels its
counters take from what Redis holds (topics, producer groups), created at 0 as they appear.

Read with the queries of ``txmq status`` (``redis_txmq.ops.admin``, in pipelines over all topics), every ``interval``
seconds (not every round: about five commands per topic stream), less often with thousands of topics
(``TOPICS_PER_SECOND``). A topic that cannot be read keeps its last values and is counted in
``txmq_checker_errors_total{step="observe"}``; a topic or consumer group that is gone drops out of the gauges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from redis_txmq.core import entries
from redis_txmq.core.clients import REDIS_ERRORS, server_ms
from redis_txmq.core.keys import GROUP_REGISTRY, TopicKeys
from redis_txmq.ops.admin import by_topic, consumer_lags, streams_figures
from redis_txmq.transport.connection import server_nodes


class ObservedMetrics(Protocol):
    """What the observer sets of the checker's metrics (``redis_txmq.checker.metrics.CheckerMetrics``, which
    owns an observer: the observer names only the series it writes)."""

    checks_sent: Counter
    commits: Counter
    rollbacks: Counter
    dead_letters: Counter
    errors: Counter
    topic_errors: Counter
    consumer_dead_letters: Gauge
    consumer_lag: Gauge
    consumer_oldest_pending: Gauge
    consumer_pending: Gauge
    dead_letters_waiting: Gauge
    master_up: Gauge
    oldest_in_flight: Gauge


logger = logging.getLogger(__name__)

OBSERVE_INTERVAL = 10.0
"""Default seconds between two observations (Prometheus scrapes every 15-60 s, usually)."""

TOPICS_PER_SECOND = 100
"""At most this many topic streams observed per second on average: with thousands of topics an observation comes
less often than ``interval`` (every 100 s at 10,000), so that the gauges of topics where nothing happens do not cost
Redis more than the work (about five commands per stream, in pipelines)."""


class Observer:
    """Sets the checker's gauges of topics, consumer groups and masters from what Redis holds now."""

    def __init__(
        self, metrics: ObservedMetrics, interval: float = OBSERVE_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.metrics = metrics
        self.interval = interval
        self._clock = clock
        self._next = 0.0
        self._next_masters = 0.0
        self._topics: set[str] = set()
        self._groups: set[tuple[str, str]] = set()
        self._masters: set[str] = set()

    def observe(self, client: Any, topics: list[TopicKeys], force: bool = False) -> bool:
        """Observe now if ``interval`` (or one second per ``TOPICS_PER_SECOND`` topic streams, when longer) has
        passed since the last time (or ``force``); True if it did."""
        now = self._clock()
        if not force and now < self._next:
            return False
        self._next = now + max(self.interval, len(topics) / TOPICS_PER_SECOND)
        self._observe_topics(client, topics)
        self._observe_producer_groups(client)
        self.observe_masters(client, force=True)
        return True

    def observe_masters(self, client: Any, force: bool = False) -> bool:
        """``txmq_redis_master_up`` alone, if ``interval`` has passed since the masters were last pinged (or
        ``force``); True if it did. The checker's loop calls it while its scan cannot run (Redis away), when ``observe``
        is not reached: a single server that is down shows as down."""
        now = self._clock()
        if not force and now < self._next_masters:
            return False
        self._next_masters = now + self.interval
        self._observe_masters(client)
        return True

    def _observe_topics(self, client: Any, topics: list[TopicKeys]) -> None:
        now_ms = _server_ms(client)
        m = self.metrics
        seen_topics: set[str] = set()
        seen_groups: set[tuple[str, str]] = set()
        # a topic that could not be read has its error in place of its figures (or its lags): it keeps its gauges
        figures_read = streams_figures(client, topics, now_ms)
        all_figures = dict(zip([keys.topic_stream for keys in topics], figures_read, strict=True))
        all_lags = consumer_lags(client, topics)
        for topic, partitions in by_topic(topics).items():
            seen_topics.add(topic)
            for counter in (m.dead_letters, m.commits, m.rollbacks, m.topic_errors):
                counter.labels(topic)  # at 0 from now on: increase() sees the first one (a new series it does not)
            figures = [all_figures[keys.topic_stream] for keys in partitions]
            lags = all_lags.get(topic, [])
            error = next((f for f in [*figures, lags] if isinstance(f, Exception)), None)
            if error is not None:
                m.errors.labels("observe").inc()
                logger.warning("topic=%s not observed (gauges keep their last values): %s", topic, error)
                seen_groups |= {group for group in self._groups if group[0] == topic}
                continue
            ages = [f["oldest_in_flight_age_seconds"] for f in figures if f["oldest_in_flight_age_seconds"] is not None]
            m.oldest_in_flight.labels(topic).set(max(ages, default=0.0))
            m.dead_letters_waiting.labels(topic).set(sum(f["dead_letters"] for f in figures))
            for row in lags:
                labels = (topic, row["group"])
                seen_groups.add(labels)
                if row["undelivered"] is None:
                    _remove(m.consumer_lag, labels)  # unknown: absent rather than a made-up number
                else:
                    m.consumer_lag.labels(*labels).set(row["undelivered"])
                m.consumer_pending.labels(*labels).set(row["pending"])
                m.consumer_oldest_pending.labels(*labels).set(row["oldest_pending_idle_seconds"] or 0.0)
                if row["dead_letters"] is not None:
                    m.consumer_dead_letters.labels(*labels).set(row["dead_letters"])
        for topic in self._topics - seen_topics:
            for gauge in (m.oldest_in_flight, m.dead_letters_waiting):
                _remove(gauge, (topic,))
        for labels in self._groups - seen_groups:
            for gauge in (m.consumer_lag, m.consumer_pending, m.consumer_oldest_pending, m.consumer_dead_letters):
                _remove(gauge, labels)
        self._topics, self._groups = seen_topics, seen_groups

    def _observe_producer_groups(self, client: Any) -> None:
        """``txmq_checks_sent_total{group}`` at 0 for every registered producer group before its first check request:
        ``rate()`` and ``increase()`` see the first requests, not only those after it."""
        try:
            members = client.smembers(GROUP_REGISTRY)
        except REDIS_ERRORS as exc:
            self.metrics.errors.labels("observe").inc()
            logger.warning("the producer groups in %s were not read: %s", GROUP_REGISTRY, exc)
            return
        for member in members:
            group = entries.text(member)
            if group:
                self.metrics.checks_sent.labels(group)

    def _observe_masters(self, client: Any) -> None:
        """``txmq_redis_master_up{address}``: a PING to the server (each master of a cluster). Masters the client
        cannot even list (the Sentinels do not answer) keep their addresses, at 0."""
        gauge = self.metrics.master_up
        try:
            nodes = server_nodes(client)
        except REDIS_ERRORS as exc:
            logger.warning("the Redis masters cannot be listed: %s", exc)
            for address in self._masters or {"unknown"}:
                gauge.labels(address).set(0)
            return
        seen = set()
        for address, node in nodes:
            seen.add(address)
            try:
                node.ping()
                up = 1
            except REDIS_ERRORS as exc:
                logger.warning("Redis master %s does not answer: %s", address, exc)
                up = 0
            gauge.labels(address).set(up)
        for address in (self._masters | {"unknown"}) - seen:
            _remove(gauge, (address,))
        self._masters = seen


def _remove(gauge: Any, labels: tuple[str, ...]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass


def _server_ms(client: Any) -> int:
    """The server's clock (ages are measured on it); the local one when no server answers TIME (a cluster's
    default node down): the ages of the topics on the other masters are still worth having."""
    try:
        return server_ms(client)
    except REDIS_ERRORS:
        return int(time.time() * 1000)
