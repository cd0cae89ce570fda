"""The ``redis-txmq`` PySpark data source: committed topic streams, batch and Structured Streaming.

Reads are plain XRANGE over ``(start, end]`` of each topic stream: deterministic and replayable, so a query
restarted from its checkpoint neither skips nor repeats an entry. No consumer group is used: its position would
be shared mutable state outside Spark's checkpoint. Only topic streams are read (never half, op or dead-letter
streams). Redis clients are made inside ``read()`` on the executors; the driver only reads stream metadata.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from redis_txmq.core import entries
from redis_txmq.core.errors import CorruptEntryError
from redis_txmq.core.keys import TOPIC_REGISTRY, topic_meta_key
from redis_txmq.core.scripts import script_source
from redis_txmq.core.topics import partition_keys

from .offsets import EARLIEST, LATEST, START_ID, earlier, ms_upper_bound, parse_entry_id
from .options import ConnectorOptions, SparkSourceError, parse_options

logger = logging.getLogger(__name__)

SCHEMA = (
    "topic string, partition int, id string, timestamp timestamp, transaction_id string, keys string, "
    "tags string, body binary, properties map<string,string>"
)
SPLIT_ENTRIES = 250_000
"""A batch read splits a topic partition into entry-id ranges of about this many entries, so all cores work. Each
range is a Spark task, and a task costs tens of milliseconds before its first entry: 500,000 entries on two cores
read faster as 2 ranges than as 5 or 20. ``minPartitions`` asks for more where there are more cores."""
STREAM_SPLIT_ENTRIES = 25_000
"""A micro-batch is split into ranges of about this many entries: smaller than a batch read's, since what counts
there is the micro-batch's latency (a 50,000-entry micro-batch on two cores is two tasks)."""
MAX_SPLITS = 64
ADVANCE_PAGE = 1_000
"""Entries walked by one ``stream_advance`` call (the script refuses more): about 2 ms of Redis time, during which
nobody else is served. A budget of 50,000 entries is 50 calls instead of one 0.15-0.3 s call."""
PROBE_ENTRIES = 50
"""Entries one planning probe asks for at each end of a segment: fewer mean the segment's count is exact."""
PROBE_CALLS = 96
"""Segments probed per planned partition at most (two calls each): half of them even over the range first, then
halves of the most uncertain ones. A few thousand entries, 10-50 ms on the driver."""


@dataclass(frozen=True)
class TopicPartition:
    topic: str
    partition: int
    stream: str


class StreamRange(InputPartition):
    """Entries of one topic partition in ``(start, end]``; ``first`` marks the range that checks for data loss.

    Everything lives in ``value``: Spark may hand ``read()`` a plain InputPartition rebuilt from it."""

    def __init__(self, part: TopicPartition, start: str, end: str, first: bool) -> None:
        super().__init__((part.topic, part.partition, part.stream, start, end, first))

    @property
    def part(self) -> TopicPartition:
        return TopicPartition(*self.value[:3])

    @staticmethod
    def of(partition: InputPartition) -> StreamRange | None:
        """None for the empty partition Spark reads when ``partitions`` planned nothing."""
        if partition is None or partition.value is None:
            return None
        topic, number, stream, start, end, first = partition.value
        return StreamRange(TopicPartition(topic, number, stream), start, end, first)

    start = property(lambda self: self.value[3])
    end = property(lambda self: self.value[4])
    first = property(lambda self: self.value[5])


class RedisTxmqDataSource(DataSource):
    """``spark.read.format("redis-txmq")`` / ``spark.readStream.format("redis-txmq")``, and the same for writing
    (``redis_txmq.spark.writer``)."""

    @classmethod
    def name(cls) -> str:
        return "redis-txmq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(parse_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .writer import BatchWriter, parse_write_options

        return BatchWriter(parse_write_options(self.options, schema, streaming=False, overwrite=overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .writer import StreamWriter, parse_write_options

        return StreamWriter(parse_write_options(self.options, schema, streaming=True, overwrite=overwrite))


def topic_partitions(client: Any, options: ConnectorOptions) -> list[TopicPartition]:
    """Every partition of every topic, also those without a stream yet (read as empty).

    A topic is known when one of its streams exists, it was created (``create_topic``) or it is registered (a
    producer sent to it, or it was created): then it is read, possibly empty. Otherwise it is an error naming it."""
    parts: list[TopicPartition] = []
    for topic in options.topics:
        partitions = partition_keys(client, topic)
        streams = [keys.topic_stream for keys in partitions]
        if not any(client.exists(stream) for stream in streams) and not _topic_known(client, topic, streams):
            raise SparkSourceError(
                f"topic {topic!r} not found at {options.safe_url}: no stream {streams[0]!r}, and the topic was "
                "neither created (txmq topic create) nor sent to; check the name and the redis.url / redis.cluster "
                "options"
            )
        parts.extend(TopicPartition(topic, keys.partition, keys.topic_stream) for keys in partitions)
    return parts


def _topic_known(client: Any, topic: str, streams: list[str]) -> bool:
    """Created with a partition count, or registered by ``create_topic`` / a producer: an empty topic."""
    if client.exists(topic_meta_key(topic)):
        return True
    return any(client.smismember(TOPIC_REGISTRY, streams))


def last_id(client: Any, stream: str) -> str:
    """The id of the newest entry ever added (``0-0`` for an empty stream or one not written yet)."""
    info = _stream_info(client, stream)
    return START_ID if info is None else entries.text(info["last-generated-id"]) or START_ID


def _stream_info(client: Any, stream: str) -> dict[str, Any] | None:
    """``XINFO STREAM``, or None when the stream does not exist."""
    try:
        return client.xinfo_stream(stream)
    except redis.ResponseError as exc:
        if "no such key" in str(exc).lower():
            return None
        raise


def _given(offsets: Any, part: TopicPartition) -> str | None:
    if isinstance(offsets, dict):
        value = offsets.get(part.topic, {}).get(str(part.partition))
        return None if value is None else str(value)
    return str(offsets)


ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("id", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("transaction_id", pa.string()),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("body", pa.binary()),
        ("properties", pa.map_(pa.string(), pa.string())),
    ]
)


FIELD_COLUMNS = (
    (entries.TRANSACTION_ID.encode(), "transaction_id"),
    (entries.KEYS.encode(), "keys"),
    (entries.TAGS.encode(), "tags"),
    (entries.BODY.encode(), "body"),
    (entries.PROPERTIES.encode(), "properties"),
)
"""The entry fields read into columns, by their name as it comes back from Redis."""
PROPERTIES_TYPE = ARROW_SCHEMA.field("properties").type


def _xrange_pages(client: Any, stream: str, start: str, end: str, count: int) -> Generator[list[Any], None, None]:
    """The XRANGE pages of ``(start, end]``, as hiredis parses them: ``[id, [name, value, ...]]`` lists, without
    redis-py's dict per entry. The next page is asked for as soon as a page arrives, so that Redis builds it while
    this one is converted. A cluster client routes each call itself (and hands out dicts)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        while True:
            page = client.xrange(stream, f"({start}", end, count=count)
            yield page
            if len(page) < count:
                return
            start = entries.text(page[-1][0]) or start
    connection = pool.get_connection()
    finished = False
    try:
        connection.send_command("XRANGE", stream, f"({start}", end, "COUNT", count)
        while not finished:
            page = connection.read_response()
            finished = len(page) < count
            if not finished:
                connection.send_command("XRANGE", stream, b"(" + page[-1][0], end, "COUNT", count)
            yield page
    finally:
        if not finished:  # a reply may still be on its way: the connection cannot be reused
            connection.disconnect()
        pool.release(connection)


def _record_batch(part: TopicPartition, page: list[Any]) -> pa.RecordBatch:
    """One Arrow batch per XRANGE reply, built a column at a time from slices of the reply: no Python bytecode runs
    per entry (it made the read slower than a plain XRANGE loop), except to flatten a cluster client's dicts."""
    ids, fields = zip(*page, strict=True)
    if isinstance(fields[0], dict):
        fields = tuple(list(chain.from_iterable(pairs.items())) for pairs in fields)
    count = len(ids)
    id_column = pa.array(ids, pa.string())
    values = _same_layout_values(fields, count) or _any_layout_values(fields, count)
    ms = pc.list_element(pc.split_pattern(id_column, "-", max_splits=1), 0).cast(pa.int64())
    columns = [
        pa.repeat(pa.scalar(part.topic, pa.string()), count),
        pa.repeat(pa.scalar(part.partition, pa.int32()), count),
        id_column,
        pc.multiply(ms, 1000).cast(pa.timestamp("us", tz="UTC")),
        _text(values["transaction_id"]),
        _text(values["keys"]),
        _text(values["tags"]),
        values["body"],
        _properties(values["properties"], id_column),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _same_layout_values(fields: Sequence[list[bytes]], count: int) -> dict[str, pa.Array] | None:
    """The columns when every entry has the same field names in the same order, as the entries one script commits
    do: each is a strided slice of the flattened reply. None when the layouts differ."""
    layout = fields[0][0::2]
    width = len(layout)
    if set(map(len, fields)) != {2 * width}:
        return None
    flat = list(chain.from_iterable(fields))
    if flat[0::2] != layout * count:
        return None
    values = flat[1::2]
    columns = {}
    for name, column in FIELD_COLUMNS:
        if name in layout:
            position = width - 1 - layout[::-1].index(name)  # a repeated field's last value, as in _field
            columns[column] = pa.array(values[position::width], pa.binary())
        else:
            columns[column] = pa.nulls(count, pa.binary())
    return columns


def _any_layout_values(fields: Sequence[list[bytes]], count: int) -> dict[str, pa.Array]:
    """The columns of entries with differing fields: all fields go into one Arrow list array, and each wanted field
    is taken from it where its name is (null for an entry without it)."""
    pairs = pa.array(fields, pa.list_(pa.binary()))
    flat = pairs.values
    names = flat.take(pa.array(np.arange(0, len(flat), 2))).dictionary_encode()
    code_of = {name: code for code, name in enumerate(names.dictionary.to_pylist())}
    codes = names.indices.to_numpy()
    row_of_pair = np.repeat(np.arange(count), np.diff(pairs.offsets.to_numpy()) // 2)
    return {column: _field(flat, codes, row_of_pair, code_of.get(name), count) for name, column in FIELD_COLUMNS}


def _field(flat: pa.Array, codes: Any, row_of_pair: Any, code: int | None, count: int) -> pa.Array:
    """The value of one field for every entry (null where it lacks it; the last one when an entry repeats it)."""
    if code is None:
        return pa.nulls(count, pa.binary())
    pair = np.flatnonzero(codes == code)
    rows = row_of_pair[pair]
    last = np.ones(len(pair), dtype=bool)
    last[:-1] = rows[1:] != rows[:-1]
    pair, rows = pair[last], rows[last]
    if len(pair) == count:
        return flat.take(pa.array(2 * pair + 1))
    where = np.full(count, -1, dtype=np.int64)
    where[rows] = 2 * pair + 1
    return flat.take(pa.array(where, mask=where < 0))


def _text(column: pa.Array) -> pa.Array:
    """UTF-8 as is; a column with invalid bytes is decoded value by value, replacing them (as ``entries.text``)."""
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([entries.text(value) for value in column.to_pylist()], pa.string())


def _properties(raw: pa.Array, ids: pa.Array) -> pa.Array:
    """Each distinct properties value of the page decoded once, all of them together: producers repeat a few (a
    source, a schema version) far more often than they send unique ones. Entries without properties get an empty
    map."""
    distinct = raw.dictionary_encode()
    decoded = _decoded_at_once(distinct.dictionary)
    if decoded is None:
        decoded = []
        for position, value in enumerate(distinct.dictionary.to_pylist()):
            try:
                decoded.append(entries.decode_properties(value, ""))
            except CorruptEntryError:
                entries.decode_properties(value, ids[pc.index(distinct.indices, position).as_py()].as_py())
                raise
    offsets = np.zeros(len(decoded) + 2, dtype=np.int32)  # and an empty map last, for entries without properties
    np.cumsum(np.fromiter(map(len, decoded), dtype=np.int32, count=len(decoded)), out=offsets[1:-1])
    offsets[-1] = offsets[-2]
    maps = pa.MapArray.from_arrays(
        pa.array(offsets),
        pa.array([key for pairs in decoded for key in pairs], pa.string()),
        pa.array([value for pairs in decoded for value in pairs.values()], pa.string()),
        type=PROPERTIES_TYPE,
    )
    return maps.take(distinct.indices.fill_null(len(decoded)))


def _decoded_at_once(values: pa.Array) -> list[dict[str, str]] | None:
    """The values as dicts, checked together (a third less time than one by one when most are distinct); None when
    one is not UTF-8, not JSON or not an object of strings: decoded one by one then, to name its entry."""
    try:
        decoded = [json.loads(text) if text else {} for text in values.cast(pa.string()).to_pylist()]
    except (pa.ArrowInvalid, ValueError):
        return None
    if all(type(pairs) is dict for pairs in decoded) and all(
        type(value) is str for pairs in decoded for value in pairs.values()
    ):
        return decoded
    return None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a page is read and converted. A reply is thousands of fresh lists
    (two per entry), each allocation counts towards a collection, and the collections that follow traverse the page
    again and again: that took more time than the conversion itself. The page holds no cycles and is freed by
    reference counting before the collector is back on."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def read_range(options: ConnectorOptions, partition: StreamRange | None) -> Iterator[pa.RecordBatch]:
    """The entries of ``(start, end]`` as Arrow batches, one per XRANGE page; runs on an executor, with its own
    client."""
    if partition is None:
        return
    client = options.client()
    try:
        part = partition.part
        if partition.first and partition.start != START_ID:
            _check_data_loss(client, options, part, partition.start, partition.end)
        pages = _xrange_pages(client, part.stream, partition.start, partition.end, options.read_batch_size)
        with closing(pages):
            while True:
                with _collector_paused():
                    page = next(pages, None)
                    if page is None:
                        return
                    batch = _record_batch(part, page) if page else None
                    del page
                if batch is not None:
                    yield batch
    finally:
        client.close()


def _check_data_loss(client: Any, options: ConnectorOptions, part: TopicPartition, start: str, end: str) -> None:
    """Fail (or warn, per ``failOnDataLoss``) when entries after ``start`` were removed before this read.

    XDEL is exact: Redis keeps the largest deleted id (``max-deleted-entry-id``), so any entry deleted after
    ``start`` is seen, even one past ``end`` (the read would lose it next). Trimming only removes the oldest
    entries, so it is seen when the stream lost entries and no longer holds ``start`` itself while its first entry
    is later, or it is empty while its last id is later: the entries between may be gone (Kafka's "offset out of
    range"; a reader whose own position was removed after it read it is reported too). A stream deleted since the
    range was planned lost the whole range."""
    info = _stream_info(client, part.stream)
    position = parse_entry_id(start)
    if info is None:
        lost_to: str | None = end
    else:
        deleted = entries.text(info.get("max-deleted-entry-id")) or START_ID
        lost_to = deleted if parse_entry_id(deleted) > position else None
        removed = int(info.get("entries-added", 0)) > int(info.get("length", 0))
        first = info.get("first-entry")
        oldest = entries.text(first[0]) if first else entries.text(info.get("last-generated-id")) or START_ID
        if lost_to is None and removed and parse_entry_id(oldest) > position:
            if not first or not client.xrange(part.stream, start, start):
                lost_to = oldest
    if lost_to is None:
        return
    message = (
        f"topic {part.topic!r} partition {part.partition}: entries after {start} were trimmed or deleted "
        f"before they were read (up to {lost_to})"
    )
    if options.fail_on_data_loss:
        raise SparkSourceError(message + "; set failOnDataLoss=false to go on with what is left")
    logger.warning("%s; going on (failOnDataLoss=false)", message)


@dataclass
class _Segment:
    """The entries of the milliseconds ``low..high`` of a range: ``ids`` are the first of them and ``tail`` the
    last (at most ``PROBE_ENTRIES`` each); ``count`` is exact when they meet, else estimated."""

    low: int
    high: int
    ids: list[str]
    tail: list[str]
    count: float

    @property
    def exact(self) -> bool:
        return len(self.ids) == self.count


def _span_density(ids: list[str]) -> float:
    """Entries per millisecond of a run of consecutive entries. A millisecond whose last entry seen has sequence
    number ``n`` held ``n + 1`` entries at least (XADD numbers them from 0 in each millisecond): a run of a few
    entries inside one busy millisecond shows its density so."""
    held: dict[int, int] = {}
    for entry_id in ids:
        ms, seq = parse_entry_id(entry_id)
        held[ms] = max(held.get(ms, 0), seq + 1)
    spread = parse_entry_id(ids[-1])[0] - parse_entry_id(ids[0])[0] + 1
    return max(len(ids), sum(held.values())) / spread


def _probe(client: Any, stream: str, start: str, end: str, spans: list[tuple[int, int]]) -> list[_Segment]:
    """The first and the last ``PROBE_ENTRIES`` entries of each span (XRANGE and XREVRANGE with COUNT,
    pipelined: one round trip, a fraction of a millisecond of Redis time each). When they overlap the count is
    exact; else the entries between are estimated from the two ends' densities over the milliseconds between
    them (the larger of the two: a segment overestimated is probed again in halves). The range's own bounds
    replace the first and last millisecond's."""
    first_ms, last_ms = parse_entry_id(start)[0], parse_entry_id(end)[0]
    pipe = client.pipeline(transaction=False)
    for low, high in spans:
        lower = f"({start}" if low == first_ms else f"{low}-0"
        upper = end if high == last_ms else ms_upper_bound(high)
        pipe.xrange(stream, lower, upper, count=PROBE_ENTRIES)
        pipe.xrevrange(stream, upper, lower, count=PROBE_ENTRIES)
    replies = pipe.execute()
    segments = []
    for (low, high), head, tail in zip(spans, replies[0::2], replies[1::2], strict=True):
        ids = [entries.text(entry[0]) or "" for entry in head]
        last = [entries.text(entry[0]) or "" for entry in reversed(tail)]
        if len(ids) < PROBE_ENTRIES or parse_entry_id(last[0]) <= parse_entry_id(ids[-1]):
            union = sorted(set(ids) | set(last), key=parse_entry_id)
            segments.append(_Segment(low, high, union, union, len(union)))
            continue
        between = parse_entry_id(last[0])[0] - parse_entry_id(ids[-1])[0] - 1
        middle = max(_span_density(ids), _span_density(last)) * max(between, 0)
        segments.append(_Segment(low, high, ids, last, 2 * PROBE_ENTRIES + middle))
    return segments


COARSE_PROBES = 4
"""Segments a range of unknown size is probed in first, to skip the full probing when it is one range's worth (a
segment counts its denser end; a burst between two quiet ends is missed, and is read as one range)."""


def _halves(segment: _Segment) -> list[tuple[int, int]]:
    middle = (segment.low + segment.high) // 2
    return [(segment.low, middle), (middle + 1, segment.high)]


def _estimate(
    client: Any, stream: str, start: str, end: str, low: int, spans: int, calls: int = PROBE_CALLS
) -> list[_Segment]:
    """The range's entries per millisecond segment: ``spans`` even segments, then the densest segments whose count
    is only estimated are halved and probed again, round by round, up to ``PROBE_CALLS`` probes. A burst after a quiet
    hour is found (the quiet segments come back exact, the burst's are halved), which an id-time density from the first
    id, the last id and the length alone would spread over the hour. ``calls`` bounds the segments probed."""
    high = parse_entry_id(end)[0]
    spans = max(1, min(spans, high - low + 1, calls))
    bounds = [low + (high - low + 1) * i // spans for i in range(spans + 1)]
    segments = _probe(client, stream, start, end, [(bounds[i], bounds[i + 1] - 1) for i in range(spans)])
    used = len(segments)
    while used + 2 <= calls:
        unsure = [s for s in segments if not s.exact and s.high > s.low]
        capped = sorted(unsure, key=lambda s: s.count - len(s.ids) - len(s.tail), reverse=True)
        capped = capped[: (calls - used) // 2]
        if not capped:
            break
        halves = _probe(client, stream, start, end, [span for s in capped for span in _halves(s)])
        used += len(halves)
        replaced = {id(s) for s in capped}
        segments = sorted([s for s in segments if id(s) not in replaced] + halves, key=lambda s: s.low)
    return segments


def _cut(segment: _Segment, offset: float) -> str:
    """The inclusive end id that leaves about ``offset`` of the segment's entries before it: an entry's own id
    where a probe saw it, else a millisecond's last id interpolated between the head and the tail seen."""
    if offset <= len(segment.ids):
        return segment.ids[max(0, int(-(-offset // 1)) - 1)]
    from_end = segment.count - offset
    if from_end < len(segment.tail):
        return segment.tail[max(0, len(segment.tail) - 1 - int(from_end))]
    seen, until = parse_entry_id(segment.ids[-1])[0], parse_entry_id(segment.tail[0])[0]
    rest = (offset - len(segment.ids)) / max(segment.count - len(segment.ids) - len(segment.tail), 1)
    return ms_upper_bound(min(until, seen + int(rest * (until - seen))))


def pieces_for(entry_count: float, min_pieces: int, split_entries: int) -> int:
    return max(1, min_pieces, min(MAX_SPLITS, -(-int(entry_count) // split_entries)))


def plan_ranges(
    client: Any,
    part: TopicPartition,
    start: str,
    end: str,
    min_pieces: int = 1,
    split_entries: int = SPLIT_ENTRIES,
    entry_count: int | None = None,
) -> list[StreamRange]:
    """``(start, end]`` cut into ranges of about the same number of entries: about ``entry_count / split_entries``
    of them, at least ``min_pieces`` when there are that many entries.

    Redis cannot count the entries between two ids without walking them, so the cuts come from a few probes
    (``_estimate``), starting at the stream's first entry: a range from ``0-0`` is not cut across the empty decades
    before it. A range that one piece covers (by the stream's length, or by ``entry_count`` when the caller counted it)
    costs no probe; cuts are entry ids or millisecond boundaries, so the ranges touch and no entry is read twice or
    skipped, whatever the estimate's error."""
    whole = StreamRange(part, start, end, first=True)
    info = _stream_info(client, part.stream)
    if info is None or not info.get("first-entry"):
        return [whole]
    first_id = entries.text(info["first-entry"][0]) or START_ID
    known = entry_count
    if (
        known is None
        and parse_entry_id(start) < parse_entry_id(first_id)
        and parse_entry_id(end) >= parse_entry_id(entries.text(info["last-entry"][0]) or START_ID)
    ):
        known = int(info["length"])
    upper = known if known is not None else int(info["length"])
    most = min(pieces_for(upper, min_pieces, split_entries), upper)
    if most <= 1:
        return [whole]
    low = max(parse_entry_id(start)[0], parse_entry_id(first_id)[0])
    if low > parse_entry_id(end)[0]:
        return [whole]
    if known is None:  # a glance first: a micro-batch of a long stream is most often small
        glance = sum(s.count for s in _estimate(client, part.stream, start, end, low, COARSE_PROBES, COARSE_PROBES))
        if pieces_for(glance, min_pieces, split_entries) <= 1:
            return [whole]
    segments = _estimate(client, part.stream, start, end, low, PROBE_CALLS // 2)
    total = sum(s.count for s in segments)
    pieces = min(pieces_for(known if known is not None else total, min_pieces, split_entries), int(total))
    bounds = [start]
    done, queue = 0.0, iter(segments)
    segment = next(queue)
    for i in range(1, pieces):
        target = total * i / pieces
        while done + segment.count < target or not segment.ids:
            done += segment.count
            segment = next(queue)
        cut = _cut(segment, target - done)
        if parse_entry_id(bounds[-1]) < parse_entry_id(cut) < parse_entry_id(end):
            bounds.append(cut)
    bounds.append(end)
    return [StreamRange(part, bounds[i], bounds[i + 1], first=i == 0) for i in range(len(bounds) - 1)]


class BatchReader(DataSourceReader):
    """Plans ranges on the driver from stream metadata; executors read them."""

    def __init__(self, options: ConnectorOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        client = self.options.client()
        try:
            ranges: list[InputPartition] = []
            parts = topic_partitions(client, self.options)
            min_pieces = -(-self.options.min_partitions // len(parts))
            for part in parts:
                newest = last_id(client, part.stream)
                start = _given(self.options.starting_offsets, part) or EARLIEST
                start = START_ID if start == EARLIEST else newest if start == LATEST else start
                end = _given(self.options.ending_offsets, part) or LATEST
                end = newest if end == LATEST else earlier(end, newest)
                if parse_entry_id(start) < parse_entry_id(end):
                    ranges.extend(plan_ranges(client, part, start, end, min_pieces))
            return ranges
        finally:
            client.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, StreamRange.of(partition))


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are the last entry id read per topic partition. ``startingOffsets=latest`` is resolved by the first
    micro-batch's end offset, which Spark writes to its offset log before running it: a query that dies before
    its first batch commits restarts from that same position instead of a later "latest"."""

    def __init__(self, options: ConnectorOptions) -> None:
        self.options = options
        self._client: Any = None
        self._target: dict[str, dict[str, str]] | None = None
        self._advance: Any = None
        self._counted: dict[tuple[str, str, str, str], int] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled to the executors for read(): without the driver's connection."""
        return {**self.__dict__, "_client": None, "_advance": None, "_counted": {}}

    def _redis(self) -> Any:
        if self._client is None:
            self._client = self.options.client()
            self._advance = self._client.register_script(script_source("stream_advance"))
        return self._client

    def _stream_of(self, topic: str, partition: str) -> str:
        """The stream key of a topic partition named in an offset."""
        for keys in partition_keys(self._redis(), topic):
            if str(keys.partition) == partition:
                return keys.topic_stream
        raise SparkSourceError(f"topic {topic!r} has no partition {partition} any more; was it re-created?")

    def initialOffset(self) -> dict:
        offsets: dict[str, dict[str, str]] = {}
        for part in topic_partitions(self._redis(), self.options):
            given = _given(self.options.starting_offsets, part) or EARLIEST
            offsets.setdefault(part.topic, {})[str(part.partition)] = START_ID if given == EARLIEST else given
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_entries_per_trigger:
            return ReadMaxRows(self.options.max_entries_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        client = self._redis()
        self._target = {}
        for part in topic_partitions(client, self.options):
            self._target.setdefault(part.topic, {})[str(part.partition)] = last_id(client, part.stream)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        client = self._redis()
        self._counted = {}
        heads: dict[tuple[str, str], tuple[str, str]] = {}
        end: dict[str, dict[str, str]] = {}
        for part in topic_partitions(client, self.options):
            key = (part.topic, str(part.partition))
            begin = start.get(part.topic, {}).get(key[1], START_ID)
            newest = last_id(client, part.stream)
            if self._target is not None:
                newest = self._target.get(part.topic, {}).get(key[1], newest)
            if begin == LATEST:  # the first batch pins "latest" to an entry id
                end.setdefault(part.topic, {})[key[1]] = newest
                continue
            end.setdefault(part.topic, {})[key[1]] = begin
            if parse_entry_id(begin) < parse_entry_id(newest):
                heads[key] = (begin, newest)
        max_rows = getattr(limit, "max_rows", None)
        if isinstance(limit, ReadMaxRows) and max_rows:
            self._advance_within(heads, int(max_rows), end)
        else:
            for (topic, partition), (_, newest) in heads.items():
                end[topic][partition] = newest
        return end

    def _advance_within(
        self, heads: dict[tuple[str, str], tuple[str, str]], budget: int, end: dict[str, dict[str, str]]
    ) -> None:
        """Share ``budget`` entries between the partitions with new data, evenly, then hand out what is left. The
        entries counted are kept for ``partitions``, which then plans without probing."""
        position = {key: begin for key, (begin, _) in heads.items()}
        counted_of = dict.fromkeys(heads, 0)
        pending = dict(heads)
        while budget > 0 and pending:
            share = max(1, budget // len(pending))
            for key, (_, newest) in list(pending.items()):
                asked = min(share, budget)
                if asked <= 0:
                    break
                counted, position[key] = self._advance_by(self._stream_of(*key), position[key], newest, asked)
                budget -= counted
                counted_of[key] += counted
                if counted < asked:  # this partition has nothing more up to its head
                    del pending[key]
        for (topic, partition), reached in position.items():
            end[topic][partition] = reached
            self._counted[(topic, partition, heads[(topic, partition)][0], reached)] = counted_of[(topic, partition)]

    def _advance_by(self, stream: str, begin: str, newest: str, asked: int) -> tuple[int, str]:
        """Up to ``asked`` entries after ``begin``, a page of ``ADVANCE_PAGE`` per script call, so that no call
        holds Redis for long; the pages need not be atomic together (``newest`` bounds them all)."""
        counted, reached = 0, begin
        while counted < asked:
            page = min(ADVANCE_PAGE, asked - counted)
            got, last = self._advance(keys=[stream], args=[reached, newest, page])
            if int(got):
                counted += int(got)
                reached = entries.text(last) or reached
            if int(got) < page:
                break
        return counted, reached

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """Each partition's ``(start, end]`` cut into ranges of about ``STREAM_SPLIT_ENTRIES`` entries, so that
        a large micro-batch uses every core (the entries counted by ``latestOffset``, else probed)."""
        ranges: list[InputPartition] = []
        client = self._redis()
        for topic, partitions in end.items():
            for partition, stop in partitions.items():
                begin = start.get(topic, {}).get(partition, START_ID)
                if begin == LATEST or parse_entry_id(begin) >= parse_entry_id(stop):
                    continue
                part = TopicPartition(topic, int(partition), self._stream_of(topic, partition))
                counted = self._counted.get((topic, partition, begin, stop))
                ranges.extend(
                    plan_ranges(client, part, begin, stop, split_entries=STREAM_SPLIT_ENTRIES, entry_count=counted)
                )
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, StreamRange.of(partition))

    def commit(self, end: dict) -> None:
        """Nothing to release: reads never change Redis."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
