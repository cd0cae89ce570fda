"""What an operator asks of a deployment: its status, and the dead-lettered transactions to resolve."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

from ..core import entries
from ..core.clients import server_ms
from ..core.durability import has_waitaof
from ..core.errors import TransactionConflictError, TransactionNotFoundError
from ..core.keys import (
    CHECKER_INSTANCES,
    CHECKER_LEVELS,
    GROUP_REGISTRY,
    JOB_REGISTRY,
    TOPIC_REGISTRY,
    GroupKeys,
    TopicKeys,
    topic_keys_of_stream,
)
from ..core.message import LocalTransactionState, validate_name
from ..core.protocol import RESOLVES_TO, DeadAction, EndResult, EndSource, RecordAction, message_index
from ..core.states import State, move
from ..sync.broker import RedisBroker
from ..transport.connection import checked, pipeline_all, pipeline_each, server_info, server_nodes

logger = logging.getLogger(__name__)

DEAD_FIELDS = {
    "dead_reason": "reason",
    "check_times": "check_times",
    "remark": "remark",
    "dead_at_ms": "dead_at_ms",
    "half_id": "half_id",
    "born_ms": "born_ms",
}


def registered_topics(client: Any, topic: str | None = None, reported: set[str] | None = None) -> list[TopicKeys]:
    """Every registered topic stream, or those of one topic. A member that is not a topic stream key (written by
    another tool) is skipped with a logged reason — once, if the caller keeps a ``reported`` set: it must not stop a
    checker or an operator command."""
    keys = []
    for member in sorted(client.smembers(TOPIC_REGISTRY)):
        stream = entries.text(member) or ""
        try:
            keys.append(topic_keys_of_stream(stream))
        except ValueError:
            if reported is None or stream not in reported:
                if reported is not None:
                    reported.add(stream)
                logger.error("topic registry %s: %r is not a topic stream key; skipped", TOPIC_REGISTRY, stream)
    return [k for k in keys if topic is None or k.topic == topic]


def by_topic(streams: list[TopicKeys]) -> dict[str, list[TopicKeys]]:
    """Topic streams grouped by topic (its partitions together), in the order given."""
    topics: dict[str, list[TopicKeys]] = {}
    for keys in streams:
        topics.setdefault(keys.topic, []).append(keys)
    return topics


def stream_figures(client: Any, keys: TopicKeys, now_ms: int) -> dict[str, Any]:
    """One topic stream (partition) in one pipeline: committed entries, transactions in flight, the age of the oldest
    half message (None when nothing is in flight), dead-lettered transactions."""
    return checked(streams_figures(client, [keys], now_ms)[0])


def streams_figures(client: Any, streams: list[TopicKeys], now_ms: int) -> list[dict[str, Any] | Exception]:
    """``stream_figures`` of many streams, pipelined (``pipeline_each``); a
    stream whose figures could not be read (its master down, say) has the error in its place."""

    def queue(pipe: Any, keys: TopicKeys) -> int:
        pipe.xlen(keys.topic_stream)
        pipe.hlen(keys.inflight)
        pipe.xrange(keys.half_stream, count=1)
        pipe.xlen(keys.dead_stream)
        return 4

    results: list[dict[str, Any] | Exception] = []
    for keys, replies in zip(streams, pipeline_each(client, streams, queue), strict=True):
        if isinstance(replies, Exception):
            results.append(replies)
            continue
        error = next((r for r in replies if isinstance(r, Exception)), None)
        if error is not None:
            results.append(error)
            continue
        committed, in_flight, oldest, dead = replies
        oldest_age = max(0.0, (now_ms - entries.entry_ms(oldest[0][0])) / 1000) if oldest else None
        results.append(
            {
                "topic": keys.topic,
                "stream": keys.topic_stream,
                "committed": committed,
                "in_flight": in_flight,
                "oldest_in_flight_age_seconds": oldest_age,
                "dead_letters": dead,
            }
        )
    return results


def _is_missing_key(reply: Any) -> bool:
    """XINFO GROUPS of a stream that does not exist (a partition nothing was committed to yet)."""
    return isinstance(reply, redis.ResponseError) and "no such key" in str(reply).lower()


def consumer_lag(client: Any, partitions: list[TopicKeys]) -> list[dict[str, Any]]:
    """Every consumer group of one topic, over the partitions given (all of the topic's, usually), one row each:

    - ``undelivered``: entries no consumer of the group was given yet (Redis 7's ``lag`` of ``XINFO GROUPS``, which
      Redis computes from the group's entries-read counter), the sum over the partitions whose lag is known. Redis
      cannot tell it for a partition with entries deleted (``XDEL``) past the group's last delivery, or whose group
      was set to an arbitrary id: such partitions are counted in ``undelivered_unknown_partitions`` (``undelivered``
      is then a lower bound; None when no partition's is known). On Redis 7.0 (seen on 7.0.15), once the group has
      read past such a deleted entry, its lag stays one too high per entry: an end refused because its op stream
      key held another type deletes the topic entry it had just written (``lua/include/publish_outcome.lua``);
    - ``pending``: delivered and not acknowledged; ``oldest_pending_idle_seconds``: the longest any of them has
      been held since its last delivery, over the partitions (None when nothing is pending): not the lowest id's, which
      a claim may have delivered again a moment ago (``_longest_idle``, ``PENDING_SCAN_LIMIT``);
    - ``dead_letters``: entries the group gave up on (``txmq:{<stream>}:consumer-dead:<group>``), None for a group
      whose name the library would refuse (made by another tool: it has no such stream);
    - ``consumers``: members of the group (the most on one partition), ``partitions``: partitions holding the group.

    Each command names its stream or a key in the stream's hash slot, so a cluster client sends it to that stream's
    master."""
    lags = consumer_lags(client, partitions)[partitions[0].topic] if partitions else []
    if isinstance(lags, Exception):
        raise lags
    return lags


def _group_name(info: dict[str, Any]) -> str:
    return entries.text(info["name"]) or ""


def _dead_stream(keys: TopicKeys, info: dict[str, Any]) -> str | None:
    """The group's dead-letter stream; None for a group whose name the library would refuse (made by another
    tool: it has none)."""
    try:
        return keys.consumer_dead_stream(_group_name(info))
    except ValueError:
        return None


def consumer_lags(client: Any, streams: list[TopicKeys]) -> dict[str, list[dict[str, Any]] | Exception]:
    """``consumer_lag`` of every topic of ``streams`` (their partitions together), topic -> its rows, or the
    error that kept it from being read (a partition on a master that is down). Rounds of pipelines (``pipeline_each``):
    ``XINFO GROUPS``, then ``XPENDING`` (the first ``PENDING_HEAD`` pending entries, with their idle times) and ``XLEN``
    per group, then, for a group with more pending (``_longest_idle``), ``XPENDING ... IDLE`` over the rest."""
    failed: dict[str, Exception] = {}
    # each group found: its partition, XINFO's row, its dead-letter stream, and what is asked of it next
    found: list[tuple[TopicKeys, dict[str, Any], str | None, tuple[str, ...]]] = []

    def queue_info(pipe: Any, keys: TopicKeys) -> int:
        pipe.xinfo_groups(keys.topic_stream)
        return 1

    for keys, replies in zip(streams, pipeline_each(client, streams, queue_info), strict=True):
        reply = replies if isinstance(replies, Exception) else replies[0]
        if _is_missing_key(reply):
            continue
        if isinstance(reply, Exception):
            failed.setdefault(keys.topic, reply)
            continue
        for info in reply:
            dead_stream = _dead_stream(keys, info)
            calls = ("head",) if int(info.get("pending") or 0) else ()
            found.append((keys, info, dead_stream, calls + ("dead",) if dead_stream is not None else calls))

    def queue_group(pipe: Any, group: tuple[TopicKeys, dict[str, Any], str | None, tuple[str, ...]]) -> int:
        keys, info, dead_stream, calls = group
        if "head" in calls:
            pipe.xpending_range(keys.topic_stream, _group_name(info), min="-", max="+", count=PENDING_HEAD)
        if dead_stream is not None:
            pipe.xlen(dead_stream)
        return len(calls)

    answered: list[tuple[TopicKeys, dict[str, Any], dict[str, Any]]] = []
    for (keys, info, _, calls), replies in zip(found, pipeline_each(client, found, queue_group), strict=True):
        error = (
            replies if isinstance(replies, Exception) else next((r for r in replies if isinstance(r, Exception)), None)
        )
        if error is not None:
            failed.setdefault(keys.topic, error)
            continue
        answered.append((keys, info, dict(zip(calls, replies, strict=True))))
    idle_ms = _longest_idle(client, answered, failed)
    rows: dict[str, dict[str, dict[str, Any]]] = {keys.topic: {} for keys in streams}
    for index, (keys, info, answers) in enumerate(answered):
        group = _group_name(info)
        lag = info.get("lag")
        row = rows[keys.topic].setdefault(
            group,
            {
                "topic": keys.topic,
                "group": group,
                "partitions": 0,
                "consumers": 0,
                "undelivered": None,
                "undelivered_unknown_partitions": 0,
                "pending": 0,
                "oldest_pending_idle_seconds": None,
                "dead_letters": 0,
            },
        )
        row["partitions"] += 1
        row["consumers"] = max(row["consumers"], int(info.get("consumers") or 0))
        if lag is None:
            row["undelivered_unknown_partitions"] += 1
        else:
            row["undelivered"] = (row["undelivered"] or 0) + int(lag)
        row["pending"] += int(info.get("pending") or 0)
        if index in idle_ms:
            idle = idle_ms[index] / 1000
            previous = row["oldest_pending_idle_seconds"]
            row["oldest_pending_idle_seconds"] = idle if previous is None else max(previous, idle)
        if "dead" not in answers:
            row["dead_letters"] = None
        elif row["dead_letters"] is not None:
            row["dead_letters"] += int(answers["dead"])
    return {
        topic: failed[topic] if topic in failed else [groups[group] for group in sorted(groups)]
        for topic, groups in rows.items()
    }


PENDING_HEAD = 100
"""Pending entries of a group (per partition) read with their idle times in every observation: all of them, for
most groups."""

PENDING_SCAN_LIMIT = 10_000
"""A group (partition) with more pending entries than ``PENDING_HEAD``, and at most this many, has the rest
scanned with ``XPENDING ... IDLE`` (which walks its whole pending list: about 0.2 ms per 1,000 entries). Above it,
``oldest_pending_idle_seconds`` is the longest idle of the first ``PENDING_HEAD`` only (a lower bound)."""


def _longest_idle(
    client: Any, groups: list[tuple[TopicKeys, dict[str, Any], dict[str, Any]]], failed: dict[str, Exception]
) -> dict[int, int]:
    """Index in ``groups`` -> the longest idle time (ms) of the group's pending entries on that partition.

    Entries are delivered in id order, but a claim (``XAUTOCLAIM``, ``XCLAIM``) or a read of a consumer's own history
    delivers one again, so the longest idle is not the lowest id's. The first ``PENDING_HEAD`` entries come with their
    idle times (``answers["head"]``); a group with more pending has the rest read with ``XPENDING <stream> <group> IDLE
    <longest so far + 1> (<last id read> + COUNT`` until a page comes back short: only entries idle longer than any seen
    come back, and each page goes on from where the last ended (one walk of the list)."""
    longest: dict[int, int] = {}
    # index -> (the id the next read starts after, the idle time (ms) it asks more than)
    scans: dict[int, tuple[str, int]] = {}
    for index, (_, info, answers) in enumerate(groups):
        head = answers.get("head")
        if not head:
            continue
        longest[index] = max(int(entry["time_since_delivered"]) for entry in head)
        if len(head) == PENDING_HEAD < int(info.get("pending") or 0) <= PENDING_SCAN_LIMIT:
            scans[index] = (entries.text(head[-1]["message_id"]) or "", longest[index])

    def queue_scan(pipe: Any, scan: tuple[int, tuple[str, int]]) -> int:
        index, (after, idle) = scan
        keys, info, _ = groups[index]
        pipe.xpending_range(
            keys.topic_stream, _group_name(info), min=f"({after}", max="+", count=PENDING_HEAD, idle=idle + 1
        )
        return 1

    while scans:
        order = list(scans.items())
        next_scans: dict[int, tuple[str, int]] = {}
        for (index, _), replies in zip(order, pipeline_each(client, order, queue_scan), strict=True):
            page = replies if isinstance(replies, Exception) else replies[0]
            if isinstance(page, Exception):
                failed.setdefault(groups[index][0].topic, page)
                continue
            if page:
                longest[index] = max(longest[index], *(int(entry["time_since_delivered"]) for entry in page))
            if len(page) == PENDING_HEAD:
                next_scans[index] = (entries.text(page[-1]["message_id"]) or "", longest[index])
        scans = next_scans
    return longest


def status(client: Any, live_seconds: float) -> dict[str, Any]:
    """Per topic stream: committed, in_flight, oldest in-flight age, dead letters; per consumer group of each topic:
    its lag (``consumer_lag``); per producer group: live instances and pending check requests; live checker instances.
    An instance is live if it beat within ``live_seconds``."""
    now = server_ms(client)
    live_from = now - int(live_seconds * 1000)
    listed = registered_topics(client)
    topics = []
    for figures in streams_figures(client, listed, now):
        if isinstance(figures, Exception):
            raise figures
        topics.append(figures)
    consumer_groups = []
    for lags in consumer_lags(client, listed).values():
        if isinstance(lags, Exception):
            raise lags
        consumer_groups.extend(lags)
    groups = []
    for group in sorted(entries.text(g) or "" for g in client.smembers(GROUP_REGISTRY)):
        gkeys = GroupKeys(group)
        live = client.zcount(gkeys.producers, live_from, "+inf")
        pending = client.xlen(gkeys.check_requests)  # answered requests are deleted: the length is the backlog
        groups.append(
            {
                "producer_group": group,
                "live_instances": live,
                "pending_check_requests": pending,
                "durability": _levels(client, gkeys.producers, gkeys.durability_levels, live_from),
            }
        )
    checkers = client.zcount(CHECKER_INSTANCES, live_from, "+inf")
    checker_levels = _levels(client, CHECKER_INSTANCES, CHECKER_LEVELS, live_from)
    return {
        "servers": servers(client),
        "topics": topics,
        "consumer_groups": consumer_groups,
        "producer_groups": groups,
        "checkers": {"live_instances": checkers, "durability": checker_levels},
        "write_jobs": write_jobs(client, now),
    }


WRITE_JOBS_READ = 1000
"""How many unsettled write jobs ``write_jobs`` reads the record of."""


def write_jobs(client: Any, now_ms: int) -> dict[str, Any]:
    """The Spark write jobs not settled yet (``txmq:jobs``): how many, how many of them (among the
    ``WRITE_JOBS_READ`` read) are decided and wait for their publishing to finish, the oldest one's age (since its first
    lease, or its decision), and how many are parked for an operator (rows that cannot be published; their reasons in
    ``parked_reasons``, at most ten). A job stays listed while its driver runs it; one left by a dead driver is settled
    by ``txmq checker``."""
    listed = client.zrange(JOB_REGISTRY, 0, WRITE_JOBS_READ - 1)
    parked = client.zrangebyscore(JOB_REGISTRY, "+inf", "+inf", start=0, num=10)
    decided, starts, reasons = 0, [], []
    if listed or parked:
        pipe = client.pipeline(transaction=False)
        for member in listed:
            pipe.hmget(entries.text(member) or "", "outcome", "started_ms", "decided_ms")
        for member in parked:
            pipe.hget(entries.text(member) or "", "parked")
        replies = pipe.execute()
        for outcome, started, decided_ms in replies[: len(listed)]:
            decided += outcome is not None
            since = started or decided_ms
            if since is not None:
                starts.append(int(since))
        reasons = [
            {"job": entries.text(member), "reason": entries.text(reason)}
            for member, reason in zip(parked, replies[len(listed) :], strict=True)
        ]
    oldest = max(0.0, (now_ms - min(starts)) / 1000) if starts else None
    return {
        "unsettled": int(client.zcard(JOB_REGISTRY)),
        "decided": decided,
        "oldest_age_seconds": oldest,
        "parked": int(client.zcount(JOB_REGISTRY, "+inf", "+inf")),
        "parked_reasons": reasons,
    }


def _levels(client: Any, instances_key: str, levels_key: str, live_from: int) -> dict[str, int]:
    """Durability level -> how many live instances write with it (instances from before levels were recorded
    count as ``master``, which is what they did)."""
    live = [entries.text(member) or "" for member in client.zrangebyscore(instances_key, live_from, "+inf")]
    if not live:
        return {}
    levels = client.hmget(levels_key, live)
    counts: dict[str, int] = {}
    for level in levels:
        name = entries.text(level) or "master"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def servers(client: Any) -> list[dict[str, Any]]:
    """The server behind the client (each master of a cluster): address, software and version, role, replicas.

    ``version`` is the software's own (Valkey's ``valkey_version``), ``redis_version`` the Redis protocol level it
    claims; features are gated on the latter, never on the name."""
    rows = []
    for address, node in server_nodes(client):
        info = server_info(node, "server", "replication", "persistence")
        replicas = [
            f"{value['ip']}:{value['port']}"
            for key, value in sorted(info.items())
            if key.startswith("slave") and isinstance(value, dict) and "ip" in value
        ]
        rows.append(
            {
                "address": address,
                "server": str(info.get("server_name") or ("redis" if info else "unknown")),
                "version": str(info.get("valkey_version") or info.get("redis_version") or "unknown"),
                "redis_version": str(info.get("redis_version") or "unknown"),
                "role": str(info.get("role") or "unknown"),
                "replicas": replicas,
                "durability_levels": available_levels(info),
            }
        )
    return rows


def available_levels(info: dict[str, Any]) -> list[str]:
    """The durability levels a server can give now: ``replica`` with a replica connected, ``aof`` with WAITAOF
    and an append-only file (unknown without INFO: none listed)."""
    if not info:
        return []
    levels = ["master"]
    if int(info.get("connected_slaves", 0)) > 0:
        levels.append("replica")
    if has_waitaof(info) and str(info.get("aof_enabled", "0")) == "1":
        levels.append("aof")
    return levels


def dead_letters(client: Any, topic: str | None = None, count: int = 1000) -> list[dict[str, Any]]:
    """Dead-lettered transactions, oldest first, as plain dicts (``transaction_id``, ``topic``, ``reason``,
    ``check_times``, ...). The body is left out; read it from the dead-letter stream."""
    if topic is not None:
        validate_name(topic, "topic")
    return [
        dead_letter_row(keys, entry_id, raw)
        for keys in registered_topics(client, topic)
        for entry_id, raw in client.xrange(keys.dead_stream, count=count)
    ]


def dead_letter_row(keys: TopicKeys, entry_id: Any, raw: Any) -> dict[str, Any]:
    """One entry of a dead-letter stream as ``txmq dead list`` and the console show it (without the body)."""
    fields = entries.field_map(raw)
    row: dict[str, Any] = {
        "transaction_id": entries.text(fields.get(entries.TRANSACTION_ID)),
        "topic": keys.topic,
        "stream": keys.topic_stream,
        "dead_letter_id": entries.text(entry_id),
        "producer_group": entries.text(fields.get(entries.PRODUCER_GROUP)),
        "keys": entries.text(fields.get(entries.KEYS)),
        "tags": entries.text(fields.get(entries.TAGS)),
        "body_bytes": len(fields.get(entries.BODY, b"")),
        "parent_transaction_id": entries.text(fields.get(entries.PARENT_TRANSACTION_ID)),
    }
    for field, name in DEAD_FIELDS.items():
        row[name] = entries.text(fields.get(field))
    row["check_times"] = int(row["check_times"] or 0)
    return row


MAX_LISTED_CANDIDATES = 10


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def find_dead_transaction(client: Any, transaction_id: str, topic: str | None = None) -> tuple[TopicKeys, str]:
    """The topic and whole id of a dead-lettered transaction named by its id or by a unique prefix of its id (ids are
    long to type). A whole id that is in flight or recently ended is found too, so that a repeated resolution gets the
    first answer. Raises [`TransactionNotFoundError`][redis_txmq.core.errors.TransactionNotFoundError] when nothing, or
    more than one transaction, matches."""
    if topic is not None:
        validate_name(topic, "topic")
    where = f"topic {topic!r}" if topic else "any registered topic"
    if not transaction_id:
        raise TransactionNotFoundError(
            "give a transaction id (or a prefix of one); list them with `txmq dead list`",
            topic=topic or "",
            transaction_id=transaction_id,
        )
    if not transaction_id.isascii():  # ids are hex: this names none (nor reaches Redis: it may not encode)
        raise TransactionNotFoundError(
            f"transaction {transaction_id!r}: transaction ids are hex digits (with '.<index>' for a message of a "
            "transaction of several); list them with `txmq dead list`",
            topic=topic or "",
            transaction_id=transaction_id,
        )
    candidates = registered_topics(client, topic)

    def queue(pipe: Any, keys: TopicKeys) -> int:
        pipe.hexists(keys.dead_index, transaction_id)
        pipe.hexists(keys.ended, transaction_id)
        pipe.hexists(keys.inflight, transaction_id)
        return 3

    found = list(zip(candidates, pipeline_all(client, candidates, queue), strict=True))
    for keys, (dead, _, _) in found:
        if dead:
            return keys, transaction_id
    for keys, (_, ended, in_flight) in found:  # already resolved: the script answers a repeat with the first result
        if ended or in_flight:
            return keys, transaction_id
    matches = _dead_members(client, candidates, _glob_escape(transaction_id) + "*")
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise TransactionNotFoundError(
            f"transaction {transaction_id}: no dead-lettered transaction in {where} has this id or starts with it; "
            "list them with `txmq dead list`",
            topic=topic or "",
            transaction_id=transaction_id,
        )
    listed = ", ".join(f"{txid} ({keys.topic_stream})" for keys, txid in matches[:MAX_LISTED_CANDIDATES])
    more = f" and {len(matches) - MAX_LISTED_CANDIDATES} more" if len(matches) > MAX_LISTED_CANDIDATES else ""
    raise TransactionNotFoundError(
        f"transaction prefix {transaction_id!r} matches {len(matches)} dead-lettered transactions in {where}: "
        f"{listed}{more}; give more of the id",
        topic=topic or "",
        transaction_id=transaction_id,
    )


@dataclass(frozen=True)
class DeadResolution:
    """One dead-lettered message resolved: its topic partition, its id and what ``lua/dead_resolve.lua`` answered."""

    keys: TopicKeys
    transaction_id: str
    result: EndResult


def _dead_letter_fields(client: Any, keys: TopicKeys, transaction_id: str) -> dict[str, bytes]:
    """The fields of a dead letter ({} when the transaction is no longer dead-lettered)."""
    dead_id = client.hget(keys.dead_index, transaction_id)
    found = client.xrange(keys.dead_stream, dead_id, dead_id) if dead_id else []
    return entries.field_map(found[0][1]) if found else {}


def dead_messages_of(client: Any, parent_transaction_id: str) -> list[tuple[TopicKeys, str]]:
    """Every dead-lettered message of the transaction of several messages ``parent_transaction_id`` (message ``i``
    is ``<parent>.<i>``), in any registered topic."""
    return _dead_members(client, registered_topics(client), _glob_escape(parent_transaction_id) + ".*")


def _dead_members(client: Any, streams: list[TopicKeys], pattern: str) -> list[tuple[TopicKeys, str]]:
    """The members of the streams' dead-letter indexes matching ``pattern``: ``HSCAN`` of every stream pipelined
    (``pipeline_each``), then again of those whose scan is not finished, until none is: a round trip per round, not
    per topic stream (thousands of them)."""
    found: list[tuple[TopicKeys, str]] = []
    scans: list[tuple[TopicKeys, int]] = [(keys, 0) for keys in streams]

    def queue(pipe: Any, scan: tuple[TopicKeys, int]) -> int:
        pipe.hscan(scan[0].dead_index, scan[1], match=pattern, count=1000)
        return 1

    while scans:
        going_on = []
        for (keys, _), replies in zip(scans, pipeline_each(client, scans, queue), strict=True):
            cursor, members = checked(replies)[0]
            found += [(keys, entries.text(member) or "") for member in members]
            if int(cursor):
                going_on.append((keys, int(cursor)))
        scans = going_on
    return found


@dataclass(frozen=True)
class DeadTarget:
    """What resolving one dead letter touches, read before it runs: its whole id on its partition, its dead letter's
    fields ({} when it was resolved before: a repeat changes nothing), the transaction of several it belongs to ('' for
    none) and every message a resolution resolves, this one first (the transaction's other dead-lettered messages
    follow it)."""

    keys: TopicKeys
    transaction_id: str
    fields: dict[str, bytes]
    parent: str
    parts: tuple[tuple[TopicKeys, str], ...]

    @property
    def dead(self) -> bool:
        return bool(self.fields)

    @property
    def topic(self) -> str:
        return self.keys.topic

    def ids(self) -> str:
        """Every message it touches, for a confirmation or an audit record."""
        return ", ".join(f"{txid} on {keys.topic_stream}" for keys, txid in self.parts)


def dead_target(client: Any, keys: TopicKeys, transaction_id: str) -> DeadTarget:
    """The ``DeadTarget`` of the whole id ``transaction_id`` on ``keys`` (``find_dead_transaction`` finds them)."""
    fields = _dead_letter_fields(client, keys, transaction_id)
    parent = entries.text(fields.get(entries.PARENT_TRANSACTION_ID)) or ""
    if not fields and "." in transaction_id:  # resolved before: its record says what a repeat may do
        parent = transaction_id.rpartition(".")[0]
    parts = [(keys, transaction_id)]
    if parent:
        parts += [found for found in dead_messages_of(client, parent) if found != (keys, transaction_id)]
    return DeadTarget(keys, transaction_id, fields, parent, tuple(parts))


def resolve_dead_transaction(
    broker: RedisBroker, transaction_id: str, action: DeadAction, topic: str | None = None, remark: str = ""
) -> tuple[str, list[DeadResolution]]:
    """Commit, roll back or re-check a dead-lettered transaction, named by its id or a unique prefix of it, finding
    its topic when not given (``find_dead_transaction``, then ``resolve_dead_target``). Returns the id of the
    transaction of several messages it belongs to ('' for one message) and what was resolved."""
    keys, whole_id = find_dead_transaction(broker.client, transaction_id, topic)
    target = dead_target(broker.client, keys, whole_id)
    return target.parent, resolve_dead_target(broker, target, action, remark)


def resolve_dead_target(
    broker: RedisBroker, target: DeadTarget, action: DeadAction, remark: str = ""
) -> list[DeadResolution]:
    """Commit, roll back or re-check the dead letter ``target`` (``dead_target``): what ``txmq dead`` and the
    console's actions run.

    A message of a transaction of several is never resolved alone: COMMIT or ROLLBACK first writes that transaction's
    decision in its record (``lua/decide_transaction.lua``; the first decision stands,
    [`TransactionConflictError`][redis_txmq.core.errors.TransactionConflictError] when it is the other one; the record
    outlives every dead letter of the transaction), then resolves every dead-lettered message of the transaction by the
    record (a message whose send did not return is rolled back whatever the decision); its messages still in flight are
    ended by the checker. RECHECK puts them all back in flight. Running it again after a crash finishes the job: the
    decision is written once and each resolution is idempotent."""
    resolution = move(State.DEAD_LETTERED, RESOLVES_TO[action])  # the table of states says where the action leads
    keys, whole_id, parent = target.keys, target.transaction_id, target.parent
    logger.info("transaction %s: %s", whole_id, resolution.by)
    if not parent:
        return [DeadResolution(keys, whole_id, broker.resolve_dead(keys, whole_id, action, remark))]
    group = entries.text(target.fields.get(entries.PRODUCER_GROUP)) or ""
    named = list(target.parts)
    if action is DeadAction.RECHECK:
        resolved = [DeadResolution(k, txid, broker.resolve_dead(k, txid, action, remark)) for k, txid in named]
        _unpin(broker, parent, group, [txid for _, txid in named])
        return resolved
    asked = LocalTransactionState(action.value)
    if group:
        record = broker.decide(parent, group, asked, EndSource.OPERATOR)
    else:
        record = broker.decisions([parent])[parent]
    decided = record.outcome or asked
    if decided is not asked:
        raise TransactionConflictError(
            f"transaction {whole_id} on {keys.topic_stream} belongs to transaction {parent} of several messages, "
            f"which was decided {decided.value}; its messages follow that decision: run "
            f"`txmq dead {decided.value.lower()} {whole_id}`",
            topic=keys.topic,
            transaction_id=whole_id,
        )
    resolved = []
    for k, txid in named:
        outcome = record.outcome_of(txid) or decided
        resolved.append(DeadResolution(k, txid, broker.resolve_dead(k, txid, DeadAction(outcome.value), remark)))
    _unpin(broker, parent, group, [txid for _, txid in named])
    return resolved


def resolve_dead_part(
    broker: RedisBroker, keys: TopicKeys, transaction_id: str, producer_group: str, outcome: LocalTransactionState
) -> EndResult:
    """Resolve the dead letter of message ``transaction_id`` of a transaction of several messages with the outcome
    its record gives, then release the record's hold for it."""
    remark = "resolved by its transaction's record"
    result = broker.resolve_dead(keys, transaction_id, DeadAction(outcome.value), remark)
    _unpin(broker, transaction_id.rpartition(".")[0], producer_group, [transaction_id], every_stale=False)
    return result


def _unpin(
    broker: RedisBroker, parent: str, producer_group: str, transaction_ids: list[str], every_stale: bool = True
) -> None:
    """These messages of ``parent`` are no longer dead-lettered: the record lets go of them and, with
    ``every_stale`` (an operator's command, which walks the topics anyway), of any other it still holds that is no
    longer dead-lettered either (a run interrupted before it let go). Its record may expire once none is held."""
    if not producer_group:  # resolved before (the dead letter is gone): the record names its group
        producer_group = broker.decisions([parent])[parent].producer_group
    if not producer_group:
        return
    indices = {i for i in (message_index(parent, txid) for txid in transaction_ids) if i is not None}
    if every_stale:
        held = broker.decide(parent, producer_group, RecordAction.READ, EndSource.OPERATOR).dead
        still_dead = {message_index(parent, txid) for _, txid in dead_messages_of(broker.client, parent)}
        indices = (indices | set(held)) - still_dead
    if indices:
        broker.decide(parent, producer_group, RecordAction.UNPIN, EndSource.OPERATOR, indices)


def resolve_dead(
    broker: RedisBroker, transaction_id: str, action: DeadAction, topic: str | None = None, remark: str = ""
) -> tuple[TopicKeys, EndResult]:
    """``resolve_dead_transaction``, answering for the named message only."""
    _, resolved = resolve_dead_transaction(broker, transaction_id, action, topic, remark)
    return resolved[0].keys, resolved[0].result


def forget_producer_group(client: Any, producer_group: str) -> bool:
    """Remove a finished producer group from the registry, with its keys, so that ``txmq status`` stops listing it
    (for short-lived groups such as ``txmq demo``'s, one per run). Touches nothing and returns False while an instance
    is registered or a check request waits."""
    gkeys = GroupKeys(producer_group)
    if client.zcard(gkeys.producers) or client.xlen(gkeys.check_requests):
        return False
    client.delete(gkeys.check_requests)
    client.delete(gkeys.producers)
    client.srem(GROUP_REGISTRY, producer_group)
    return True
