"""What the console reads, and nothing it writes: ``txmq status``'s figures (``admin.status`` itself, so the overview
shows the same numbers), and the pages' own reads, each pipelined (``pipeline_each``) and paged.

``admin.status`` reads every registered topic; the console reads it at most once per ``refresh_seconds`` however
many pages are open (``StatusCache``), and the pages that list topics, dead letters or rates take the streams to read
from that snapshot: a topic with nothing in flight is not asked for its half messages, one without dead letters not
for its dead-letter stream."""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core import entries
from ...core.clients import server_ms
from ...core.errors import TxMQError
from ...core.keys import (
    AUDIT_STREAM,
    CHECKER_INSTANCES,
    CHECKER_LEVELS,
    JOB_REGISTRY,
    TOPIC_REGISTRY,
    GroupKeys,
    JobKeys,
    TopicKeys,
    decision_key,
    topic_keys_of_stream,
)
from ...core.message import validate_name
from ...core.topics import partition_keys
from ...transport.connection import checked, pipeline_all, pipeline_each
from .. import admin

logger = logging.getLogger(__name__)


class BadRequest(TxMQError, ValueError):
    """A value the operator gave (an id, a filter, a page size) that the console cannot use: a 400 page says why."""


class NotFound(TxMQError, LookupError):
    """What the operator asked for is not there (a topic, a transaction): a 404 page says so."""


@dataclass(frozen=True)
class ConsoleOptions:
    """How much the console reads, and what it calls worth a person's attention."""

    refresh_seconds: float = 2.0
    """The pages poll every this often; ``admin.status`` is read at most once per period, whoever asks."""
    streams_per_second: float = 500.0
    """At most this many topic streams read per second on average for the status snapshot: with thousands of topic
    streams it is read less often than ``refresh_seconds`` (every 20 s at 10,000), so that a page left open costs
    Redis at most about 1% of a core (a read costs it about 5 µs per stream)."""
    in_flight_bound_seconds: float = 60.0
    """A transaction in flight longer than this is listed on the overview."""
    unknown_checks: int = 3
    """A transaction in flight checked this many times or more (its producer keeps answering UNKNOWN) is listed."""
    lag_bound: int = 1000
    """A consumer group with more undelivered entries than this is behind."""
    pending_idle_bound_seconds: float = 60.0
    """A consumer group whose oldest pending entry is idle longer than this is stuck."""
    rates_window_seconds: int = 600
    """How far back the rate charts go."""
    rates_bucket_seconds: int = 10
    """The width of one point of a rate chart."""
    attention_limit: int = 20
    """At most this many transactions listed in each "needs a person" list."""
    scan_entries: int = 200
    """A search by message key reads the latest this many entries of each stream it looks in."""
    scan_streams: int = 200
    """A search by message key without a topic looks in at most this many topic streams."""
    aside_from_streams: int = 1000
    """From this many registered topic streams on, the status snapshot a page must wait for (the first, or the first
    after an action) is read beside the requests: a console starts reading it when it starts."""
    page_wait_seconds: float = 0.1
    """How long a page waits for such a read before it says the figures are being read (and fills in by itself)."""


DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_PAGE = 1_000_000
"""The highest page number asked of any list: far beyond any list the console pages, and a number Redis takes."""
MAX_FILTER_LENGTH = 200
SHOWN_INPUT = 40
"""At most this many characters of a value the operator gave are repeated in an error (a page must not echo
whatever a link put in its query string)."""
TRANSACTION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
ENTRY_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")
SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")
MAX_ENTRY_PART = 2**64 - 1
FIRST_ENTRY_ID = "0-0"
LAST_ENTRY_ID = f"{MAX_ENTRY_PART}-{MAX_ENTRY_PART}"
PARTS_PER_PAGE = 200
"""The messages of a transaction of several looked up at once: ``<id>.0`` to ``<id>.199`` on its first page, and so
on up to ``max_transaction_messages`` (1,000 by default: five pages)."""
AUDIT_FIELDS = (
    "operator",
    "action",
    "transaction_id",
    "topic",
    "phase",
    "intent",
    "ids",
    "ok",
    "outcome",
    "applied",
    "result",
)
"""The fields of an audit record (``app``'s ``_audit_intent`` and ``_audit_outcome``); older records lack some."""
TOPIC_SORTS = ("topic", "partitions", "committed", "in_flight", "oldest_in_flight_age_seconds", "dead_letters")


def shown_input(value: str | None) -> str:
    """A value the operator gave, as an error repeats it: quoted, at most ``SHOWN_INPUT`` characters of it."""
    value = value or ""
    return repr(value[:SHOWN_INPUT]) + ("…" if len(value) > SHOWN_INPUT else "")


def whole_number_arg(value: str | None, name: str, low: int, high: int, default: int) -> int:
    """A whole number from ``low`` to ``high`` given in ASCII digits ('' or None: ``default``), or ``BadRequest``:
    ``int()`` alone takes '1_0', ' 5' and other scripts' digits, and numbers no Redis command takes."""
    if value in (None, ""):
        return default
    if not WHOLE_NUMBER.fullmatch(value) or not low <= int(value) <= high:
        raise BadRequest(f"{name} must be a whole number between {low} and {high}, got {shown_input(value)}")
    return int(value)


def page_args(page: str | None, size: str | None) -> tuple[int, int]:
    """A page number (1..``MAX_PAGE``) and a page size (1..``MAX_PAGE_SIZE``) from a query string, or
    ``BadRequest``."""
    number = whole_number_arg(page, "page", 1, MAX_PAGE, 1)
    count = whole_number_arg(size, "size", 1, MAX_PAGE_SIZE, DEFAULT_PAGE_SIZE)
    return number, count


def seconds_arg(value: str | None, name: str) -> float | None:
    """A number of seconds (ASCII digits, an optional decimal part, below 10⁹) or None when not given."""
    if value in (None, ""):
        return None
    if not SECONDS.fullmatch(value):
        raise BadRequest(f"{name} must be a number of seconds (0 or more, like 90 or 2.5), got {shown_input(value)}")
    return float(value)


def filter_arg(value: str | None, name: str) -> str:
    """A free-text filter, bounded: '' when not given."""
    value = (value or "").strip()
    if len(value) > MAX_FILTER_LENGTH:
        raise BadRequest(f"{name} is longer than {MAX_FILTER_LENGTH} characters")
    return value


def topic_arg(value: str | None, name: str = "topic") -> str:
    """A topic name as the library accepts it ('' when not given), or ``BadRequest`` saying why not."""
    value = filter_arg(value, name)
    if value:
        try:
            validate_name(value, name)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    return value


def transaction_id_arg(value: str | None) -> str:
    """A transaction id as typed (blanks around it dropped), or ``BadRequest``."""
    value = (value or "").strip()
    if not TRANSACTION_ID.fullmatch(value):
        raise BadRequest(
            f"{shown_input(value)} is not a transaction id: ids are letters, digits and . _ : - (at most 200), "
            "with '.<index>' for a message of a transaction of several"
        )
    return value


def entry_id_arg(value: str | None, name: str) -> str:
    """A stream entry id used as a paging cursor ('' when not given): ``<ms>-<seq>``, both ASCII digits within
    0..2⁶⁴-1 (what Redis takes), written without leading zeros."""
    value = (value or "").strip()
    if not value:
        return ""
    match = ENTRY_ID.fullmatch(value)
    if not match or any(int(part) > MAX_ENTRY_PART for part in match.groups()):
        raise BadRequest(f"{name} must be a stream entry id like 1700000000000-0, got {shown_input(value)}")
    return f"{int(match.group(1))}-{int(match.group(2))}"


def partition_arg(value: str | None) -> int | None:
    """A partition number (ASCII digits) or None when not given; the topic's own count is checked where it is
    known (``ConsoleQueries.topic``)."""
    if value in (None, ""):
        return None
    if not WHOLE_NUMBER.fullmatch(value):
        raise BadRequest(f"partition must be a whole number (0, 1, ...), got {shown_input(value)}")
    return int(value)


def _paged(rows: list[Any], page: int, size: int) -> dict[str, Any]:
    pages = max(1, math.ceil(len(rows) / size))
    return {
        "total": len(rows),
        "page": page,
        "pages": pages,
        "size": size,
        "rows": rows[(page - 1) * size : page * size],
    }


def _preview(body: bytes | None, length: int = 120) -> str:
    text = (body or b"")[: length * 4].decode("utf-8", "replace")
    return text if len(text) <= length else text[:length] + "…"


class StatusPending(TxMQError):
    """The status snapshot is being read and the page waited ``ConsoleOptions.page_wait_seconds`` for it: the first
    read of a console at thousands of topic streams, or the read after an action there. The page says so and
    reloads itself once the read is done; the JSON endpoints wait for it (``StatusCache.wait_read``)."""

    def __init__(self, streams: int) -> None:
        super().__init__(
            f"reading the figures of {streams:,} topic streams (the first read since the console started, or the "
            "first since an action); the page fills in by itself when they are read"
        )
        self.streams = streams


class StatusCache:
    """``admin.status``, read at most once per period for every page and poll: ``refresh_seconds``, or one second
    per ``streams_per_second`` topic streams when longer (``period``).

    While a read is quick it is made in the request that finds the snapshot too old (one lock: concurrent polls wait
    for the one read in progress rather than each reading). Once one took longer than ``SLOW_READ_SECONDS``
    (thousands of topics), the next is made in a thread of its own and pages are served the last snapshot meanwhile
    (its time is on the page): no page waits for a read of every topic. At ``aside_from_streams`` registered topic
    streams or more, a read that a page must wait for (none yet, or the first after an action) is made in that
    thread too, and the page waits for it at most ``page_wait_seconds``, then gets ``StatusPending``. A background
    read that fails is raised to the next caller, and the snapshot is dropped: the pages show the error, then read
    anew. ``after_read(report, server ms)`` runs in the read, before its snapshot is served: what follows each read
    (the rates' sample) is then never made in a page's request."""

    SLOW_READ_SECONDS = 0.1

    def __init__(
        self,
        client: Any,
        live_seconds: float,
        refresh_seconds: float,
        streams_per_second: float = math.inf,
        *,
        aside_from_streams: int = 1000,
        page_wait_seconds: float = math.inf,
        after_read: Callable[[dict[str, Any], int], None] | None = None,
    ) -> None:
        self.client = client
        self.after_read = after_read
        self.live_seconds = live_seconds
        self.refresh_seconds = refresh_seconds
        self.streams_per_second = streams_per_second
        self.aside_from_streams = aside_from_streams
        self.page_wait_seconds = page_wait_seconds
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._read_at = -math.inf
        self._report: dict[str, Any] | None = None
        self._now_ms = 0
        self._took = 0.0
        self._reading: threading.Thread | None = None
        self._failed: Exception | None = None
        self._wait_next = False
        self._started = -math.inf
        self._fresh_from = -math.inf
        self._registered: int | None = None

    def period(self) -> float:
        """Seconds between two reads now."""
        streams = len(self._report["topics"]) if self._report is not None else 0
        return max(self.refresh_seconds, streams / self.streams_per_second)

    def get(self) -> tuple[dict[str, Any], int]:
        """The status report and the server time (ms) it was read at; ``StatusPending`` when a page would wait
        longer than ``page_wait_seconds`` for it."""
        with self._lock:
            self._raise_failed()
            if self._report is not None and time.monotonic() - self._read_at < self.period():
                return self._report, self._now_ms
            if self._report is not None and self._took >= self.SLOW_READ_SECONDS and not self._wait_next:
                self._read_in_thread()
                return self._report, self._now_ms
            if self._streams() < self.aside_from_streams:
                self._store(*self._read())
                return self._report, self._now_ms  # type: ignore[return-value]  # just stored
            return self._wait(self.page_wait_seconds)

    def start(self) -> None:
        """Begins the first read beside the requests when it will be a long one (a console starting up), so that
        the first page finds it done or under way."""
        with self._lock:
            if self._report is None and self._streams() >= self.aside_from_streams:
                self._read_in_thread()

    def wait_read(self) -> None:
        """Waits for the read a page got ``StatusPending`` for (a JSON endpoint waits rather than say so); a read
        that fails is left for ``get`` to raise."""
        with self._lock:
            while self._failed is None and (self._report is None or self._wait_next):
                self._read_in_thread()
                self._changed.wait()

    def _wait(self, seconds: float) -> tuple[dict[str, Any], int]:
        """Under the lock: the snapshot once a read newer than the last action has stored it."""
        deadline = time.monotonic() + seconds
        while True:
            self._raise_failed()
            if self._report is not None and not self._wait_next:
                return self._report, self._now_ms
            self._read_in_thread()
            left = deadline - time.monotonic()
            if left <= 0:
                raise StatusPending(self._streams())
            self._changed.wait(None if left == math.inf else left)

    def _raise_failed(self) -> None:
        if self._failed is not None:
            failed, self._failed, self._report = self._failed, None, None
            raise failed

    def _streams(self) -> int:
        """Topic streams to read: the last snapshot's, or the registry's count before the first read."""
        if self._report is not None:
            return len(self._report["topics"])
        if self._registered is None:
            self._registered = int(self.client.scard(TOPIC_REGISTRY))
        return self._registered

    def _read_in_thread(self) -> None:
        if self._reading is None:
            self._reading = threading.Thread(target=self._read_aside, name="txmq-console-status", daemon=True)
            self._reading.start()

    def _read(self) -> tuple[dict[str, Any], int, float, float]:
        started = time.monotonic()
        now_ms = server_ms(self.client)
        report = admin.status(self.client, live_seconds=self.live_seconds)
        if self.after_read is not None:
            try:
                self.after_read(report, now_ms)
            except Exception:  # noqa: BLE001 - what follows a read (the rates) never keeps its figures from the pages
                logger.exception("console: what follows the status read failed; the figures are shown without it")
        return report, now_ms, time.monotonic() - started, started

    def _store(self, report: dict[str, Any], now_ms: int, took: float, started: float) -> None:
        self._report, self._now_ms, self._took, self._started = report, now_ms, took, started
        self._read_at, self._wait_next = time.monotonic(), False

    def _newest(self, started: float) -> bool:
        """A read that started then is newer than the snapshot and than the last action."""
        return started > self._started and started >= self._fresh_from

    def _read_aside(self) -> None:
        started = time.monotonic()
        try:
            read = self._read()
        except Exception as exc:  # noqa: BLE001 - whatever it is, the next page raises it (its error handlers)
            with self._lock:
                self._reading = None
                if self._newest(started):
                    self._failed = exc
                self._changed.notify_all()
            return
        with self._lock:
            self._reading = None
            if self._newest(started):
                self._store(*read)
            self._changed.notify_all()

    def invalidate(self) -> None:
        """After an action: the next page reads anew, and waits for it, to show what the action changed."""
        with self._lock:
            self._read_at, self._wait_next, self._fresh_from = -math.inf, True, time.monotonic()


class RateSampler:
    """Committed, rolled back, dead-lettered and check-back rates over the last ``rates_window_seconds``, in buckets.

    Commits and rollbacks are counted from the op records (``txmq:{S}:op``: one per ended transaction, its id the
    server time it ended), dead letters from the dead-letter streams' ids, each stream read from where the last sample
    stopped (the first sample goes back one window: the charts are full from the first view). Check-backs are the
    growth of each producer group's check-request stream's ``entries-added`` between samples. Sampled with each read of
    the status snapshot (``StatusCache.after_read``), at most once per half bucket."""

    SERIES = ("committed", "rolled_back", "check_backs", "dead_lettered")
    READ_LIMIT = 10_000

    def __init__(self, client: Any, window_seconds: int, bucket_seconds: int) -> None:
        self.client = client
        self.bucket_ms = bucket_seconds * 1000
        self.buckets = max(1, window_seconds // bucket_seconds)
        self.counts: dict[int, dict[str, int]] = {}
        self.after: dict[str, str] = {}
        self.added: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sampled_ms = 0
        self._recent: deque[int] = deque()

    def _count(self, bucket: int, series: str, n: int = 1) -> None:
        counts = self.counts.setdefault(bucket, dict.fromkeys(self.SERIES, 0))
        counts[series] += n

    def sample(self, streams: list[TopicKeys], groups: list[str], now_ms: int) -> None:
        with self._lock:
            if now_ms - self._sampled_ms < self.bucket_ms / 2:
                return
            self._sampled_ms = now_ms
            start = f"{now_ms - self.buckets * self.bucket_ms}-0"
            reads = [
                (key, kind) for keys in streams for key, kind in ((keys.op_stream, "op"), (keys.dead_stream, "dead"))
            ]

            def queue(pipe: Any, read: tuple[str, str]) -> int:
                key = read[0]
                after = self.after.get(key)
                pipe.xrange(key, min=f"({after}" if after else start, max="+", count=self.READ_LIMIT)
                return 1

            for (key, kind), replies in zip(reads, pipeline_each(self.client, reads, queue), strict=True):
                if isinstance(replies, Exception) or isinstance(replies[0], Exception):
                    continue
                found = replies[0]
                if not found:
                    self.after.setdefault(key, f"{now_ms}-0")
                    continue
                self.after[key] = entries.text(found[-1][0]) or ""
                for entry_id, raw in found:
                    bucket = entries.entry_ms(entry_id) // self.bucket_ms
                    if kind == "dead":
                        self._count(bucket, "dead_lettered")
                        continue
                    outcome = entries.text(entries.field_map(raw).get("outcome"))
                    self._count(bucket, "committed" if outcome == "COMMIT" else "rolled_back")
            check_streams = [GroupKeys(group).check_requests for group in groups]

            def queue_info(pipe: Any, key: str) -> int:
                pipe.xinfo_stream(key)
                return 1

            for key, replies in zip(check_streams, pipeline_each(self.client, check_streams, queue_info), strict=True):
                if isinstance(replies, Exception) or isinstance(replies[0], Exception):
                    continue  # no such stream yet: nothing was checked
                added = int(replies[0].get("entries-added") or 0)
                if key in self.added and added > self.added[key]:
                    self._count(now_ms // self.bucket_ms, "check_backs", added - self.added[key])
                self.added[key] = added
            oldest = now_ms // self.bucket_ms - self.buckets
            for bucket in [b for b in self.counts if b < oldest]:
                del self.counts[bucket]

    def series(self, now_ms: int) -> dict[str, Any]:
        """Per series, the rate (per second) of each complete bucket of the window, oldest first, and how many in the
        window (``counts``, the bucket under way included)."""
        with self._lock:
            last = now_ms // self.bucket_ms - 1
            first = last - self.buckets + 1
            seconds = self.bucket_ms / 1000
            rows = {
                name: [round(self.counts.get(b, {}).get(name, 0) / seconds, 3) for b in range(first, last + 1)]
                for name in self.SERIES
            }
            window = range(first, last + 2)
            in_window = {name: sum(self.counts.get(b, {}).get(name, 0) for b in window) for name in rows}
        return {
            "counts": in_window,
            "bucket_seconds": self.bucket_ms // 1000,
            "window_seconds": self.buckets * self.bucket_ms // 1000,
            "first_bucket_ms": first * self.bucket_ms,
            "series": rows,
        }


def sparkline(values: list[float], width: int = 240, height: int = 40) -> dict[str, Any]:
    """The points of an SVG polyline drawing ``values`` (highest at the top), and the highest value."""
    top = max(values, default=0) or 1
    step = width / max(1, len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - (v / top) * (height - 2) - 1:.1f}" for i, v in enumerate(values))
    return {"points": points, "max": max(values, default=0), "last": values[-1] if values else 0}


class ConsoleQueries:
    """The reads of every page, on one client (the console's read-only user)."""

    REMEMBERED = 1000
    """Transactions whose stream is remembered (``_locate``), the most recently looked up."""

    def __init__(
        self, client: Any, live_seconds: float, options: ConsoleOptions, max_transaction_messages: int = 1000
    ) -> None:
        self.client = client
        self.options = options
        self.max_transaction_messages = max_transaction_messages
        self.live_seconds = live_seconds
        self.cache = StatusCache(
            client,
            live_seconds,
            options.refresh_seconds,
            options.streams_per_second,
            aside_from_streams=options.aside_from_streams,
            page_wait_seconds=options.page_wait_seconds,
            after_read=self._sample_rates,
        )
        self.rates = RateSampler(client, options.rates_window_seconds, options.rates_bucket_seconds)
        self._found_in: OrderedDict[str, list[TopicKeys]] = OrderedDict()
        self._found_lock = threading.Lock()

    # overview ---------------------------------------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """``admin.status``'s report unchanged, with what the overview adds beside it: totals, the producer groups'
        layout versions, the checker instances, what needs a person now and the rates."""
        report, now_ms = self.cache.get()
        groups = [g["producer_group"] for g in report["producer_groups"]]
        live_from = now_ms - int(self.live_seconds * 1000)
        layouts, instances = self._instances(groups, live_from, now_ms)
        result = dict(report)
        result["read_at_ms"] = now_ms
        result["totals"] = {
            "topics": len({t["topic"] for t in report["topics"]}),
            "streams": len(report["topics"]),
            "committed": sum(t["committed"] for t in report["topics"]),
            "in_flight": sum(t["in_flight"] for t in report["topics"]),
            "dead_letters": sum(t["dead_letters"] for t in report["topics"]),
        }
        result["layout_versions"] = layouts
        result["checker_instances"] = instances
        result["attention"] = self._attention(report, now_ms)
        result["rates"] = self.rates.series(now_ms)
        return result

    def _sample_rates(self, report: dict[str, Any], now_ms: int) -> None:
        """The rates' sample of each status read (``StatusCache.after_read``), made in the read."""
        streams = [topic_keys_of_stream(t["stream"]) for t in report["topics"]]
        self.rates.sample(streams, [g["producer_group"] for g in report["producer_groups"]], now_ms)

    def _instances(
        self, groups: list[str], live_from: int, now_ms: int
    ) -> tuple[dict[str, dict[str, int]], list[dict[str, Any]]]:
        """Per producer group, how many live instances write each key layout version ("none": release 0.1.0); the
        checker instances with the age of their last beat and their durability level."""

        def queue(pipe: Any, group: str) -> int:
            keys = GroupKeys(group)
            pipe.zrangebyscore(keys.producers, live_from, "+inf")
            pipe.hgetall(keys.layouts)
            return 2

        layouts: dict[str, dict[str, int]] = {}
        for group, (live, versions) in zip(groups, pipeline_all(self.client, groups, queue), strict=True):
            recorded = {entries.text(k): entries.text(v) for k, v in versions.items()}
            counts: dict[str, int] = {}
            for member in live:
                version = recorded.get(entries.text(member)) or "none"
                counts[version] = counts.get(version, 0) + 1
            layouts[group] = dict(sorted(counts.items()))
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(CHECKER_INSTANCES, 0, 99, desc=True, withscores=True)  # the latest beats
        pipe.hgetall(CHECKER_LEVELS)
        beats, levels = pipe.execute()
        level_of = {entries.text(k): entries.text(v) for k, v in levels.items()}
        instances = [
            {
                "instance": entries.text(member),
                "last_beat_age_seconds": max(0.0, (now_ms - score) / 1000),
                "live": score >= live_from,
                "durability": level_of.get(entries.text(member)) or "master",
            }
            for member, score in beats
        ]
        return layouts, instances

    def _attention(self, report: dict[str, Any], now_ms: int) -> dict[str, Any]:
        options = self.options
        bound_ms = int(options.in_flight_bound_seconds * 1000)
        old = sorted(
            (
                t
                for t in report["topics"]
                if (t["oldest_in_flight_age_seconds"] or 0) >= options.in_flight_bound_seconds
            ),
            key=lambda t: -(t["oldest_in_flight_age_seconds"] or 0),
        )[: options.attention_limit]
        past_bound: list[dict[str, Any]] = []

        def queue_old(pipe: Any, row: dict[str, Any]) -> int:
            keys = topic_keys_of_stream(row["stream"])
            pipe.xrange(keys.half_stream, min="-", max=f"{now_ms - bound_ms}-0", count=options.attention_limit)
            return 1

        for row, (halves,) in zip(old, pipeline_all(self.client, old, queue_old), strict=True):
            for half_id, raw in halves:
                fields = entries.field_map(raw)
                past_bound.append(
                    {
                        "topic": row["topic"],
                        "stream": row["stream"],
                        "transaction_id": entries.text(fields.get(entries.TRANSACTION_ID)),
                        "producer_group": entries.text(fields.get(entries.PRODUCER_GROUP)),
                        "age_seconds": max(0.0, (now_ms - entries.entry_ms(half_id)) / 1000),
                    }
                )
        past_bound.sort(key=lambda r: -r["age_seconds"])
        in_flight = sorted((t for t in report["topics"] if t["in_flight"]), key=lambda t: -t["in_flight"])
        in_flight = in_flight[: options.scan_streams]

        def queue_checks(pipe: Any, row: dict[str, Any]) -> int:
            pipe.hscan(topic_keys_of_stream(row["stream"]).checks, 0, count=500)
            return 1

        unknown: list[dict[str, Any]] = []
        for row, ((_, checks),) in zip(in_flight, pipeline_all(self.client, in_flight, queue_checks), strict=True):
            for txid, times in checks.items():
                if int(times) >= options.unknown_checks:
                    unknown.append(
                        {"stream": row["stream"], "transaction_id": entries.text(txid), "checks": int(times)}
                    )
        unknown.sort(key=lambda r: -r["checks"])
        unknown = unknown[: options.attention_limit]

        def queue_remark(pipe: Any, row: dict[str, Any]) -> int:
            pipe.hget(topic_keys_of_stream(row["stream"]).remarks, row["transaction_id"])
            return 1

        for row, (remark,) in zip(unknown, pipeline_all(self.client, unknown, queue_remark), strict=True):
            row["remark"] = entries.text(remark)
        behind = [
            g
            for g in report["consumer_groups"]
            if (g["undelivered"] or 0) > options.lag_bound
            or (g["oldest_pending_idle_seconds"] or 0) > options.pending_idle_bound_seconds
        ]
        jobs = report["write_jobs"]
        return {
            "in_flight_bound_seconds": options.in_flight_bound_seconds,
            "in_flight_past_bound": past_bound[: options.attention_limit],
            "unknown_checks": options.unknown_checks,
            "keep_answering_unknown": unknown,
            "dead_letters": sum(t["dead_letters"] for t in report["topics"]),
            "consumer_groups_behind": behind,
            "write_jobs_parked": jobs.get("parked", 0),
            "write_jobs_parked_reasons": jobs.get("parked_reasons", []),
        }

    # topics -----------------------------------------------------------------------------------------------------

    def topics(self, q: str, sort: str, order: str, page: int, size: int) -> dict[str, Any]:
        """The topics of the status snapshot (partitions added up), filtered by a substring of the name, sorted and
        paged: no read of Redis beyond the snapshot."""
        if sort not in TOPIC_SORTS:
            raise BadRequest(f"sort must be one of {', '.join(TOPIC_SORTS)}, got {sort[:40]!r}")
        if order not in ("asc", "desc"):
            raise BadRequest(f"order must be asc or desc, got {order[:40]!r}")
        report, _ = self.cache.get()
        rows = [row for row in topic_rows(report) if q.lower() in row["topic"].lower()]

        def key(row: dict[str, Any]) -> Any:
            value = row[sort]
            return (value is None, value if value is not None else 0) if sort != "topic" else value

        rows.sort(key=lambda r: r["topic"])
        rows.sort(key=key, reverse=order == "desc")
        if order == "desc" and sort != "topic":  # unknown (None) ages last either way
            rows.sort(key=lambda r: r[sort] is None)
        result = _paged(rows, page, size)
        result.update({"q": q, "sort": sort, "order": order})
        return result

    def topic(self, topic: str, partition: int | None, before: str, after: str, size: int) -> dict[str, Any]:
        """One topic: its partitions' figures, its consumer groups, the latest committed messages of one partition
        (``before`` an entry id: the next page) and its in-flight half messages (``after`` an id). Read from the
        topic's own streams, not the status snapshot: fresh on every poll, and never waiting for a read of every
        topic."""
        now_ms = server_ms(self.client)
        every = partition_keys(self.client, topic)
        registered = self.client.smismember(TOPIC_REGISTRY, [k.topic_stream for k in every])
        streams = [keys for keys, known in zip(every, registered, strict=True) if int(known)]
        if not streams:  # its partition count lost (the case of topics.restore_partitions_call): the registry knows
            streams = sorted(admin.registered_topics(self.client, topic), key=lambda keys: keys.partition)
        if not streams:
            raise NotFound(f"no registered topic {topic!r}; the topics page lists them")
        partitions = [
            dict(checked(figures), partition=keys.partition)
            for keys, figures in zip(streams, admin.streams_figures(self.client, streams, now_ms), strict=True)
        ]
        chosen = streams[0]
        if partition is not None:
            found = [k for k in streams if k.partition == partition]
            if not found:
                numbers = sorted(k.partition for k in streams)
                raise BadRequest(
                    f"topic {topic!r} has {len(streams)} partition(s), numbered {numbers[0]} to {numbers[-1]}: "
                    f"no partition {partition}"
                )
            chosen = found[0]
        groups = admin.consumer_lag(self.client, streams)
        # nothing is older than the first entry id nor newer than the last: Redis refuses those intervals
        older, newer = before != FIRST_ENTRY_ID, after != LAST_ENTRY_ID
        pipe = self.client.pipeline(transaction=False)
        if older:
            pipe.xrevrange(chosen.topic_stream, max=f"({before}" if before else "+", min="-", count=size)
        if newer:
            pipe.xrange(chosen.half_stream, min=f"({after}" if after else "-", max="+", count=size)
        replies = iter(pipe.execute())
        committed = next(replies) if older else []
        halves = next(replies) if newer else []
        messages = []
        for entry_id, raw in committed:
            fields = entries.field_map(raw)
            messages.append(
                {
                    "entry_id": entries.text(entry_id),
                    "transaction_id": entries.text(fields.get(entries.TRANSACTION_ID)),
                    "keys": entries.text(fields.get(entries.KEYS)),
                    "tags": entries.text(fields.get(entries.TAGS)),
                    "body_bytes": len(fields.get(entries.BODY) or b""),
                    "body_preview": _preview(fields.get(entries.BODY)),
                    "age_seconds": max(0.0, (now_ms - entries.entry_ms(entry_id)) / 1000),
                }
            )
        in_flight = [_half_row(half_id, entries.field_map(raw), now_ms) for half_id, raw in halves]
        return {
            "topic": topic,
            "partitions": partitions,
            "partition": chosen.partition,
            "stream": chosen.topic_stream,
            "consumer_groups": groups,
            "committed_messages": {
                "rows": messages,
                "size": size,
                "before": before,
                "next_before": messages[-1]["entry_id"] if len(messages) == size else None,
            },
            "in_flight_messages": {
                "rows": in_flight,
                "size": size,
                "after": after,
                "next_after": in_flight[-1]["half_id"] if len(in_flight) == size else None,
            },
        }

    # transactions -----------------------------------------------------------------------------------------------

    def transaction(self, transaction_id: str, parts_page: int | None = None) -> dict[str, Any]:
        """Where a transaction is, by its id: in flight, ended (committed with its entry id, or rolled back: within
        the dedupe window), dead-lettered, or found among the latest committed entries; for a transaction of several
        messages (its own id, or one of its messages' ``<id>.<i>``), its decision and its messages found.

        Its messages are ``<id>.0`` up to ``max_transaction_messages`` (the library's bound), looked up
        ``PARTS_PER_PAGE`` at a time (``parts_page``; by default the page holding the message asked for): ``parts``
        says which were looked up and whether that is all a transaction may hold."""
        report, now_ms = self.cache.get()
        streams = [topic_keys_of_stream(t["stream"]) for t in report["topics"]]
        head, dot, tail = transaction_id.rpartition(".")
        index = int(tail) if dot and WHOLE_NUMBER.fullmatch(tail) else None
        parent = head if index is not None else transaction_id
        record = {entries.text(k): entries.text(v) for k, v in self.client.hgetall(decision_key(parent)).items()}
        several = bool(record) or index is not None
        parts = None
        if several:
            most = self.max_transaction_messages
            pages = max(1, math.ceil(most / PARTS_PER_PAGE))
            asked_page = min(pages, index // PARTS_PER_PAGE + 1) if index is not None else 1
            page = asked_page if parts_page is None else parts_page
            if not 1 <= page <= pages:
                raise BadRequest(f"parts must be a page from 1 to {pages}, got {page}")
            first, last = (page - 1) * PARTS_PER_PAGE, min(most, page * PARTS_PER_PAGE) - 1
            ids = [f"{parent}.{i}" for i in range(first, last + 1)]
            if index is not None and page == asked_page and transaction_id not in ids:
                ids.append(transaction_id)  # past the bound, or written with leading zeros: asked for, so looked up
            parts = {
                "page": page,
                "pages": pages,
                "first": first,
                "last": last,
                "per_page": PARTS_PER_PAGE,
                "max_transaction_messages": most,
                "complete": pages == 1,
            }
            found = self._find(streams, ids, now_ms)
        else:
            ids = [transaction_id]
            found = self._locate(transaction_id, report, now_ms)
        if not found:
            found = self._scan(report, now_ms, lambda fields: entries.text(fields.get(entries.TRANSACTION_ID)) in ids)
        if not found and not record:
            raise NotFound(
                f"transaction {transaction_id}: not in flight, not dead-lettered, not ended within the dedupe window "
                "and not among the latest committed messages"
            )
        decision = None
        if record:
            decision = {
                "transaction_id": parent,
                "outcome": record.get("outcome") or None,
                "producer_group": record.get("producer_group"),
                "source": record.get("source"),
                "decided_ms": _number(record.get("decided_ms")),
                "voided": (record.get("voided") or "").split(),
                "dead": (record.get("dead") or "").split(),
            }
        return {
            "query": {"transaction_id": transaction_id},
            "transaction_id": parent if several else transaction_id,
            "several": several,
            "decision": decision,
            "parts": parts,
            "messages": found,
        }

    def _locate(self, transaction_id: str, report: dict[str, Any], now_ms: int) -> list[dict[str, Any]]:
        """A transaction of one message, by its id: first in the stream it was found in last (a page left open asks
        every 2 s), then where the snapshot shows it could be, then everywhere (the snapshot may be older than the
        transaction). At thousands of topics that is one HMGET or two per stream instead of three, and a page left
        open on a transaction asks one stream."""
        with self._found_lock:
            hinted = self._found_in.get(transaction_id)
        found = self._find(hinted, [transaction_id], now_ms) if hinted else []
        if not found:
            streams = [topic_keys_of_stream(t["stream"]) for t in report["topics"]]
            figures = {t["stream"]: t for t in report["topics"]}
            found = self._find(streams, [transaction_id], now_ms, figures) or self._find(
                streams, [transaction_id], now_ms
            )
        with self._found_lock:
            if found:
                self._found_in[transaction_id] = list(dict.fromkeys(topic_keys_of_stream(r["stream"]) for r in found))
                self._found_in.move_to_end(transaction_id)
                while len(self._found_in) > self.REMEMBERED:
                    self._found_in.popitem(last=False)
            else:
                self._found_in.pop(transaction_id, None)
        return found

    def _find(
        self, streams: list[TopicKeys], ids: list[str], now_ms: int, figures: dict[str, dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Each of ``ids`` in flight, ended or dead-lettered in any of ``streams``: up to three HMGETs per stream
        (with ``figures``, the snapshot's rows by stream, only where it shows transactions in flight or dead letters
        are those asked for), then the details of what was found."""
        nothing = [None] * len(ids)
        plan = [
            (
                keys,
                figures is None or bool(figures.get(keys.topic_stream, {}).get("in_flight", 1)),
                figures is None or bool(figures.get(keys.topic_stream, {}).get("dead_letters", 1)),
            )
            for keys in streams
        ]

        def queue(pipe: Any, step: tuple[TopicKeys, bool, bool]) -> int:
            keys, in_flight, dead = step
            pipe.hmget(keys.ended, ids)
            if in_flight:
                pipe.hmget(keys.inflight, ids)
            if dead:
                pipe.hmget(keys.dead_index, ids)
            return 1 + in_flight + dead

        hits: list[tuple[TopicKeys, str, str, str]] = []  # stream, id, where, value
        for (keys, in_flight, dead_asked), replies in zip(plan, pipeline_all(self.client, plan, queue), strict=True):
            ended = replies[0]
            inflight = replies[1] if in_flight else nothing
            dead = replies[1 + in_flight] if dead_asked else nothing
            for txid, half, end, dead_id in zip(ids, inflight, ended, dead, strict=True):
                if half is not None:
                    hits.append((keys, txid, "inflight", entries.text(half) or ""))
                if dead_id is not None:
                    hits.append((keys, txid, "dead", entries.text(dead_id) or ""))
                if end is not None:
                    hits.append((keys, txid, "ended", entries.text(end) or ""))

        def queue_detail(pipe: Any, hit: tuple[TopicKeys, str, str, str]) -> int:
            keys, txid, where, value = hit
            pipe.hget(keys.checks, txid)
            pipe.hget(keys.remarks, txid)
            entry, stream = _detail_entry(keys, where, value)
            if not entry:
                return 2
            pipe.xrange(stream, entry, entry)
            return 3

        rows = []
        for (keys, txid, where, value), (checks, remark, *found) in zip(
            hits, pipeline_all(self.client, hits, queue_detail), strict=True
        ):
            fields = entries.field_map(found[0][0][1]) if found and found[0] else {}
            row: dict[str, Any] = {
                "transaction_id": txid,
                "topic": keys.topic,
                "stream": keys.topic_stream,
                "checks": int(checks or 0),
                "remark": entries.text(remark),
                "producer_group": entries.text(fields.get(entries.PRODUCER_GROUP)),
                "keys": entries.text(fields.get(entries.KEYS)),
                "born_ms": int(entries.text(fields.get(entries.BORN_MS)) or 0) or None,
                "entry_id": None,
                "half_id": None,
                "reason": None,
            }
            if where == "inflight":
                row.update(state="IN_FLIGHT", half_id=value)
                row["age_seconds"] = max(0.0, (now_ms - entries.entry_ms(value)) / 1000)
            elif where == "dead":
                row.update(state="DEAD_LETTERED", dead_letter_id=value, half_id=entries.text(fields.get("half_id")))
                row["reason"] = entries.text(fields.get("dead_reason"))
                row["checks"] = int(entries.text(fields.get("check_times")) or row["checks"])
                row["remark"] = entries.text(fields.get("remark")) or row["remark"]
            else:
                record = entries.ended_record(value)
                row.update(
                    state=record.state,
                    entry_id=record.committed_id,
                    half_id=record.half_id,
                    producer_group=record.producer_group or row["producer_group"],
                )
            if row["born_ms"] is None and row["half_id"]:
                row["born_ms"] = entries.entry_ms(row["half_id"])
            rows.append(row)
        rows.sort(key=lambda r: (_part_index(r["transaction_id"]), r["stream"]))
        return rows

    def _scan(
        self,
        report: dict[str, Any],
        now_ms: int,
        match: Callable[[dict[str, bytes]], bool],
        topic: str = "",
    ) -> list[dict[str, Any]]:
        """The latest ``scan_entries`` entries of each topic stream, half stream and dead-letter stream of the status
        snapshot ``report`` (of ``topic``, or of at most ``scan_streams`` streams with something in them), the ones
        ``match`` keeps."""
        streams = [topic_keys_of_stream(t["stream"]) for t in report["topics"]]
        figures = {t["stream"]: t for t in report["topics"]}
        chosen = [k for k in streams if not topic or k.topic == topic]
        if not topic:
            chosen = [
                k
                for k in chosen
                if any(figures.get(k.topic_stream, {}).get(n) for n in ("committed", "in_flight", "dead_letters"))
            ][: self.options.scan_streams]
        count = self.options.scan_entries

        def queue(pipe: Any, keys: TopicKeys) -> int:
            pipe.xrevrange(keys.topic_stream, count=count)
            pipe.xrevrange(keys.half_stream, count=count)
            pipe.xrevrange(keys.dead_stream, count=count)
            return 3

        rows = []
        for keys, (committed, halves, dead) in zip(chosen, pipeline_all(self.client, chosen, queue), strict=True):
            for state, found in (("COMMITTED", committed), ("IN_FLIGHT", halves), ("DEAD_LETTERED", dead)):
                for entry_id, raw in found:
                    fields = entries.field_map(raw)
                    if not match(fields):
                        continue
                    txid = entries.text(fields.get(entries.TRANSACTION_ID))
                    born = entries.text(fields.get(entries.BORN_MS))
                    row: dict[str, Any] = {
                        "transaction_id": txid,
                        "topic": keys.topic,
                        "stream": keys.topic_stream,
                        "state": state,
                        "keys": entries.text(fields.get(entries.KEYS)),
                        "producer_group": entries.text(fields.get(entries.PRODUCER_GROUP)),
                        "born_ms": int(born) if born else None,
                        "entry_id": entries.text(entry_id) if state == "COMMITTED" else None,
                        "half_id": entries.text(entry_id)
                        if state == "IN_FLIGHT"
                        else entries.text(fields.get("half_id")),
                        "checks": int(entries.text(fields.get("check_times")) or 0),
                        "remark": entries.text(fields.get("remark")),
                        "reason": entries.text(fields.get("dead_reason")),
                    }
                    if state == "IN_FLIGHT":
                        row["age_seconds"] = max(0.0, (now_ms - entries.entry_ms(entry_id)) / 1000)
                    rows.append(row)
        return rows

    def by_key(self, key: str, topic: str) -> dict[str, Any]:
        """Messages whose keys include ``key``, among the latest entries of the streams (``_scan``); a message found
        committed or dead-lettered is then looked up by id for its checks and remark."""
        report, now_ms = self.cache.get()
        streams = [topic_keys_of_stream(t["stream"]) for t in report["topics"]]
        if topic and not any(k.topic == topic for k in streams):
            raise NotFound(f"no registered topic {topic!r}; the topics page lists them")
        rows = self._scan(
            report, now_ms, lambda fields: key in (entries.text(fields.get(entries.KEYS)) or "").split(), topic
        )
        ids = sorted({r["transaction_id"] for r in rows if r["transaction_id"]})
        if ids:
            where = list(dict.fromkeys(topic_keys_of_stream(r["stream"]) for r in rows))  # only where they were found
            known = {(r["stream"], r["transaction_id"]): r for r in self._find(where, ids, now_ms)}
            for row in rows:
                found = known.get((row["stream"], row["transaction_id"]))
                if found:
                    for name in ("checks", "remark", "producer_group", "born_ms", "half_id"):
                        row[name] = row[name] or found.get(name)
        rows.sort(key=lambda r: (r["transaction_id"] or "", r["state"]))
        searched = len([k for k in streams if not topic or k.topic == topic])
        return {
            "query": {"key": key, "topic": topic},
            "messages": rows,
            "searched": {
                "entries_per_stream": self.options.scan_entries,
                "streams": min(searched, self.options.scan_streams) if not topic else searched,
            },
        }

    # dead letters -----------------------------------------------------------------------------------------------

    def dead_letters(
        self, topic: str, group: str, reason: str, min_age_seconds: float | None, page: int, size: int
    ) -> dict[str, Any]:
        """Dead-lettered transactions (``admin.dead_letters``' rows, read pipelined from the streams the status
        snapshot shows dead letters in), filtered by topic, producer group, a substring of the reason and a least
        age, oldest first, paged."""
        report, now_ms = self.cache.get()
        streams = [
            topic_keys_of_stream(t["stream"])
            for t in report["topics"]
            if t["dead_letters"] and (not topic or t["topic"] == topic)
        ]

        def queue(pipe: Any, keys: TopicKeys) -> int:
            pipe.xrange(keys.dead_stream, count=10_000)
            return 1

        rows = []
        for keys, (found,) in zip(streams, pipeline_all(self.client, streams, queue), strict=True):
            for entry_id, raw in found:
                rows.append(_dead_row(keys, entry_id, raw, now_ms))
        rows = [
            r
            for r in rows
            if (not group or r["producer_group"] == group)
            and (not reason or reason.lower() in (r["reason"] or "").lower())
            and (min_age_seconds is None or (r["age_seconds"] or 0) >= min_age_seconds)
        ]
        rows.sort(key=lambda r: (r["dead_at_ms"] or 0, r["stream"]))
        result = _paged(rows, page, size)
        result["filters"] = {"topic": topic, "group": group, "reason": reason, "min_age_seconds": min_age_seconds}
        return result

    def audit(self, before: str, size: int) -> dict[str, Any]:
        """The audit trail, newest first, ``size`` at a time (``before`` an entry id: the next page)."""
        found = []
        if before != FIRST_ENTRY_ID:  # nothing is older than the first id (Redis refuses the interval)
            found = self.client.xrevrange(AUDIT_STREAM, max=f"({before}" if before else "+", min="-", count=size)
        rows = []
        for entry_id, raw in found:
            fields = {k: entries.text(v) for k, v in entries.field_map(raw).items()}
            row = dict.fromkeys(AUDIT_FIELDS, "")
            row.update(fields)
            row["phase"] = row["phase"] or "outcome"  # records of releases before intents were recorded
            rows.append({"id": entries.text(entry_id), "at_ms": entries.entry_ms(entry_id), **row})
        return {
            "rows": rows,
            "size": size,
            "before": before,
            "next_before": rows[-1]["id"] if len(rows) == size else None,
        }

    # write jobs -------------------------------------------------------------------------------------------------

    def jobs(self, page: int, size: int) -> dict[str, Any]:
        """The write jobs not settled yet (``txmq:jobs``), paged by when the checker looks at each next (parked ones
        last): state, stages, decision, and why a parked one is parked."""
        now_ms = server_ms(self.client)
        total = int(self.client.zcard(JOB_REGISTRY))
        listed = self.client.zrange(JOB_REGISTRY, (page - 1) * size, page * size - 1, withscores=True)
        members = [(entries.text(m) or "", score) for m, score in listed]

        def queue(pipe: Any, member: tuple[str, float]) -> int:
            pipe.hgetall(member[0])
            pipe.scard(f"{member[0]}:stages")
            return 2

        rows = []
        for (decision, score), (record, stages) in zip(members, pipeline_all(self.client, members, queue), strict=True):
            fields = {entries.text(k): entries.text(v) for k, v in record.items()}
            try:
                job = JobKeys.of_decision(decision)
                job_id, sink = job.job_id, job.sink_id or None
            except ValueError:
                job_id, sink = decision, None
            try:
                decided_stages = len(json.loads(fields.get("stages") or "[]"))
            except ValueError:
                decided_stages = None
            lease, started = _number(fields.get("lease_ms")), _number(fields.get("started_ms"))
            if score == math.inf:
                state = "PARKED"
            elif fields.get("outcome"):
                state = "DECIDED"
            elif lease is not None and lease > now_ms:
                state = "LEASED"
            else:
                state = "LEASE_PASSED"
            rows.append(
                {
                    "job": job_id,
                    "sink": sink,
                    "decision_key": decision,
                    "state": state,
                    "outcome": fields.get("outcome"),
                    "stages": int(stages),
                    "decided_stages": decided_stages,
                    "parked": fields.get("parked"),
                    "age_seconds": max(0.0, (now_ms - started) / 1000) if started else None,
                    "next_look_ms": None if score == math.inf else int(score),
                }
            )
        pages = max(1, math.ceil(total / size))
        return {
            "summary": admin.write_jobs(self.client, now_ms),  # its own reads: no wait for a read of every topic
            "total": total,
            "page": page,
            "pages": pages,
            "size": size,
            "rows": rows,
        }


def topic_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The status report's streams added up per topic (a partitioned topic is one row)."""
    rows: dict[str, dict[str, Any]] = {}
    for t in report["topics"]:
        row = rows.setdefault(
            t["topic"],
            {
                "topic": t["topic"],
                "partitions": 0,
                "committed": 0,
                "in_flight": 0,
                "oldest_in_flight_age_seconds": None,
                "dead_letters": 0,
            },
        )
        row["partitions"] += 1
        row["committed"] += t["committed"]
        row["in_flight"] += t["in_flight"]
        row["dead_letters"] += t["dead_letters"]
        age = t["oldest_in_flight_age_seconds"]
        if age is not None:
            previous = row["oldest_in_flight_age_seconds"]
            row["oldest_in_flight_age_seconds"] = age if previous is None else max(previous, age)
    return list(rows.values())


def _number(text: str | None) -> int | None:
    """A whole number a hash field holds, None when it holds none."""
    return int(text) if text and text.isascii() and text.isdigit() else None


def _detail_entry(keys: TopicKeys, where: str, value: str) -> tuple[str, str]:
    """The entry that tells more of a transaction found in ``where``, and its stream ('' when there is none)."""
    if where == "inflight":
        return value, keys.half_stream
    if where == "dead":
        return value, keys.dead_stream
    committed = entries.ended_record(value).committed_id or ""
    return (committed, keys.topic_stream) if ENTRY_ID.match(committed) else ("", "")


def _part_index(transaction_id: str | None) -> int:
    tail = (transaction_id or "").rpartition(".")[2]
    return int(tail) if WHOLE_NUMBER.fullmatch(tail) else -1


def _half_row(half_id: Any, fields: dict[str, bytes], now_ms: int) -> dict[str, Any]:
    born = entries.text(fields.get(entries.BORN_MS))
    return {
        "half_id": entries.text(half_id),
        "transaction_id": entries.text(fields.get(entries.TRANSACTION_ID)),
        "producer_group": entries.text(fields.get(entries.PRODUCER_GROUP)),
        "keys": entries.text(fields.get(entries.KEYS)),
        "parent_transaction_id": entries.text(fields.get(entries.PARENT_TRANSACTION_ID)),
        "born_ms": int(born) if born else None,
        "age_seconds": max(0.0, (now_ms - entries.entry_ms(half_id)) / 1000),
        "body_bytes": len(fields.get(entries.BODY) or b""),
    }


def _dead_row(keys: TopicKeys, entry_id: Any, raw: Any, now_ms: int) -> dict[str, Any]:
    """A dead letter as ``txmq dead list`` shows it (``admin.dead_letter_row``), with its age."""
    row = admin.dead_letter_row(keys, entry_id, raw)
    dead_at = _number(row["dead_at_ms"]) or entries.entry_ms(entry_id)
    row["dead_at_ms"] = dead_at
    row["age_seconds"] = max(0.0, (now_ms - dead_at) / 1000)
    return row


__all__ = [
    "BadRequest",
    "ConsoleOptions",
    "ConsoleQueries",
    "NotFound",
    "entry_id_arg",
    "page_args",
    "partition_arg",
    "seconds_arg",
    "sparkline",
    "topic_arg",
    "transaction_id_arg",
]
