"""The Spark writer's fast path packs a batch's rows with Arrow's kernels (``spark_connector/writer.py``:
``_packed_rows``, ``_property_texts``): what it stages must be byte for byte what the row-by-row path stages, which
``lua/publish_stage.lua`` unpacks and publishes. Compared here on batches a DataFrame can hand a task: strings and
binary bodies, empty and missing keys, tags and properties, non-ASCII text, maps that repeat, empty and null maps,
sliced batches, rows whose fields make arrays of every length the path writes."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from redis_txmq.spark import writer  # noqa: E402

PREFIX = "job-1.3."


def slow_rows(batch: Any, first: int) -> list[bytes]:
    """Each row as the row-by-row path packs it (``write_rows``): transaction_id, body, then keys, tags and
    properties when not empty; one row's bytes, as in an entry of one row less its array header."""
    columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    count = batch.num_rows
    properties = writer._property_texts(columns.get("properties"), count, writer._encoder())
    per_row = writer._encoder()
    reference = columns.get("properties")
    out = []
    for i in range(count):
        row: list[Any] = ["transaction_id", f"{PREFIX}{first + i}", "body", columns["body"][i].as_py()]
        for name in ("keys", "tags"):
            value = columns[name][i].as_py() if name in columns else None
            if value:
                row += [name, value]
        if reference is not None:
            mapping = reference[i].as_py()
            expected = per_row(mapping) if mapping else None
            assert properties[i] == expected, (i, properties[i], expected)  # the grouping reads each row alike
        if properties[i]:
            row += ["properties", properties[i]]
        out.append(msgpack.packb(row, use_bin_type=False))
    return out


def words(rng: random.Random, empty: bool = True) -> str | None:
    choice = rng.random()
    if choice < 0.15:
        return None
    if empty and choice < 0.3:
        return ""
    return rng.choice(["order", "ключ", "注文", "a b", "x:y;z", "3:abc", "é" * rng.randint(1, 40)]) + str(
        rng.randint(0, 9)
    )


def batch_of(rng: random.Random, count: int, binary: bool) -> Any:
    bodies = [
        ("body-" + "ü" * rng.randint(0, 60)).encode() if binary else "body " * rng.randint(0, 40) for _ in range(count)
    ]
    shapes = [[], [("a", "1")], [("a", "1"), ("b", None)], [("b", "")], [("ключ", "値"), ("1:", ":2")]]
    maps = [None if rng.random() < 0.1 else rng.choice(shapes) for _ in range(count)]
    return pa.record_batch(
        {
            "body": pa.array(bodies, pa.binary() if binary else pa.string()),
            "keys": pa.array([words(rng) for _ in range(count)], pa.string()),
            "tags": pa.array([words(rng) for _ in range(count)], pa.string()),
            "properties": pa.array(maps, pa.map_(pa.string(), pa.string())),
        }
    )


@pytest.mark.parametrize("binary", [False, True], ids=["string bodies", "binary bodies"])
@pytest.mark.parametrize("seed", range(4))
def test_the_arrow_packed_rows_are_the_row_by_row_bytes(binary: bool, seed: int) -> None:
    rng = random.Random(seed)
    whole = batch_of(rng, 257, binary)
    for start, length in ((0, 257), (0, 1), (17, 100), (100, 157), (256, 1)):
        batch = whole.slice(start, length)  # a task may be handed a slice of a larger batch
        columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        properties = writer._property_texts(columns["properties"], batch.num_rows, writer._encoder())
        packed = writer._packed_rows(PREFIX, 1000 + start, columns, properties)
        assert packed is not None, "these rows take the fast path"
        assert packed == slow_rows(batch, 1000 + start)
        entry = writer._array_header(len(packed)) + b"".join(packed)
        assert msgpack.unpackb(entry, raw=False) == [msgpack.unpackb(row, raw=False) for row in packed]


def test_rows_the_fast_path_cannot_pack_exactly_go_row_by_row() -> None:
    big = pa.array([b"x" * (writer.STAGE_ENTRY_BYTES // writer.ROWS_PER_STAGE_ENTRY + 1)], pa.binary())
    assert writer._packed_rows(PREFIX, 0, {"body": big}, [None]) is None  # may close an entry early
    assert writer._packed_rows(PREFIX, 0, {"body": pa.array([None, b"a"], pa.binary())}, [None, None]) is None
    long_key = {"body": pa.array([b"a"]), "keys": pa.array(["k" * 70_000])}
    assert writer._packed_rows(PREFIX, 0, long_key, [None]) is None
    assert writer._packed_rows(PREFIX, 0, {"body": pa.array([b"a"]), "keys": pa.array([[1]])}, [None]) is None


@pytest.mark.parametrize(
    "kind",
    [
        pa.map_(pa.large_string(), pa.large_string()),  # spark.sql.execution.arrow.useLargeVarTypes
        pa.map_(pa.string(), pa.large_string()),
        pa.map_(pa.string(), pa.string()),
    ],
    ids=str,
)
def test_properties_of_every_string_type_are_each_rows_json(kind: Any) -> None:
    maps = [[("a", "1")], None, [], [("b", None), ("a", "x")], [("a", "1")]] * 30
    column = pa.array(maps, kind).slice(3, 120)
    per_row = writer._encoder()
    expected = [per_row(m) if m else None for m in column.to_pylist()]
    assert writer._property_texts(column, len(column), writer._encoder()) == expected
