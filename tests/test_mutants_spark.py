"""The Spark source's data-loss check on an entry deleted with XDEL (test_spark.py covers trimming): the readers run
in this process, without a SparkSession, as Spark's executors call them."""

from __future__ import annotations

import json
import os

import pytest

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # CI sets it: there, a missing pyspark fails instead of skipping
    pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark,dev]'")

from spark_connector.options import SparkSourceError, parse_options  # noqa: E402
from spark_connector.source import BatchReader  # noqa: E402


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
