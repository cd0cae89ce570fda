"""The redis-txmq Spark source on a real Redis with Spark local[2]: batch, streaming, offsets, bad options."""

from __future__ import annotations

import json
import os

import pytest

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # CI sets it: there, a missing pyspark fails instead of skipping
    pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark,dev]'")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from redis_txmq import LocalTransactionState, Message, TransactionListener, TransactionProducer  # noqa: E402
from spark_connector.offsets import START_ID, parse_entry_id  # noqa: E402
from spark_connector.options import SparkSourceError, parse_options  # noqa: E402
from spark_connector.source import StreamReader, TopicPartition, split_range  # noqa: E402

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK
COLUMNS = ["topic", "partition", "id", "timestamp", "transaction_id", "keys", "tags", "body", "properties"]


class Decide(TransactionListener):
    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        return None


def send(client, topic, bodies, outcome=COMMIT):
    with TransactionProducer("spark_group", Decide(), client=client) as producer:
        return [
            producer.send_message_in_transaction(
                Message(topic, body, keys=f"key-{i}", tags="t", properties={"n": str(i)}), outcome
            )
            for i, body in enumerate(bodies)
        ]


def rows(batches):
    """The rows of the Arrow batches a reader yields, as dicts."""
    return [row for batch in batches for row in batch.to_pylist()]


def read(spark, redis_url, topics, **options):
    reader = spark.read.format("redis-txmq").option("redis.url", redis_url).option("topics", topics)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_has_the_columns_and_committed_messages_only(spark, real_client, redis_url):
    committed = send(real_client, "orders", [b'{"a": 1}', b"\x00\xffbinary"])
    send(real_client, "orders", [b"rolled back"], ROLLBACK)
    df = read(spark, redis_url, "orders")
    assert df.columns == COLUMNS
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types == {
        "topic": "string",
        "partition": "int",
        "id": "string",
        "timestamp": "timestamp",
        "transaction_id": "string",
        "keys": "string",
        "tags": "string",
        "body": "binary",
        "properties": "map<string,string>",
    }
    rows = df.orderBy("id").collect()
    assert [bytes(r.body) for r in rows] == [b'{"a": 1}', b"\x00\xffbinary"]
    assert [r.transaction_id for r in rows] == [c.transaction_id for c in committed]
    assert [r.id for r in rows] == [c.committed_id for c in committed]
    first = rows[0]
    assert (first.topic, first.partition, first.keys, first.tags, first.properties) == (
        "orders",
        0,
        "key-0",
        "t",
        {"n": "0"},
    )
    assert int(first.timestamp.timestamp() * 1000) == parse_entry_id(first.id)[0]


def test_several_topics_and_offsets(spark, real_client, redis_url):
    a = send(real_client, "topic-a", [b"a0", b"a1", b"a2"])
    send(real_client, "topic-b", [b"b0"])
    assert read(spark, redis_url, "topic-a,topic-b").count() == 4
    starting = json.dumps({"topic-a": {"0": a[0].committed_id}})
    assert sorted(
        bytes(r.body) for r in read(spark, redis_url, "topic-a,topic-b", startingOffsets=starting).collect()
    ) == [b"a1", b"a2", b"b0"]
    ending = json.dumps({"topic-a": {"0": a[1].committed_id}, "topic-b": {"0": "0-0"}})
    assert sorted(bytes(r.body) for r in read(spark, redis_url, "topic-a,topic-b", endingOffsets=ending).collect()) == [
        b"a0",
        b"a1",
    ]
    assert read(spark, redis_url, "topic-a", startingOffsets="latest").count() == 0


def test_large_stream_is_split_into_ranges():
    part = TopicPartition("orders", 0, "orders")
    ranges = split_range(part, "0-0", "1000000-5", entry_count=350_000)
    assert len(ranges) == 4 and ranges[0].first and not any(r.first for r in ranges[1:])
    assert ranges[0].start == "0-0" and ranges[-1].end == "1000000-5"
    for left, right in zip(ranges, ranges[1:], strict=False):
        assert left.end == right.start, "ranges are (start, end] and touch: no entry read twice or skipped"
    assert len(split_range(part, "5-0", "5-9", entry_count=10_000_000)) == 1


def test_batch_split_read_returns_every_entry_once(spark, real_client, redis_url):
    pipe = real_client.pipeline()
    for i in range(50):
        pipe.xadd("splits", {"transaction_id": f"t{i}", "body": str(i)}, id=f"{1000 + i * 3}-0")
    pipe.execute()
    df = read(spark, redis_url, "splits", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(int(bytes(r.body)) for r in df.collect()) == list(range(50))


def stream_to_parquet(spark, redis_url, topics, path, checkpoint, **options):
    reader = spark.readStream.format("redis-txmq").option("redis.url", redis_url).option("topics", topics)
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", path)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the AvailableNow query did not finish"
    return query


def test_streaming_restart_from_checkpoint_is_exactly_once(spark, real_client, redis_url, tmp_path):
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    send(real_client, "stream-orders", [f"first-{i}".encode() for i in range(5)])
    send(real_client, "stream-orders", [b"never"], ROLLBACK)
    first = stream_to_parquet(spark, redis_url, "stream-orders", out, checkpoint, maxEntriesPerTrigger="2")
    assert [p["numInputRows"] for p in first.recentProgress if p["numInputRows"]] == [2, 2, 1]
    send(real_client, "stream-orders", [f"second-{i}".encode() for i in range(4)])
    stream_to_parquet(spark, redis_url, "stream-orders", out, checkpoint)
    bodies = sorted(bytes(r.body) for r in spark.read.parquet(out).collect())
    expected = sorted([f"first-{i}".encode() for i in range(5)] + [f"second-{i}".encode() for i in range(4)])
    assert bodies == expected


def test_latest_start_is_pinned_by_the_first_batch(real_client, redis_url):
    """The first batch's end offset (written to Spark's offset log before it runs) fixes where "latest" was, so a
    query that dies before its first commit restarts from there, not from a later "latest"."""
    send(real_client, "pinned", [b"old"])
    reader = StreamReader(
        parse_options({"redis.url": redis_url, "topics": "pinned", "startingOffsets": "latest"}, streaming=True)
    )
    start = reader.initialOffset()
    assert start == {"pinned": {"0": "latest"}}
    end0 = reader.latestOffset(start, ReadAllAvailable())
    assert reader.partitions(start, end0) == []
    send(real_client, "pinned", [b"new"])  # ... the query dies here and restarts from its offset log
    restarted = StreamReader(
        parse_options({"redis.url": redis_url, "topics": "pinned", "startingOffsets": "latest"}, streaming=True)
    )
    assert restarted.partitions(restarted.initialOffset(), end0) == []
    end1 = restarted.latestOffset(end0, ReadAllAvailable())
    (batch,) = restarted.partitions(end0, end1)
    assert [row["body"] for row in rows(restarted.read(batch))] == [b"new"]
    restarted.stop()
    reader.stop()


def test_admission_control_shares_the_budget(real_client, redis_url):
    send(real_client, "busy", [b"x"] * 9)
    send(real_client, "quiet", [b"y"] * 2)
    reader = StreamReader(
        parse_options({"redis.url": redis_url, "topics": "busy,quiet", "maxEntriesPerTrigger": "6"}, streaming=True)
    )
    assert reader.getDefaultReadLimit() == ReadMaxRows(6)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(6))
    counts = {r.part.topic: len(rows(reader.read(r))) for r in reader.partitions(start, end)}
    assert counts == {"busy": 4, "quiet": 2}
    everything = reader.latestOffset(end, ReadAllAvailable())
    assert sum(len(rows(reader.read(r))) for r in reader.partitions(end, everything)) == 5
    reader.stop()


@pytest.mark.parametrize("fail", [True, False])
def test_trimmed_entries_fail_or_warn(spark, real_client, redis_url, fail):
    results = send(real_client, "trimmed", [b"t0", b"t1", b"t2", b"t3"])
    real_client.xtrim("trimmed", minid=results[2].committed_id, approximate=False)  # t0, t1 gone
    df = read(
        spark,
        redis_url,
        "trimmed",
        startingOffsets=json.dumps({"trimmed": {"0": results[0].committed_id}}),
        failOnDataLoss=str(fail).lower(),
    )
    if fail:
        with pytest.raises(Exception, match="trimmed or deleted before they were read"):
            df.collect()
    else:
        assert sorted(bytes(r.body) for r in df.collect()) == [b"t2", b"t3"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "orders", "colour": "red"}, "unknown option.*colour"),
        ({}, "'topics' is required"),
        ({"topics": "or{ders}"}, "invalid topic name"),
        ({"topics": "orders", "startingOffsets": "{not json"}, "startingOffsets"),
        ({"topics": "orders", "startingOffsets": '{"other": {"0": "1-0"}}'}, "not in 'topics'"),
        ({"topics": "orders", "startingOffsets": '{"orders": {"0": "yesterday"}}'}, "not an entry id"),
        ({"topics": "orders", "maxEntriesPerTrigger": "0"}, "maxEntriesPerTrigger"),
        ({"topics": "orders", "failOnDataLoss": "maybe"}, "failondataloss"),
    ],
)
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(SparkSourceError, match=message):
        parse_options(options, streaming="maxEntriesPerTrigger" in options)


def test_batch_only_and_stream_only_options():
    with pytest.raises(SparkSourceError, match="endingOffsets"):
        parse_options({"topics": "t", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(SparkSourceError, match="maxEntriesPerTrigger"):
        parse_options({"topics": "t", "maxEntriesPerTrigger": "5"}, streaming=False)


def test_missing_topic_and_errors_without_password(spark, real_client, redis_url, capsys):
    secret_url = redis_url.replace("redis://", "redis://user:s3cret-pw@")
    send(real_client, "orders", [b"x"])
    read(spark, secret_url, "orders").explain(extended=True)
    assert "s3cret-pw" not in capsys.readouterr().out
    with pytest.raises(Exception, match="topic 'nowhere' not found") as raised:
        read(spark, redis_url, "nowhere").collect()
    with pytest.raises(Exception) as raised:
        read(spark, secret_url, "orders", colour="red").collect()
    assert "s3cret-pw" not in str(raised.value)
    assert "s3cret-pw" not in repr(parse_options({"redis.url": secret_url, "topics": "t"}, streaming=False))


def test_password_option_is_used_and_redacted(spark, real_client, redis_url, capsys):
    import redis

    real_client.config_set("requirepass", "s3cret-pw")
    authed = redis.Redis.from_url(redis_url, password="s3cret-pw")
    try:
        send(authed, "guarded", [b"g"])
        df = read(spark, redis_url, "guarded", **{"redis.password": "s3cret-pw"})
        assert [bytes(r.body) for r in df.collect()] == [b"g"]
        df.explain(extended=True)
        assert "s3cret-pw" not in capsys.readouterr().out
    finally:
        authed.config_set("requirepass", "")
        authed.close()


def test_start_id_constant_is_the_empty_stream_position():
    assert parse_entry_id(START_ID) == (0, 0)


def test_example_pipeline_counts_committed_orders_per_minute(spark, real_client, redis_url):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "order_events_job.py"
    spec = importlib.util.spec_from_file_location("order_events_job", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    send(
        real_client, "orders", [json.dumps({"order_id": i, "amount": 10.5, "customer": "c"}).encode() for i in range(3)]
    )
    send(real_client, "orders", [json.dumps({"order_id": 9, "amount": 99.0, "customer": "x"}).encode()], ROLLBACK)
    orders = job.parse(read(spark, redis_url, "orders"))
    assert sorted(r.order_id for r in orders.collect()) == [0, 1, 2]
    summary = job.per_minute(orders).collect()
    assert sum(r.orders for r in summary) == 3 and sum(r.revenue for r in summary) == 31.5


def test_streaming_reads_every_partition_once(spark, real_client, redis_url, tmp_path):
    from redis_txmq import create_topic

    create_topic(real_client, "parted", 3)
    send(real_client, "parted", [f"p{i}".encode() for i in range(9)])
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    query = stream_to_parquet(spark, redis_url, "parted", out, checkpoint, maxEntriesPerTrigger="4")
    assert all(p["numInputRows"] <= 4 for p in query.recentProgress)
    send(real_client, "parted", [b"late"])
    stream_to_parquet(spark, redis_url, "parted", out, checkpoint)
    rows = spark.read.parquet(out).collect()
    assert sorted(bytes(r.body) for r in rows) == sorted([f"p{i}".encode() for i in range(9)] + [b"late"])
    assert {r.partition for r in rows} == {0, 1, 2}
