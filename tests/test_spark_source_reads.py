"""The Spark source's readers, run in this process without a SparkSession, as Spark's executors call them: an entry
deleted with XDEL is data loss (test_spark.py covers trimming), entries of any layout and a cluster client's replies
are decoded alike, a read stopped early leaves no reply behind, and corrupt or foreign-encoded properties are named
or read."""

from __future__ import annotations

import json
import os

import pytest

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # CI sets it: there, a missing pyspark fails instead of skipping
    pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark,dev]'")

from redis_txmq.spark.options import SparkSourceError, parse_options  # noqa: E402
from redis_txmq.spark.source import BatchReader  # noqa: E402


def batch_reader(redis_url: str, start: str, **options: str) -> BatchReader:
    given = {"redis.url": redis_url, "topics": "orders", "startingOffsets": json.dumps({"orders": {"0": start}})}
    return BatchReader(parse_options({**given, **options}, streaming=False))


def read_all(reader: BatchReader) -> list[bytes]:
    return [row["body"] for p in reader.partitions() for batch in reader.read(p) for row in batch.to_pylist()]


def test_an_entry_deleted_after_the_start_is_data_loss(real_client, redis_url):
    """XDEL of an entry after the reader's start is reported exactly (Redis keeps the largest deleted id), even
    though the stream's first entry is still the start: with failOnDataLoss it fails, without it the rest is read."""
    ids = [real_client.xadd("orders", {"transaction_id": f"t{i}", "body": f"b{i}"}).decode() for i in range(4)]
    real_client.xdel("orders", ids[2])
    with pytest.raises(SparkSourceError, match="trimmed or deleted before they were read"):
        read_all(batch_reader(redis_url, ids[0]))
    assert read_all(batch_reader(redis_url, ids[0], failOnDataLoss="false")) == [b"b1", b"b3"]
    assert read_all(batch_reader(redis_url, ids[2])) == [b"b3"], "a deletion at or before the start lost nothing"


ODD_ENTRIES: list[list[tuple[str, bytes]]] = [
    [("transaction_id", b"t0"), ("body", b"b0"), ("keys", b"k0"), ("properties", b'{"a":"1"}')],
    [("transaction_id", b"t1"), ("body", b"b1"), ("keys", b"k1"), ("properties", b'{"a":"1"}')],
    [("body", b"\x00\r\nbinary"), ("transaction_id", b"t2")],  # another order, no keys nor properties
    [("transaction_id", b"t3"), ("body", b"first"), ("body", b"second")],  # a repeated field: the last one counts
    [("transaction_id", b"t4"), ("body", b"b4"), ("tags", b"x"), ("keys", b"\xffk"), ("properties", b"")],
    [("body", b"b5"), ("note", b"a field no column reads"), ("properties", b'{"a":"2","b":"3"}')],
    [("transaction_id", b"t6"), ("keys", b"k6")],  # no body
    [("transaction_id", b"t7"), ("body", b"b7"), ("keys", b"k7"), ("properties", b'{"a":"1"}')],
]


def add_entries(client, stream: str, entries_fields: list[list[tuple[str, bytes]]]) -> list[str]:
    ids = []
    for fields in entries_fields:
        args = [item for pair in fields for item in pair]
        ids.append(client.execute_command("XADD", stream, "*", *args).decode())
    return ids


def decoded_one_by_one(client, stream: str) -> list[dict]:
    """What each entry holds, decoded entry by entry from redis-py's reply, as a consumer does."""
    from redis_txmq.core import entries

    rows = []
    for entry_id, raw in client.xrange(stream):
        fields = entries.field_map(raw)
        eid = entry_id.decode()
        rows.append(
            {
                "id": eid,
                "ms": int(eid.split("-")[0]),
                "transaction_id": entries.text(fields.get("transaction_id")),
                "keys": entries.text(fields.get("keys")),
                "tags": entries.text(fields.get("tags")),
                "body": fields.get("body"),
                "properties": sorted(entries.decode_properties(fields.get("properties"), eid).items()),
            }
        )
    return rows


def as_compared(row: dict) -> dict:
    return {
        "id": row["id"],
        "ms": int(row["timestamp"].timestamp() * 1000),
        "transaction_id": row["transaction_id"],
        "keys": row["keys"],
        "tags": row["tags"],
        "body": row["body"],
        "properties": sorted(row["properties"]),
    }


@pytest.mark.parametrize("page", ["1", "2", "3", "10000"])
def test_entries_of_any_layout_are_read_as_decoded_one_by_one(real_client, redis_url, page):
    """Pages of one field layout and pages mixing several (other orders, missing, extra or repeated fields, invalid
    UTF-8, empty properties) give what decoding each entry on its own gives; and the garbage collector is back on."""
    import gc

    add_entries(real_client, "orders", ODD_ENTRIES)
    reader = BatchReader(parse_options({"redis.url": redis_url, "topics": "orders", "readBatchSize": page}, False))
    rows = [as_compared(row) for p in reader.partitions() for batch in reader.read(p) for row in batch.to_pylist()]
    assert rows == decoded_one_by_one(real_client, "orders")
    assert rows[3]["body"] == b"second" and rows[4]["keys"] == "\ufffdk" and rows[6]["body"] is None
    assert gc.isenabled()


def test_a_cluster_clients_dicts_give_the_same_batch(real_client):
    """A cluster client parses XRANGE replies into dicts on its nodes: they make the same Arrow batch."""
    from redis_txmq.spark.source import TopicPartition, _record_batch, _xrange_pages

    add_entries(real_client, "orders", ODD_ENTRIES)
    part = TopicPartition("orders", 0, "orders")
    parsed = real_client.xrange("orders")
    (raw,) = list(_xrange_pages(real_client, "orders", "0-0", "+", 100))
    assert isinstance(parsed[0][1], dict) and isinstance(raw[0][1], list)
    assert _record_batch(part, parsed).equals(_record_batch(part, raw))
    assert _record_batch(part, parsed[:2]).equals(_record_batch(part, raw[:2])), "one layout"


def test_a_read_stopped_early_leaves_no_reply_behind(real_client):
    """The next page is asked for before the current one is handed out: a read stopped there must not leave that
    reply to be taken as the answer to the connection's next command."""
    from redis_txmq.spark.source import _xrange_pages

    ids = add_entries(real_client, "orders", ODD_ENTRIES)
    pages = _xrange_pages(real_client, "orders", "0-0", "+", 2)
    assert [entry[0].decode() for entry in next(pages)] == ids[:2]
    pages.close()
    assert real_client.ping() and real_client.xlen("orders") == len(ODD_ENTRIES)
    assert [len(page) for page in _xrange_pages(real_client, "orders", "0-0", "+", 2)] == [2, 2, 2, 2, 0]
    assert [len(page) for page in _xrange_pages(real_client, "orders", "0-0", "+", 3)] == [3, 3, 2]


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (b'{"a":1}', "is not an object of strings"),
        (b'{"a":null}', "is not an object of strings"),
        (b'{"a":{"b":"c"}}', "is not an object of strings"),
        (b'["a"]', "is not an object of strings"),
        (b"not json", "is not JSON"),
        (b'{"a":"\xff"}', "is not JSON"),
    ],
)
def test_corrupt_properties_name_their_entry(real_client, redis_url, corrupt, message):
    """Properties are decoded together, once per distinct value; one that is not a JSON object of strings still
    fails the read naming its entry, and the garbage collector is back on."""
    import gc

    from redis_txmq.core.errors import CorruptEntryError

    ids = add_entries(
        real_client,
        "orders",
        [
            [("transaction_id", b"t0"), ("body", b"b0"), ("properties", b'{"a":"1"}')],
            [("transaction_id", b"t1"), ("body", b"b1"), ("properties", corrupt)],
            [("transaction_id", b"t2"), ("body", b"b2"), ("properties", corrupt)],
        ],
    )
    with pytest.raises(CorruptEntryError, match=f"entry {ids[1]}: field 'properties' {message}"):
        read_all(batch_reader(redis_url, "0-0"))
    assert gc.isenabled()


def test_properties_in_another_json_encoding_are_read_as_before(real_client, redis_url):
    """JSON in UTF-16 or with a byte-order mark is not read all at once, but one by one as a consumer reads it."""
    text = '{"name":"café"}'
    add_entries(
        real_client,
        "orders",
        [
            [("transaction_id", b"t0"), ("body", b"b0"), ("properties", text.encode("utf-16"))],
            [("transaction_id", b"t1"), ("body", b"b1"), ("properties", text.encode("utf-8-sig"))],
            [("transaction_id", b"t2"), ("body", b"b2"), ("properties", text.encode())],
        ],
    )
    reader = BatchReader(parse_options({"redis.url": redis_url, "topics": "orders"}, streaming=False))
    rows = [row for p in reader.partitions() for batch in reader.read(p) for row in batch.to_pylist()]
    assert [row["properties"] for row in rows] == [[("name", "café")]] * 3
