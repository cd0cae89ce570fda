"""The redis-txmq Spark source on a real Redis with Spark local[2]: batch, streaming, offsets, bad options."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # CI sets it: there, a missing pyspark fails instead of skipping
    pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark,dev]'")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from redis_txmq import (  # noqa: E402
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
    create_topic,
)
from redis_txmq.ops.admin import status  # noqa: E402
from redis_txmq.spark.offsets import START_ID, earlier, later, parse_entry_id  # noqa: E402
from redis_txmq.spark.options import SparkSourceError, parse_options  # noqa: E402
from redis_txmq.spark.source import (  # noqa: E402
    ADVANCE_PAGE,
    SPLIT_ENTRIES,
    STREAM_SPLIT_ENTRIES,
    BatchReader,
    StreamReader,
    TopicPartition,
    plan_ranges,
)

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


def planned_sizes(client, stream, ranges):
    for left, right in zip(ranges, ranges[1:], strict=False):
        assert left.end == right.start, "ranges are (start, end] and touch: no entry read twice or skipped"
    assert ranges[0].first and not any(r.first for r in ranges[1:])
    return [len(client.xrange(stream, "(" + r.start, r.end)) for r in ranges]


def fill(client, stream, ids):
    pipe = client.pipeline(transaction=False)
    for i, entry_id in enumerate(ids):
        pipe.xadd(stream, {"transaction_id": f"t{i}", "body": str(i)}, id=entry_id)
    pipe.execute()


def test_a_read_from_earliest_is_split_by_entries_not_by_time(real_client, redis_url):
    """From 0-0 (1970) the cuts start at the stream's first entry: minPartitions=4 gives 4 ranges of about the
    same number of entries, also when the entries come in bursts between quiet hours."""
    hour = 3_600_000
    now = 1_800_000_000_000
    ids = [f"{now + i}-0" for i in range(2_000)]  # a trickle, then a burst of 200 entries per ms, then a trickle
    ids += [f"{now + hour + i // 200}-{i % 200}" for i in range(20_000)]
    ids += [f"{now + 2 * hour + i * 7}-0" for i in range(2_000)]
    fill(real_client, "orders", ids)
    reader = BatchReader(parse_options({"redis.url": redis_url, "topics": "orders", "minPartitions": "4"}, False))
    ranges = reader.partitions()
    assert ranges[0].start == START_ID and ranges[-1].end == ids[-1]
    sizes = planned_sizes(real_client, "orders", ranges)
    assert sum(sizes) == len(ids) and len(sizes) == 4
    assert max(sizes) <= 1.5 * min(sizes), sizes
    one = BatchReader(parse_options({"redis.url": redis_url, "topics": "orders"}, False)).partitions()
    assert [(r.start, r.end) for r in one] == [(START_ID, ids[-1])], "fewer entries than SPLIT_ENTRIES: one range"


def test_a_range_within_one_millisecond_or_of_few_entries(real_client):
    """Entries of one millisecond are cut at their own ids; never more ranges than entries."""
    part = TopicPartition("orders", 0, "orders")
    fill(real_client, "orders", [f"5-{i}" for i in range(40)])
    sizes = planned_sizes(real_client, "orders", plan_ranges(real_client, part, START_ID, "5-39", min_pieces=4))
    assert sizes == [10, 10, 10, 10]
    assert planned_sizes(real_client, "orders", plan_ranges(real_client, part, "5-36", "5-39", min_pieces=8)) == [
        1,
        1,
        1,
    ]
    assert len(plan_ranges(real_client, part, START_ID, "5-39", split_entries=SPLIT_ENTRIES)) == 1


def test_batch_split_read_returns_every_entry_once(spark, real_client, redis_url):
    pipe = real_client.pipeline()
    for i in range(50):
        pipe.xadd("splits", {"transaction_id": f"t{i}", "body": str(i)}, id=f"{1000 + i * 3}-0")
    pipe.execute()
    df = read(spark, redis_url, "splits", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(int(bytes(r.body)) for r in df.collect()) == list(range(50))


def test_a_one_partition_topic_from_earliest_is_read_by_every_task(spark, real_client, redis_url):
    """The read planned in ranges gives every entry exactly once, and every range reads some."""
    ids = [f"{1_800_000_000_000 + i // 50}-{i % 50}" for i in range(6_000)]
    fill(real_client, "orders", ids)
    df = read(spark, redis_url, "orders", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.id for r in df.select("id").collect()) == sorted(ids)
    per_task = df.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
    assert len(per_task) == 4 and min(per_task) > 0 and sum(per_task) == len(ids), per_task


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


def test_the_advance_is_paged_and_ends_where_one_walk_ends(real_client, redis_url):
    """A budget larger than a page is walked a page per script call, to the same end as one walk of the budget; the
    script refuses more than a page, so no call holds Redis for more than about 2 ms."""
    from redis_txmq.core.scripts import script_source

    source = script_source("stream_advance")
    assert f"local page = {ADVANCE_PAGE}" in source
    ids = [f"{1000 + i}-{i % 3}" for i in range(2 * ADVANCE_PAGE + 500)]
    fill(real_client, "paged", ids)
    advance = real_client.register_script(source)
    assert advance(keys=["paged"], args=[START_ID, ids[-1], ADVANCE_PAGE]) == [
        ADVANCE_PAGE,
        ids[ADVANCE_PAGE - 1].encode(),
    ]
    for budget in (ADVANCE_PAGE + 1, 0, "1.5"):
        with pytest.raises(Exception, match="budget must be an integer from 1 to"):
            advance(keys=["paged"], args=[START_ID, ids[-1], budget])
    options = {"redis.url": redis_url, "topics": "paged", "maxEntriesPerTrigger": str(2 * ADVANCE_PAGE + 300)}
    reader = StreamReader(parse_options(options, streaming=True))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(2 * ADVANCE_PAGE + 300))
    assert end == {"paged": {"0": ids[2 * ADVANCE_PAGE + 299]}}
    rest = reader.latestOffset(end, ReadMaxRows(2 * ADVANCE_PAGE + 300))
    assert rest == {"paged": {"0": ids[-1]}}, "the partition's head stops the walk within a page"
    reader.stop()


def test_a_large_micro_batch_is_planned_in_several_ranges(real_client, redis_url, monkeypatch):
    """A micro-batch of four times the split size is four ranges, counted or probed; they read every entry once."""
    import redis_txmq.spark.source as source

    monkeypatch.setattr(source, "STREAM_SPLIT_ENTRIES", 500)
    ids = [f"{1_800_000_000_000 + i // 20}-{i % 20}" for i in range(2_500)]
    fill(real_client, "big", ids)
    options = {"redis.url": redis_url, "topics": "big", "maxEntriesPerTrigger": "2000"}
    reader = StreamReader(parse_options(options, streaming=True))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(2000))
    ranges = reader.partitions(start, end)
    assert len(ranges) == 4 and planned_sizes(real_client, "big", ranges) == [500] * 4, "probes that see every entry"
    read_ids = [row["id"] for r in ranges for row in rows(reader.read(r))]
    assert read_ids == ids[:2000]
    restarted = StreamReader(parse_options(options, streaming=True))
    probed = restarted.partitions(start, end)  # a restart plans from the offset log, without the count
    sizes = planned_sizes(real_client, "big", probed)
    assert len(sizes) == 4 and sum(sizes) == 2000 and max(sizes) <= 1.5 * min(sizes), sizes
    small = restarted.partitions(end, {"big": {"0": ids[2_299]}})
    assert [(r.start, r.end) for r in small] == [(ids[1_999], ids[2_299])], "300 entries: one range"
    assert STREAM_SPLIT_ENTRIES > 500
    restarted.stop()
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


def batch_rows(redis_url, topics, **options):
    """Plan a batch read and read every range here, as Spark's executors would (data loss checks included)."""
    reader = BatchReader(parse_options({"redis.url": redis_url, "topics": topics, **options}, streaming=False))
    return [row for part in reader.partitions() for row in rows(reader.read(part))]


def test_created_topic_without_messages_is_empty_not_missing(spark, real_client, redis_url):
    create_topic(real_client, "fresh", 3)
    create_topic(real_client, "single", 1)
    assert read(spark, redis_url, "fresh,single").count() == 0
    report = status(real_client, 15)
    assert sorted(t["stream"] for t in report["topics"]) == ["fresh#0", "fresh#1", "fresh#2", "single"]
    assert all(t["committed"] == 0 for t in report["topics"])
    reader = StreamReader(parse_options({"redis.url": redis_url, "topics": "fresh"}, streaming=True))
    start = reader.initialOffset()
    assert start == {"fresh": {"0": START_ID, "1": START_ID, "2": START_ID}}
    assert reader.partitions(start, reader.latestOffset(start, ReadAllAvailable())) == []
    send(real_client, "fresh", [b"f0", b"f1", b"f2", b"f3"])
    end = reader.latestOffset(start, ReadAllAvailable())
    assert sorted(row["body"] for r in reader.partitions(start, end) for row in rows(reader.read(r))) == [
        b"f0",
        b"f1",
        b"f2",
        b"f3",
    ]
    reader.stop()
    assert sorted(bytes(r.body) for r in read(spark, redis_url, "fresh").collect()) == [b"f0", b"f1", b"f2", b"f3"]


def test_created_topic_is_empty_not_missing_on_a_cluster(cluster_url):
    """The registry and the topic's metadata are in different hash slots: create_topic must reach both."""
    from redis.cluster import RedisCluster

    cluster = RedisCluster.from_url(cluster_url)
    try:
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        create_topic(cluster, "fresh", 4)
        assert sorted(t["stream"] for t in status(cluster, 15)["topics"]) == [f"fresh#{p}" for p in range(4)]
        assert batch_rows(cluster_url, "fresh", **{"redis.cluster": "true"}) == []
    finally:
        cluster.close()


def test_a_partition_is_planned_by_entries_on_a_cluster(cluster_url):
    """The probes go through a cluster client's pipeline and its dict replies alike."""
    from redis.cluster import RedisCluster

    cluster = RedisCluster.from_url(cluster_url)
    try:
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        ids = [f"{1_800_000_000_000 + i // 30}-{i % 30}" for i in range(3_000)]
        fill(cluster, "planned", ids)
        options = {"redis.url": cluster_url, "redis.cluster": "true", "topics": "planned", "minPartitions": "3"}
        ranges = BatchReader(parse_options(options, streaming=False)).partitions()
        sizes = planned_sizes(cluster, "planned", ranges)
        assert len(sizes) == 3 and sum(sizes) == len(ids) and max(sizes) <= 1.5 * min(sizes), sizes
    finally:
        cluster.close()


def test_topic_sent_to_with_rollbacks_only_is_empty(real_client, redis_url):
    send(real_client, "refused", [b"r"], ROLLBACK)
    assert not real_client.exists("refused")
    assert batch_rows(redis_url, "refused") == []
    with pytest.raises(SparkSourceError, match="topic 'never-made' not found"):
        batch_rows(redis_url, "never-made")


SAME_MS = 1700000000000


def add_numbered(client, stream, seqs, ms=SAME_MS):
    """Plain entries ``<ms>-<seq>`` whose body is the seq: ids whose text order differs from their order."""
    pipe = client.pipeline()
    for seq in seqs:
        pipe.xadd(stream, {"transaction_id": f"t{seq}", "body": str(seq)}, id=f"{ms}-{seq}")
    pipe.execute()


def test_offset_helpers_compare_entry_ids_as_numbers():
    assert parse_entry_id(f"{SAME_MS}-9") < parse_entry_id(f"{SAME_MS}-10")
    assert earlier(f"{SAME_MS}-9", f"{SAME_MS}-10") == f"{SAME_MS}-9"
    assert later(f"{SAME_MS}-9", f"{SAME_MS}-10") == f"{SAME_MS}-10"
    assert earlier("999-0", "1000-0") == "999-0"


def test_batch_offsets_compare_entry_ids_as_numbers(spark, real_client, redis_url):
    add_numbered(real_client, "numeric", range(1, 13))
    after_9 = json.dumps({"numeric": {"0": f"{SAME_MS}-9"}})
    bodies = sorted(int(bytes(r.body)) for r in read(spark, redis_url, "numeric", startingOffsets=after_9).collect())
    assert bodies == [10, 11, 12]
    upto_9 = sorted(int(r["body"]) for r in batch_rows(redis_url, "numeric", endingOffsets=after_9))
    assert upto_9 == list(range(1, 10))


def test_streaming_offsets_compare_entry_ids_as_numbers(real_client, redis_url):
    add_numbered(real_client, "numeric", range(1, 10))
    reader = StreamReader(
        parse_options(
            {"redis.url": redis_url, "topics": "numeric", "startingOffsets": json.dumps({"numeric": {"0": "0-0"}})},
            streaming=True,
        )
    )
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"numeric": {"0": f"{SAME_MS}-9"}}
    assert sorted(int(row["body"]) for r in reader.partitions(start, end) for row in rows(reader.read(r))) == list(
        range(1, 10)
    )
    add_numbered(real_client, "numeric", range(10, 13))
    later_end = reader.latestOffset(end, ReadAllAvailable())
    assert later_end == {"numeric": {"0": f"{SAME_MS}-12"}}, "-12 is after -9"
    assert sorted(int(row["body"]) for r in reader.partitions(end, later_end) for row in rows(reader.read(r))) == [
        10,
        11,
        12,
    ]
    reader.stop()


@pytest.mark.parametrize("fail", [True, False])
def test_xdel_after_the_position_fails_or_warns_like_trimming(spark, real_client, redis_url, fail):
    results = send(real_client, "deleted", [b"d0", b"d1", b"d2", b"d3"])
    real_client.xdel("deleted", results[1].committed_id)  # d0, the read position, is still there
    df = read(
        spark,
        redis_url,
        "deleted",
        startingOffsets=json.dumps({"deleted": {"0": results[0].committed_id}}),
        failOnDataLoss=str(fail).lower(),
    )
    if fail:
        with pytest.raises(
            Exception, match=f"trimmed or deleted before they were read \\(up to {results[1].committed_id}"
        ):
            df.collect()
    else:
        assert sorted(bytes(r.body) for r in df.collect()) == [b"d2", b"d3"]


@pytest.mark.parametrize(
    ("deleted", "start", "lost_to", "left"),
    [
        ([10], 9, 10, [11, 12]),  # ids compared as numbers: "-10" sorts before "-9" as text
        ([9, 10, 11], 8, 11, [12]),  # an XDEL'ed range right after the position
        ([12], 9, 12, [10, 11]),  # the newest entry
        ([10, 11, 12], 9, 12, []),  # everything after the position: nothing left to read
    ],
)
def test_xdel_is_detected_in_batch_and_streaming(real_client, redis_url, caplog, deleted, start, lost_to, left):
    add_numbered(real_client, "deleted", range(1, 13))
    real_client.xdel("deleted", *[f"{SAME_MS}-{seq}" for seq in deleted])
    position = json.dumps({"deleted": {"0": f"{SAME_MS}-{start}"}})
    message = (
        f"entries after {SAME_MS}-{start} were trimmed or deleted before they were read \\(up to {SAME_MS}-{lost_to}\\)"
    )
    with pytest.raises(SparkSourceError, match=message):
        batch_rows(redis_url, "deleted", startingOffsets=position)
    caplog.set_level(logging.WARNING, logger="redis_txmq.spark.source")
    assert [
        int(r["body"]) for r in batch_rows(redis_url, "deleted", startingOffsets=position, failOnDataLoss="false")
    ] == left
    assert any(
        "failOnDataLoss=false" in r.getMessage() and f"up to {SAME_MS}-{lost_to}" in r.getMessage()
        for r in caplog.records
    )
    reader = StreamReader(
        parse_options({"redis.url": redis_url, "topics": "deleted", "startingOffsets": position}, streaming=True)
    )
    start_offset = reader.initialOffset()
    (batch,) = reader.partitions(start_offset, reader.latestOffset(start_offset, ReadAllAvailable()))
    with pytest.raises(SparkSourceError, match=message):
        rows(reader.read(batch))
    reader.stop()


def test_xdel_before_the_position_is_not_data_loss(real_client, redis_url):
    add_numbered(real_client, "deleted", range(1, 13))
    real_client.xdel("deleted", f"{SAME_MS}-3", f"{SAME_MS}-9")  # read already, then deleted (a consumer's cleanup)
    position = json.dumps({"deleted": {"0": f"{SAME_MS}-9"}})
    assert [int(r["body"]) for r in batch_rows(redis_url, "deleted", startingOffsets=position)] == [10, 11, 12]
    assert len(batch_rows(redis_url, "deleted")) == 10, "earliest reads what is there"


def test_trimming_everything_after_the_position_is_data_loss(real_client, redis_url):
    add_numbered(real_client, "trimmed", range(1, 6))
    real_client.xtrim("trimmed", maxlen=0, approximate=False)
    position = json.dumps({"trimmed": {"0": f"{SAME_MS}-2"}})
    with pytest.raises(SparkSourceError, match=f"up to {SAME_MS}-5"):
        batch_rows(redis_url, "trimmed", startingOffsets=position)
    assert batch_rows(redis_url, "trimmed") == []


def test_stream_deleted_after_planning_is_data_loss(real_client, redis_url):
    add_numbered(real_client, "dropped", range(1, 6))
    reader = BatchReader(
        parse_options(
            {
                "redis.url": redis_url,
                "topics": "dropped",
                "startingOffsets": json.dumps({"dropped": {"0": f"{SAME_MS}-1"}}),
            },
            streaming=False,
        )
    )
    (planned,) = reader.partitions()
    real_client.delete("dropped")
    with pytest.raises(SparkSourceError, match=f"up to {SAME_MS}-5"):
        rows(reader.read(planned))


class FakeContext:
    def __init__(self, master, conf=None, python_exec="python3"):
        self.master, self.pythonExec, self._conf = master, python_exec, conf or {}

    def getConf(self):
        return self._conf


class FakeSession:
    def __init__(self, context):
        self.sparkContext = context


@pytest.mark.parametrize(
    ("env", "master", "conf", "python_exec", "expected"),
    [
        ({}, "local[2]", {}, "python3", sys.executable),
        ({}, "local-cluster[2,1,1024]", {}, "python3", sys.executable),
        ({}, "local[*]", {"spark.pyspark.python": "/opt/py/bin/python"}, "python3", "/opt/py/bin/python"),
        ({}, "yarn", {"spark.pyspark.python": "/opt/py/bin/python"}, "python3", "/opt/py/bin/python"),
        ({}, "yarn", {}, "python3", None),  # this path may not exist on the executors
        ({}, "local[2]", {}, "/chosen/python", None),
        ({"PYSPARK_PYTHON": "/chosen/python"}, "local[2]", {}, "python3", None),
    ],
)
def test_register_chooses_the_workers_python_only_when_nobody_did(
    monkeypatch, env, master, conf, python_exec, expected
):
    from redis_txmq.spark import use_driver_python_for_local_workers

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    context = FakeContext(master, conf, python_exec)
    assert use_driver_python_for_local_workers(FakeSession(context)) == expected
    assert context.pythonExec == (expected or python_exec)


USER_SCRIPT = """\
import sys

from pyspark.sql import SparkSession

import redis_txmq.spark
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
redis_txmq.spark.register(spark)
orders = spark.read.format("redis-txmq").option("redis.url", sys.argv[1]).option("topics", "orders").load()
print("BODIES", sorted(bytes(row.body).decode() for row in orders.collect()))
spark.stop()
"""


def test_readme_snippet_runs_in_a_plain_script_without_pyspark_python(real_client, redis_url, tmp_path):
    """The README's snippet in a user's script, run with this interpreter and no PYSPARK_PYTHON: Spark would start
    its workers with ``python3`` from PATH (here one that cannot run them), unless register() points them here."""
    send(real_client, "orders", [b"o1", b"o2", b"o3"])
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name in ("python", "python3"):
        fake = fake_bin / name
        fake.write_text("#!/bin/sh\necho 'not an interpreter for Spark workers' >&2\nexit 3\n")
        fake.chmod(0o755)
    script = tmp_path / "job.py"
    script.write_text(USER_SCRIPT)
    env = {
        "PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.update({name: os.environ[name] for name in ("JAVA_HOME", "TMPDIR") if name in os.environ})
    done = subprocess.run(
        [sys.executable, str(script), redis_url], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "BODIES ['o1', 'o2', 'o3']" in done.stdout
