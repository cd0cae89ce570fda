"""``df.write.format("redis-txmq")`` and ``writeStream.format("redis-txmq")``: a job's rows published exactly once.

Each task attempt writes its rows to stages of the job (``redis_txmq.jobs``): streams beside the topic streams,
invisible to consumers, each entry a MessagePack array of up to a hundred rows, written by pipelined XADD from Arrow
batches; while it runs it renews the job's lease, so the checker leaves the job to its driver. The driver's ``commit``
decides once for the stages of the attempts Spark committed and publishes them, checking that every row an attempt
staged was published (else it raises: Spark fails the job); ``abort`` publishes a COMMIT that stands (a commit that
raised after deciding) and otherwise rolls back; stages of failed or speculative attempts are deleted. A streaming
micro-batch is a job keyed by the ``sinkId`` option and the batch id, whose decision also records the sink's last
committed batch: a batch replayed after a restart publishes nothing new (and finishes the publishing of its decision
that stands); an aborted undecided one deletes its stages and keeps its batch id free. Clients are made where they are
used (writers are pickled to executors).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType
from redis.cluster import RedisCluster

from redis_txmq.core.clients import REDIS_ERRORS
from redis_txmq.core.config import DEFAULT_REDIS_URL, Settings
from redis_txmq.core.durability import Durability
from redis_txmq.core.errors import ConfigurationError, JobNotCommittedError, TxMQConnectionError, TxMQError
from redis_txmq.core.keys import JobKeys, topic_meta_key
from redis_txmq.core.message import DEFAULT_MAX_MESSAGE_SIZE, LocalTransactionState, validate_name
from redis_txmq.core.topics import count_of, partition_keys_of
from redis_txmq.jobs.driver import LeaseKeeper, WriteJob
from redis_txmq.jobs.stages import (
    ROWS_PER_STAGE_ENTRY,
    STAGE_ALREADY_WRITTEN,
    STAGE_ENTRY_BYTES,
    STAGE_ROWS_FIELD,
    stage_entry_id,
)
from redis_txmq.sync import wire
from redis_txmq.transport.connection import hiredis_packer

from .options import ConnectorOptions, SparkSourceError
from .options import _bool as bool_option
from .options import _positive_int as positive_int_option

WRITE_OPTIONS = {
    "redis.url": "Redis URL, as for reading",
    "redis.password": "password, kept out of the URL",
    "redis.sentinelpassword": "the Sentinels' password (redis+sentinel:// URLs)",
    "redis.cluster": "true to use redis.cluster.RedisCluster",
    "topic": "the topic of rows without a 'topic' column value",
    "sinkid": "streaming (required): the sink's name; its last committed micro-batch is kept under it",
    "writebatchsize": "rows per pipeline of stage writes, default 1000",
    "durability": "master (default), replica or aof: what confirms stage writes, the decision and the publishing",
    "durability.replicas": "replicas that must have the writes at level replica, default 1",
    "durability.timeout": "seconds to wait for a confirmation, default 1.0",
    "joblease": "seconds a job stays its driver's without a renewal by a running task, default 300",
}
SPARK_OPTIONS = {"path", "checkpointlocation", "queryname"}
"""Options Spark itself passes to a writer (a save path, a streaming query's checkpoint and name)."""
COLUMNS = {"body", "keys", "tags", "properties", "topic"}
SETTLED_WHILE_WRITING = (
    "its stage is gone: the job was settled (committed without this attempt, or aborted) while the attempt wrote"
)
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property Structured Streaming sets on a micro-batch's jobs: the batch id a task writes for."""
QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Structured Streaming sets on a query's jobs: the query's id, kept by its checkpoint (the same
after a restart from it, another one for a new checkpoint)."""


@dataclass(frozen=True)
class WriteOptions:
    connection: ConnectorOptions
    topic: str | None = None
    sink_id: str | None = None
    write_batch_size: int = 1000
    settings: Settings = field(default_factory=Settings)
    """The write job's settings: its durability level (for the stage writes, the decision and the publishing) and
    its lease."""


@dataclass
class StagedRows(WriterCommitMessage):
    """What one task attempt wrote: its stages (one per topic stream), its row count and the rows of each stage
    (the commit checks that each stage published as many)."""

    stages: list[str] = field(default_factory=list)
    rows: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    query_id: str = ""
    """A micro-batch's streaming query, as its task saw it ('' when not known)."""


def parse_write_options(
    options: Mapping[str, str], schema: StructType, streaming: bool, overwrite: bool = False
) -> WriteOptions:
    """Validate the options and the DataFrame's columns of a batch or streaming write."""
    if overwrite:
        raise SparkSourceError("format redis-txmq appends messages to topics and cannot overwrite: use mode('append')")
    given = {key.lower(): value for key, value in options.items()}
    unknown = sorted(set(given) - set(WRITE_OPTIONS) - SPARK_OPTIONS)
    if unknown:
        raise SparkSourceError(
            f"unknown option(s) {', '.join(unknown)} for writing format redis-txmq; known: "
            + ", ".join(sorted(WRITE_OPTIONS))
        )
    names = {f.name.lower(): f for f in schema.fields}
    extra = sorted(set(names) - COLUMNS)
    if extra:
        raise SparkSourceError(
            f"column(s) {', '.join(extra)} cannot be written; a row has body (required), keys, tags, properties "
            "and topic: select those"
        )
    if "body" not in names or not isinstance(names["body"].dataType, BinaryType | StringType):
        raise SparkSourceError("a column 'body' (binary or string) is required")
    for name in ("keys", "tags", "topic"):
        if name in names and not isinstance(names[name].dataType, StringType):
            raise SparkSourceError(f"column '{name}' must be a string")
    if "properties" in names:
        kind = names["properties"].dataType
        if not (isinstance(kind, MapType) and isinstance(kind.keyType, StringType)):
            raise SparkSourceError("column 'properties' must be a map<string,string>")
    topic = given.get("topic")
    if topic is not None:
        _valid_topic(topic)
    elif "topic" not in names:
        raise SparkSourceError("give the topic: option 'topic', or a column 'topic'")
    sink_id = given.get("sinkid")
    if streaming:
        if not sink_id:
            raise SparkSourceError(
                "option 'sinkId' is required for a streaming write: it names the sink whose last committed "
                "micro-batch is kept, so that a batch replayed after a restart is not published twice"
            )
        try:
            validate_name(sink_id, "sinkId")
        except ValueError as exc:
            raise SparkSourceError(f"option 'sinkId': {exc}") from None
    elif sink_id is not None:
        raise SparkSourceError("option 'sinkId' is for streaming writes only")
    connection = ConnectorOptions(
        topics=(),
        redis_url=given.get("redis.url", DEFAULT_REDIS_URL),
        password=given.get("redis.password"),
        sentinel_password=given.get("redis.sentinelpassword"),
        cluster=bool_option(given, "redis.cluster", False),
    )
    size = positive_int_option(given, "writebatchsize", "writeBatchSize") or 1000
    replicas = positive_int_option(given, "durability.replicas", "durability.replicas") or 1
    try:
        settings = Settings(
            durability=given.get("durability", "master").strip().lower(),
            durability_replicas=replicas,
            durability_timeout=float(given.get("durability.timeout", "1.0")),
            job_lease=float(given.get("joblease", Settings.job_lease)),
        )
    except (ValueError, ConfigurationError) as exc:
        raise SparkSourceError(
            f"options durability, durability.replicas, durability.timeout, jobLease: {exc}"
        ) from None
    return WriteOptions(connection, topic, sink_id, size, settings)


def _valid_topic(topic: str) -> str:
    try:
        return validate_name(topic, "topic")
    except ValueError as exc:
        raise SparkSourceError(f"topic {topic!r}: {exc}") from None


class _Router:
    """Topic -> its topic streams (partition count read once per task), and a row's stream by its first key."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._streams: dict[str, list[str]] = {}
        self._next = 0

    def streams(self, topic: str) -> list[str]:
        streams = self._streams.get(topic)
        if streams is None:
            _valid_topic(topic)
            count = count_of(self.client.hget(topic_meta_key(topic), "partitions"))
            streams = self._streams[topic] = [k.topic_stream for k in partition_keys_of(topic, count)]
        return streams

    def stream(self, topic: str, keys: str | None) -> str:
        streams = self.streams(topic)
        if len(streams) == 1:
            return streams[0]
        first = keys.split(" ", 1)[0] if keys else ""
        if first:
            return streams[zlib.crc32(first.encode()) % len(streams)]
        self._next += 1
        return streams[self._next % len(streams)]


class _Lane:
    """The commands for one server, written on one connection of its pool in one write and the replies read back
    one by one (redis-py's pipeline spends more time per row than the server does), each batch followed by the
    durability level's confirmation on the same connection: the wire's exchange (``redis_txmq.sync.wire.exchange``),
    packed by hiredis. Not retried: a task that fails is retried by Spark, and its stage entries' counted ids make a
    repeated write a refusal, not a second copy."""

    def __init__(self, client: Any, durability: Durability | None, job_id: str) -> None:
        self.pool = client.connection_pool
        self.durability = durability
        self.job_id = job_id
        self._pack = hiredis_packer(self.pool.connection_kwargs)
        self._conn = self.pool.get_connection()
        self._commands: list[list[Any]] = []

    def add(self, command: list[Any]) -> None:
        self._commands.append(command)

    def flush(self) -> None:
        """Send the queued commands and check every reply, then the confirmation."""
        commands, self._commands = self._commands, []
        replies, confirmation = wire.exchange(self._conn, commands, pack=self._pack, durability=self.durability)
        failure: Exception | None = None
        for reply in replies:
            failure = failure or _refused(reply, self.job_id)
        durability = self.durability
        if durability is not None and failure is None and not durability.confirmed(confirmation):
            error = durability.error(confirmation)
            raise type(error)(f"write job {self.job_id}: stage writes {error}") from None
        if failure is not None:
            raise failure

    def close(self) -> None:
        self.pool.release(self._conn)


class _Sender:
    """Sends XADD commands in batches and checks every reply: on one server in one ``_Lane``; on a cluster
    through redis-py's cluster pipeline, which routes each stage to its master (and follows MOVED and ASK), or, at a
    durability level, in a lane per master, where each master confirms the writes it took."""

    def __init__(self, client: Any, durability: Durability | None = None, job_id: str = "") -> None:
        self.client = client
        self.durability = durability
        self.job_id = job_id
        self._pipe: Any = None
        self._lanes: dict[str, _Lane] = {}
        self._queued: dict[str, int] = {}
        if isinstance(client, RedisCluster) and durability is None:
            self._pipe = client.pipeline(transaction=False)
        self.queued = 0
        self.rows = 0
        """Rows in the queued commands."""

    def _lane(self, key: str) -> str:
        """The name of the lane of the server that holds ``key`` (made on first use)."""
        if isinstance(self.client, RedisCluster):
            node = self.client.get_node_from_key(key)
            name, server = node.name, node.redis_connection
        else:
            name, server = "", self.client
        if name not in self._lanes:
            self._lanes[name] = _Lane(server, self.durability, self.job_id)
        return name

    def add(self, command: list[Any], rows: int) -> None:
        """Queue ``command`` (its second element is the key it writes), which holds ``rows`` rows."""
        if self._pipe is not None:
            self._pipe.execute_command(*command)
        else:
            name = self._lane(command[1])
            self._lanes[name].add(command)
            self._queued[name] = self._queued.get(name, 0) + 1
        self.queued += 1
        self.rows += rows

    def flush(self) -> None:
        if not self.queued:
            return
        self.queued, self.rows = 0, 0
        if self._pipe is not None:
            # redis-py sends a command again when the connection dropped before its reply: its counted id makes the
            # repeat of an XADD that did run a refusal, taken as written (:func:`_refused`)
            for reply in self._pipe.execute(raise_on_error=False):
                failure = _refused(reply, self.job_id)
                if failure is not None:
                    raise failure
            return
        queued, self._queued = self._queued, {}
        for name in queued:
            self._lanes[name].flush()

    def close(self) -> None:
        lanes, self._lanes = self._lanes, {}
        for lane in lanes.values():
            lane.close()


def _refused(reply: Any, job_id: str) -> Exception | None:
    """What a stage write's reply says went wrong, or None: written, or written before (a repeat of an XADD whose
    counted id the stage holds is refused by Redis, nothing is appended twice; ``lua/check_stage.lua`` checks at the
    commit that no entry is missing)."""
    if reply is None:  # NOMKSTREAM: the stage is gone, the job was settled
        return TxMQError(f"write job {job_id}: {SETTLED_WHILE_WRITING}")
    if isinstance(reply, Exception):
        return None if STAGE_ALREADY_WRITTEN in str(reply) else reply
    return None


def _encoder() -> Any:
    """JSON of a properties map, remembered per distinct map: a column's maps repeat far more often than not."""
    known: dict[tuple[Any, ...], str] = {}

    def encode(properties: Any) -> str:
        if type(properties) is list:  # Arrow's map values: a list of pairs
            items = tuple(properties)
        else:
            items = tuple(properties.items() if isinstance(properties, Mapping) else properties)
        text = known.get(items)
        if text is None:
            text = json.dumps(dict(items), separators=(",", ":"), ensure_ascii=False, sort_keys=True)
            if len(known) < 4096:
                known[items] = text
        return text

    return encode


def _values(column: pa.Array | None, count: int) -> list[Any]:
    """A column's values, or ``count`` Nones for a column the DataFrame does not have."""
    return [None] * count if column is None else column.to_pylist()


def _body_sizes(column: pa.Array, bodies: list[Any]) -> list[Any]:
    """The bytes of each body (UTF-8 for a string; a string is packed as it is: MessagePack without the bin type
    writes str and bytes alike), 0 for a missing one."""
    if _textual(column):
        return pc.binary_length(column).fill_null(0).to_pylist()
    return [0 if body is None else len(body.encode() if isinstance(body, str) else body) for body in bodies]


def _property_texts(column: pa.Array | None, count: int, encode: Any) -> list[str | None]:
    """Each row's properties as JSON (``_encoder``), None for a missing or empty map. An Arrow map column is grouped
    by an unambiguous spelling of each row's pairs (every key and value prefixed with its length in bytes), and one
    row of each group is read and encoded: building a Python list of pairs per row cost a task more than the rest of
    the row."""
    if column is None:
        return [None] * count
    plain = isinstance(column, pa.MapArray) and pa.types.is_string(column.keys.type)
    if not plain or count == 0 or not pa.types.is_string(column.items.type):  # large_string, binary: row by row
        return [encode(properties) if properties else None for properties in column.to_pylist()]
    offsets = column.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    pairs = pc.binary_join_element_wise(
        _spelt(column.keys.slice(first, last - first)), _spelt(column.items.slice(first, last - first)), ":"
    )
    listed = pa.ListArray.from_arrays(pc.subtract(offsets, first), pairs, mask=column.is_null())
    groups = pc.binary_join(listed, ";").dictionary_encode()
    codes = groups.indices.fill_null(-1).to_pylist()
    firsts: dict[int, int] = {}
    for row, code in enumerate(codes):
        if code >= 0 and code not in firsts:
            firsts[code] = row
            if len(firsts) == len(groups.dictionary):
                break
    texts: list[str | None] = [None] * (len(groups.dictionary) + 1)  # the last one for code -1: a null map
    read = column.take(pa.array([firsts[code] for code in range(len(groups.dictionary))], type=pa.int64()))
    for code, properties in enumerate(read.to_pylist()):
        texts[code] = encode(properties) if properties else None
    return [texts[code] for code in codes]


def _textual(values: pa.Array) -> bool:
    """Whether ``values`` are strings or bytes, which Arrow's binary functions take."""
    kind = values.type
    types = pa.types
    return types.is_string(kind) or types.is_binary(kind) or types.is_large_string(kind) or types.is_large_binary(kind)


def _spelt(values: pa.Array) -> pa.Array:
    """``<length in bytes>:<value>``, or ``:`` for null: no two lists of these joined alike spell different lists."""
    lengths = pc.cast(pc.binary_length(values), pa.string())
    return pc.binary_join_element_wise(lengths, values, ":", null_handling="replace", null_replacement="")


def _one_stream(options: WriteOptions, columns: dict[str, pa.Array], count: int, router: _Router) -> str | None:
    """The topic stream of every row of a batch when they all go to one without routing (no topic column values,
    the topic of one partition), else None."""
    topics = columns.get("topic")
    if count == 0 or options.topic is None or (topics is not None and topics.null_count != count):
        return None
    streams = router.streams(options.topic)
    return streams[0] if len(streams) == 1 else None


def _raw_header(size: int) -> bytes:
    """MessagePack's header of a raw string of ``size`` bytes, as msgpack writes it without the bin type."""
    if size < 32:
        return bytes([0xA0 | size])
    if size < 1 << 16:
        return b"\xda" + size.to_bytes(2, "big")
    return b"\xdb" + size.to_bytes(4, "big")


def _array_header(size: int) -> bytes:
    """MessagePack's header of an array of ``size`` elements."""
    return bytes([0x90 | size]) if size < 16 else b"\xdc" + size.to_bytes(2, "big")


_RAW_HEADERS: list[pa.Array] = [pa.array([], pa.binary())]
"""The raw string headers of the sizes up to the largest seen in this process, as an Arrow array indexed by size."""
_FIELD_NAMES = {
    name: _raw_header(len(name)) + name.encode() for name in ("transaction_id", "body", "keys", "tags", "properties")
}


def _packed_rows(prefix: str, first: int, columns: dict[str, pa.Array], properties: list[str | None]) -> Any:
    """The rows of a batch, each as the bytes ``msgpack.packb(row, use_bin_type=False)`` gives for the row that
    ``write_rows`` builds one by one (transaction_id, body, then keys, tags and properties when not empty), made by
    Arrow's kernels: a Python list per row cost a task more than its Redis writes. None when the batch needs the row
    by row path (a missing body, one that may close an entry early or is over the limit, a value of 64 KiB or more, a
    column of another type), which checks and refuses what it must."""
    body = columns["body"]
    if not _textual(body) or body.null_count or not len(body):
        return None
    if pc.max(pc.binary_length(body)).as_py() * ROWS_PER_STAGE_ENTRY >= STAGE_ENTRY_BYTES:
        return None  # an entry may close early (or a body is over the limit): row by row
    numbers = pc.cast(pa.array(np.arange(first, first + len(body), dtype=np.int64)), pa.string())
    optional = [(name, columns.get(name)) for name in ("keys", "tags")]
    optional.append(("properties", None if columns.get("properties") is None else pa.array(properties, pa.string())))
    parts = [
        _packed_field("transaction_id", pc.binary_join_element_wise(prefix, numbers, "")),
        _packed_field("body", body),
    ]
    fields = pa.array(np.full(len(body), 4, dtype=np.int64))
    for name, values in optional:
        if values is None:
            continue
        if not _textual(values):
            return None
        lengths = pc.binary_length(values)
        if (pc.max(lengths).as_py() or 0) >= 1 << 16:
            return None
        present = pc.fill_null(pc.greater(lengths, 0), False)
        parts.append(pc.if_else(present, _packed_field(name, values), b""))
        fields = pc.add(fields, pc.multiply(pc.cast(present, pa.int64()), 2))
    heads = pc.take(pa.array([_array_header(size) for size in range(16)], pa.binary()), fields)
    return pc.binary_join_element_wise(heads, *parts, b"").to_pylist()


def _packed_field(name: str, values: pa.Array) -> pa.Array:
    """``name`` and each of ``values`` packed as raw strings (null where a value is null); values under 64 KiB."""
    values = pc.cast(values, pa.binary())
    sizes = pc.fill_null(pc.binary_length(values), 0)
    largest = pc.max(sizes).as_py() or 0
    if largest >= len(_RAW_HEADERS[0]):
        _RAW_HEADERS[0] = pa.array([_raw_header(size) for size in range(max(largest + 1, 256))], pa.binary())
    heads = pc.take(_RAW_HEADERS[0], sizes)
    return pc.binary_join_element_wise(_FIELD_NAMES[name], heads, values, b"")


class _StageEntries:
    """Rows gathered per stage and packed into stage entries (``ROWS_PER_STAGE_ENTRY`` rows, or fewer once
    their bodies reach ``STAGE_ENTRY_BYTES``), or entries packed by the caller (``queue``: a batch's rows packed by
    Arrow, its last entry maybe shorter), queued on the sender, each with its counted id (``stage_entry_id``: entry
    number, rows so far)."""

    def __init__(self, sender: _Sender) -> None:
        self.sender = sender
        self._rows: dict[str, list[list[Any]]] = {}
        self._bytes: dict[str, int] = {}
        self._written: dict[str, tuple[int, int]] = {}
        """Stage -> (entries, rows) queued so far."""

    def add(self, stage: str, row: list[Any], size: int) -> bool:
        """Gather ``row`` (``size`` bytes of body); True when this closed an entry (queued on the sender)."""
        rows = self._rows.get(stage)
        if rows is None:
            rows = self._rows[stage] = []
            self._bytes[stage] = 0
        rows.append(row)
        size = self._bytes[stage] = self._bytes[stage] + size
        if len(rows) >= ROWS_PER_STAGE_ENTRY or size >= STAGE_ENTRY_BYTES:
            self.pack(stage)
            return True
        return False

    def staged(self, stage: str) -> int:
        """Rows gathered for ``stage`` so far (queued or not)."""
        return self._written.get(stage, (0, 0))[1] + len(self._rows.get(stage, ()))

    def pack(self, stage: str) -> None:
        rows = self._rows.pop(stage, None)
        self._bytes.pop(stage, None)
        if rows:
            self.queue(stage, msgpack.packb(rows, use_bin_type=False), len(rows))  # cmsgpack reads str/raw, not bin

    def queue(self, stage: str, entry: bytes, rows: int) -> None:
        """Queue ``entry`` (packed, ``rows`` rows) with its counted id."""
        entries, staged = self._written.get(stage, (0, 0))
        entries, staged = entries + 1, staged + rows
        self._written[stage] = (entries, staged)
        self.sender.add(["XADD", stage, "NOMKSTREAM", stage_entry_id(entries, staged), STAGE_ROWS_FIELD, entry], rows)

    def gathering(self, stage: str) -> bool:
        """Whether rows of ``stage`` wait for their entry."""
        return bool(self._rows.get(stage))

    def pack_all(self) -> None:
        for stage in list(self._rows):
            self.pack(stage)


def write_rows(
    options: WriteOptions, keys: JobKeys, batches: Iterator[pa.RecordBatch], query_id: str = ""
) -> StagedRows:
    """One task attempt: every row into the stage of its topic stream, packed, in pipelines of about
    ``write_batch_size`` rows. A micro-batch's ``query_id`` is checked against the sink's (``lua/lease_job.lua``)."""
    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = f"{partition}-{context.taskAttemptId() if context else 0}-{os.urandom(4).hex()}"
    client = options.connection.client()
    job = WriteJob(client, keys, options.settings, query_id)
    keeper = LeaseKeeper(job)
    router = _Router(client)
    stages: dict[str, str] = {}
    """Topic stream -> this attempt's stage for it."""
    only_stage: dict[str, str] = {}
    """Topic of one partition -> its stage: such a row needs no routing."""
    encode = _encoder()
    rows = 0
    sender = _Sender(client, options.settings.durability_level(), keys.job_id)
    entries = _StageEntries(sender)
    prefix = f"{keys.job_id}.{partition}."

    def stage_of(stream: str) -> str | None:
        """This attempt's stage for ``stream``, listed in the job and opened on first use (``WriteJob.stage``); None
        once the job is decided without this attempt."""
        stage = stages.get(stream)
        if stage is None:
            stage = job.stage(stream, attempt)
            if stage is not None:
                stages[stream] = stage
        return stage

    try:
        if job.lease() is None:  # decided already (a replayed micro-batch, a late attempt): nothing to write
            return StagedRows([], 0, query_id=query_id)
        keeper.start()  # the job stays its driver's while this attempt runs, however long
        for batch in batches:
            columns = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
            count = batch.num_rows
            properties_of = _property_texts(columns.get("properties"), count, encode)
            stage, stream = None, _one_stream(options, columns, count, router)
            if stream is not None:
                stage = stage_of(stream)
                if stage is None:  # the job is decided without this attempt: nothing it writes is needed
                    return StagedRows([], 0, query_id=query_id)
            if stage is not None and not entries.gathering(stage):
                packed = _packed_rows(prefix, rows, columns, properties_of)
                if packed is not None:
                    for start in range(0, count, ROWS_PER_STAGE_ENTRY):
                        group = packed[start : start + ROWS_PER_STAGE_ENTRY]
                        entries.queue(stage, _array_header(len(group)) + b"".join(group), len(group))
                        if sender.rows >= options.write_batch_size:
                            sender.flush()
                    rows += count
                    continue
            bodies = columns["body"].to_pylist()
            sizes = _body_sizes(columns["body"], bodies)
            keys_of = _values(columns.get("keys"), count)
            tags_of = _values(columns.get("tags"), count)
            topics_of = _values(columns.get("topic"), count)
            rows_of = zip(bodies, sizes, keys_of, tags_of, properties_of, topics_of, strict=True)
            for body, size, row_keys, tags, properties, topic in rows_of:
                topic = topic or options.topic
                if body is None or topic is None:
                    raise SparkSourceError(f"write job {keys.job_id}: a row without a body or a topic")
                if size > DEFAULT_MAX_MESSAGE_SIZE:
                    raise SparkSourceError(f"topic {topic!r}: a body of {size} bytes is over 4 MiB")
                stage = only_stage.get(topic)
                if stage is None:
                    stage = stage_of(router.stream(topic, row_keys))
                    if stage is None:  # the job is decided without this attempt: nothing it writes is needed
                        return StagedRows([], 0, query_id=query_id)
                    if len(router.streams(topic)) == 1:
                        only_stage[topic] = stage
                row = ["transaction_id", prefix + str(rows), "body", body]
                if row_keys:
                    row += ["keys", row_keys]
                if tags:
                    row += ["tags", tags]
                if properties:
                    row += ["properties", properties]
                rows += 1
                if entries.add(stage, row, size) and sender.rows >= options.write_batch_size:
                    sender.flush()
        entries.pack_all()
        sender.flush()
    finally:
        keeper.stop()
        sender.close()
        job.close()
        client.close()
    counted = {stage: entries.staged(stage) for stage in stages.values()}
    return StagedRows(sorted(stages.values()), rows, counted, query_id)


def _commit(job: WriteJob, messages: list[Any]) -> None:
    """Commit the attempts Spark committed; raise unless COMMIT is the decision that stands, so Spark reports the job
    (or the micro-batch) failed."""
    job_decision = job.commit(_staged(messages))
    if job_decision.outcome is not LocalTransactionState.COMMIT:
        raise JobNotCommittedError(
            f"write job {job.job_id}: not committed: {job_decision.outcome.value} stands (its lease of "
            f"{job.settings.job_lease:g} s passed without a renewal and txmq checker rolled it back, or it was "
            "aborted); nothing of it was published: run it again"
        )


def _query_id(messages: list[Any]) -> str:
    """The streaming query the tasks of a micro-batch ran in ('' when none said)."""
    return next((m.query_id for m in messages if isinstance(m, StagedRows) and m.query_id), "")


def _staged(messages: list[Any]) -> dict[str, int]:
    """Stage -> rows staged, of the task attempts Spark committed."""
    staged: dict[str, int] = {}
    for message in messages:
        if isinstance(message, StagedRows):
            for stage in message.stages:
                staged[stage] = message.counts.get(stage, 0)
    return staged


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("redis-txmq")``: the job's rows become visible together (each once) on commit, or never."""

    def __init__(self, options: WriteOptions) -> None:
        # the job is leased and listed by its first task (this runs in a Python worker of the driver that Spark
        # may stop once idle: nothing here could keep a lease alive while the job runs)
        self.options = options
        self.keys = JobKeys(os.urandom(16).hex())
        client = options.connection.client()
        try:
            client.ping()  # a wrong URL or password fails here, on the driver, before any task runs
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(f"write job {self.keys.job_id}: cannot reach Redis ({exc})") from exc
        finally:
            client.close()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        return write_rows(self.options, self.keys, iterator)

    def commit(self, messages: list[Any]) -> None:
        """Decide COMMIT and publish; raises when the job was rolled back meanwhile (its lease passed) or a staged
        row cannot be published, so Spark reports the job failed."""
        self._settle(lambda job: _commit(job, messages))

    def abort(self, messages: list[Any]) -> None:
        """Roll back, unless a COMMIT stands (the commit raised after deciding): then publish it."""
        self._settle(lambda job: job.abort())

    def _settle(self, action: Any) -> None:
        client = self.options.connection.client()
        job = WriteJob(client, self.keys, self.options.settings)
        try:
            action(job)
        finally:
            job.close()
            client.close()


class StreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("redis-txmq").option("sinkId", ...)``: each micro-batch's rows exactly once, across task
    retries, speculative tasks, driver crashes and restarts from the checkpoint."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def _keys(self, batch_id: int) -> JobKeys:
        assert self.options.sink_id is not None
        return JobKeys.of_batch(self.options.sink_id, batch_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        context = TaskContext.get()
        raw = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if raw is None:
            raise SparkSourceError(
                f"sink {self.options.sink_id!r}: the task does not know its micro-batch "
                f"(no '{BATCH_ID_PROPERTY}' local property); this Spark version is not supported"
            )
        keys = self._keys(int(raw))
        query_id = (context.getLocalProperty(QUERY_ID_PROPERTY) if context else None) or ""
        return write_rows(self.options, keys, iterator, query_id)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Decide COMMIT and publish; raises when the sink's batches were committed by another query (the same
        sinkId for a new checkpoint), and when this batch was committed before yet its tasks staged new rows."""
        self._settle(batchId, lambda job: _commit(job, messages), _query_id(messages))

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """A COMMIT that stands (the commit raised after deciding) is published; an undecided batch is not decided
        (Spark runs it again with the same id, which must stay free to commit): its stages are deleted."""
        self._settle(batchId, lambda job: job.abort())

    def _settle(self, batch_id: int, action: Any, query_id: str = "") -> None:
        client = self.options.connection.client()
        job = WriteJob(client, self._keys(batch_id), self.options.settings, query_id)
        try:
            action(job)
        finally:
            job.close()
            client.close()
