"""Which topics a checker round looks at: those the checkers' schedule says are due (``txmq:schedule``,
``redis_txmq.core.keys.SCHEDULE``), and, on a full pass, every registered topic the schedule does not cover.

The schedule is what makes an idle checker cheap: a round reads one sorted set instead of visiting every topic. It
holds each topic at or before its earliest check due (a look, ``lua/claim_checks.lua``, says when; a prepare into a
topic with nothing unchecked wakes it, ``lua/prepare_half.lua``). What can miss it: a producer of the layout before
the schedule (v0.1.0), which never wakes a topic — while one is present, every round is a full pass — and, on
Cluster, a producer that died between its prepare and its wake (another hash slot: the client writes it). A full
pass finds those: it reads a few cheap figures of every topic in pipelines (no script call, no claim) and looks only
at the topics whose earliest due (or outcome to forget) the schedule does not cover.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis_txmq.core.config import Settings
from redis_txmq.core.keys import SCHEDULE, TopicKeys, topic_keys_of_stream
from redis_txmq.transport.connection import pipeline_each

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicProbe:
    """What a full pass read of one topic stream (server ms; None for none)."""

    keys: TopicKeys
    next_ms: int | None
    """When the topic needs a look: its earliest check due, or when its oldest remembered outcome is forgotten."""
    scheduled_ms: int | None
    """Its score in the schedule."""
    half_entries: int = 0
    dead_letters: int = 0
    in_flight: int = 0
    error: Exception | None = None

    @property
    def uncovered(self) -> bool:
        """The schedule would look at it later than it needs (or never): look at it now. A topic that could not be
        read is looked at too: the look reports (and counts) the error."""
        if self.error is not None:
            return True
        return self.next_ms is not None and (self.scheduled_ms is None or self.scheduled_ms > self.next_ms)


def _first_score(reply: Any) -> float | None:
    return float(reply[0][1]) if reply else None


def _probe(keys: TopicKeys, replies: Sequence[Any], settings: Settings) -> TopicProbe:
    errors = [reply for reply in replies if isinstance(reply, Exception)]
    if errors:
        return TopicProbe(keys, None, None, error=errors[0])
    unchecked, due, ended, scheduled, half_entries, dead_letters, in_flight = replies
    candidates = []
    if (born := _first_score(unchecked)) is not None:
        candidates.append(born + settings.transaction_timeout * 1000)
    if (next_check := _first_score(due)) is not None:
        candidates.append(next_check)
    if (ended_at := _first_score(ended)) is not None:
        candidates.append(ended_at + settings.dedupe_window * 1000)
    return TopicProbe(
        keys,
        int(min(candidates)) if candidates else None,
        int(float(scheduled)) if scheduled is not None else None,
        int(half_entries),
        int(dead_letters),
        int(in_flight),
    )


def probe_topics(client: Any, topics: Sequence[TopicKeys], settings: Settings) -> list[TopicProbe]:
    """Read every topic's figures, pipelined (plain commands: also on Cluster, where the topics of a master that is
    down come back with their error, and are looked at: the look reports it)."""
    probes: list[TopicProbe] = []
    for keys, replies in zip(topics, pipeline_each(client, topics, _queue_probe), strict=True):
        if isinstance(replies, Exception):
            probes.append(TopicProbe(keys, None, None, error=replies))
        else:
            probes.append(_probe(keys, replies, settings))
    return probes


def _queue_probe(pipe: Any, keys: TopicKeys) -> int:
    pipe.zrange(keys.unchecked, 0, 0, withscores=True)
    pipe.zrange(keys.due, 0, 0, withscores=True)
    pipe.zrange(keys.ended_at, 0, 0, withscores=True)
    pipe.zscore(SCHEDULE, keys.topic_stream)
    pipe.xlen(keys.half_stream)
    pipe.hlen(keys.dead_index)
    pipe.hlen(keys.inflight)
    return 7


def due_topic_keys(streams: Iterable[str], reported: set[str]) -> tuple[list[TopicKeys], list[str]]:
    """The ``TopicKeys`` of the due members of the schedule, and the members that are no topic stream key
    (written by another tool: logged once, and dropped from the schedule by the caller, or they would be due
    forever)."""
    keys: list[TopicKeys] = []
    bad: list[str] = []
    for stream in streams:
        try:
            keys.append(topic_keys_of_stream(stream))
        except ValueError:
            bad.append(stream)
            if stream not in reported:
                reported.add(stream)
                logger.error("checkers' schedule %s: %r is not a topic stream key; dropped", SCHEDULE, stream)
    return keys, bad
