"""Rows per second of a Spark read (local[2]) of a topic stream against one-process XRANGE loops, and the rows per
second and micro-batch latency of a Structured Streaming read.

    python -m bench.spark_read [--redis-url URL] [--entries 500000] [--rounds 5]

Fills a topic stream with ``entries`` entries in the committed-entry format (transaction_id, body, keys,
properties) by pipelined XADD. Each round then times, in an order rotated from round to round:

- ``spark``: the batch read aggregated on the Spark side, ``df.agg(count(*), sum(length(body)))``, so that every
  row reaches Spark and is used there;
- ``spark_noop``: the same read into the ``noop`` sink;
- ``loop``: one process, XRANGE pages of 1,000, each entry decoded as a consumer decodes it (``decode_topic_entry``);
- ``lean``: one process, XRANGE pages of 1,000, only a tuple of the raw fields built per entry.

The topic has one partition (one stream), read from ``earliest``: the figures ``rows_per_task`` (the entries each
Spark task read) and ``plan_ms`` (the driver's planning, its probes included) show how the read was split.

The machine's speed varies between runs, so the figures compared are the per-round ratios (median, min and max):
``spark_vs_lean``, ``spark_vs_loop``, ``noop_vs_lean``. One untimed run of each goes first (Spark starts its JVM and
Python workers on the first query). The loops read 1,000 entries per call, their fastest page size (larger pages
make them slower: more live objects for Python's garbage collector to walk).

Then two Structured Streaming queries into the ``noop`` sink, each figure a median over the micro-batches that read
something (``processedRowsPerSecond``, ``durationMs.triggerExecution`` of ``recentProgress``):

- ``streaming_backlog``: the same filled topic from the start, a tenth of it per micro-batch
  (``maxEntriesPerTrigger``, ``availableNow``), and its overall rows per second from the query's start;
- ``streaming_steady``: a topic filled at a steady rate by another thread while the query runs with the default
  trigger (a new micro-batch as soon as the previous one ends): the latency of keeping up.

Prints a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from redis_txmq.transport.embedded import EmbeddedRedis

TOPIC = "bench-spark-read"
STEADY_TOPIC = "bench-spark-read-steady"
LOOP_PAGE = 1000
BODY = b'{"order_id": 123456, "amount": 42.5, "customer": "someone"}'


def entry(i: int) -> dict[Any, Any]:
    return {"transaction_id": uuid.uuid4().hex, "body": BODY, "keys": f"order-{i}", "properties": '{"source":"bench"}'}


def fill(client: redis.Redis, entries: int, topic: str = TOPIC) -> None:
    client.delete(topic)
    for start in range(0, entries, 10_000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(entries, start + 10_000)):
            pipe.xadd(topic, entry(i))
        pipe.execute()


def python_loop(client: redis.Redis) -> int:
    """What a consumer does with each entry: ``decode_topic_entry`` (fields decoded, properties parsed)."""
    from redis_txmq.core.entries import decode_topic_entry

    rows, cursor = 0, "-"
    while True:
        batch: Any = client.xrange(TOPIC, cursor, "+", count=LOOP_PAGE)
        for entry_id, fields in batch:
            decode_topic_entry(TOPIC, TOPIC, entry_id, fields)
            rows += 1
        if len(batch) < LOOP_PAGE:
            return rows
        cursor = "(" + batch[-1][0].decode()


def lean_loop(client: redis.Redis) -> int:
    """The least a Python reader can do: a tuple of the raw fields per entry, nothing decoded."""
    rows, cursor = 0, b"-"
    while True:
        batch: Any = client.xrange(TOPIC, cursor, "+", count=LOOP_PAGE)
        rows += len(
            [
                (
                    entry_id,
                    f.get(b"transaction_id"),
                    f.get(b"body"),
                    f.get(b"keys"),
                    f.get(b"tags"),
                    f.get(b"properties"),
                )
                for entry_id, f in batch
            ]
        )
        if len(batch) < LOOP_PAGE:
            return rows
        cursor = b"(" + batch[-1][0]


def spread(ratios: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3), "max": round(max(ratios), 3)}


def measure(redis_url: str, entries: int, rounds: int) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import redis_txmq.spark

    client = redis.Redis.from_url(redis_url)
    fill(client, entries)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    redis_txmq.spark.register(spark)
    df = spark.read.format("redis-txmq").option("redis.url", redis_url).option("topics", TOPIC).load()

    def aggregated() -> int:
        (row,) = df.agg(F.count("*"), F.sum(F.length("body"))).collect()
        assert row[1] == row[0] * len(BODY)
        return int(row[0])

    def noop() -> int:
        df.write.format("noop").mode("overwrite").save()
        return entries

    runs: dict[str, Callable[[], int]] = {
        "spark": aggregated,
        "spark_noop": noop,
        "loop": lambda: python_loop(client),
        "lean": lambda: lean_loop(client),
    }
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        assert run() == entries
    names = list(runs)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            assert runs[name]() == entries
            rates[name].append(entries / (time.perf_counter() - start))
    result: dict[str, Any] = {
        "entries": entries,
        "rounds": rounds,
        "spark_partitions": df.rdd.getNumPartitions(),
        "rows_per_task": df.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect(),
        "plan_ms": plan_ms(redis_url),
        **{f"{name}_rows_per_s": round(statistics.median(rates[name])) for name in names},
        "spark_vs_lean": spread([s / p for s, p in zip(rates["spark"], rates["lean"], strict=True)]),
        "spark_vs_loop": spread([s / p for s, p in zip(rates["spark"], rates["loop"], strict=True)]),
        "noop_vs_lean": spread([s / p for s, p in zip(rates["spark_noop"], rates["lean"], strict=True)]),
    }
    with tempfile.TemporaryDirectory() as checkpoints:
        result["streaming_backlog"] = streaming_backlog(spark, redis_url, entries, checkpoints)
        result["streaming_steady"] = streaming_steady(spark, client, redis_url, checkpoints)
    spark.stop()
    client.delete(TOPIC, STEADY_TOPIC)
    client.close()
    return result


def plan_ms(redis_url: str) -> float:
    """How long the driver takes to plan the batch read (the median of five)."""
    from redis_txmq.spark.options import parse_options
    from redis_txmq.spark.source import BatchReader

    reader = BatchReader(parse_options({"redis.url": redis_url, "topics": TOPIC}, streaming=False))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        reader.partitions()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 1)


def batch_figures(progress: list[Any]) -> dict[str, float]:
    """Medians over the micro-batches that read something."""
    batches = [p for p in progress if p["numInputRows"]]
    return {
        "micro_batches": len(batches),
        "rows_per_batch": round(statistics.median(p["numInputRows"] for p in batches)),
        "processed_rows_per_s": round(statistics.median(p["processedRowsPerSecond"] for p in batches)),
        "trigger_execution_ms": round(statistics.median(p["durationMs"]["triggerExecution"] for p in batches)),
        "add_batch_ms": round(statistics.median(p["durationMs"]["addBatch"] for p in batches)),
    }


def stream(spark: Any, redis_url: str, topic: str, checkpoint: str, **options: str) -> Any:
    reader = spark.readStream.format("redis-txmq").option("redis.url", redis_url).option("topics", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)


def streaming_backlog(spark: Any, redis_url: str, entries: int, checkpoints: str) -> dict[str, float]:
    """The filled topic read from its start in micro-batches of a tenth of it."""
    per_trigger = max(1, entries // 10)
    writer = stream(
        spark, redis_url, TOPIC, os.path.join(checkpoints, "backlog"), maxEntriesPerTrigger=str(per_trigger)
    )
    start = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    progress = query.recentProgress
    read = sum(p["numInputRows"] for p in progress)
    assert read == entries, f"the streaming query read {read} of {entries} entries"
    return {"rows_per_s": round(entries / elapsed), "max_entries_per_trigger": per_trigger, **batch_figures(progress)}


def streaming_steady(
    spark: Any, client: redis.Redis, redis_url: str, checkpoints: str, rate: int = 20_000, seconds: float = 15.0
) -> dict[str, float]:
    """``rate`` entries a second added for ``seconds`` while a query reads them as they come."""
    fill(client, 1, STEADY_TOPIC)  # the topic must exist when the query starts
    done = threading.Event()
    added = [1]

    def produce() -> None:
        tick, start = 0.05, time.perf_counter()
        while time.perf_counter() - start < seconds:
            due = int((time.perf_counter() - start) * rate) + 1 - added[0]
            if due > 0:
                pipe = client.pipeline(transaction=False)
                for i in range(added[0], added[0] + due):
                    pipe.xadd(STEADY_TOPIC, entry(i))
                pipe.execute()
                added[0] += due
            time.sleep(tick)
        done.set()

    query = stream(spark, redis_url, STEADY_TOPIC, os.path.join(checkpoints, "steady")).start()
    producer = threading.Thread(target=produce, name="steady-producer")
    producer.start()
    done.wait()
    producer.join()
    deadline = time.monotonic() + 120
    while sum(p["numInputRows"] for p in query.recentProgress) < added[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()
    progress = query.recentProgress
    read = sum(p["numInputRows"] for p in progress)
    assert read == added[0], f"the streaming query read {read} of {added[0]} entries"
    return {"added_per_s": rate, "entries": added[0], **batch_figures(progress)}


def run(measure: Callable[..., dict[str, Any]], redis_url: str | None, **options: Any) -> dict[str, Any]:
    """``measure(url, **options)`` on ``redis_url``, or on a redis-server of its own."""
    if redis_url:
        return measure(redis_url, **options)
    with EmbeddedRedis() as server:
        return measure(server.url, **options)


def run_and_print(measure: Callable[..., dict[str, float]], redis_url: str | None, **options: Any) -> None:
    """Run ``measure(url, **options)`` on ``redis_url``, or on a redis-server of its own; print each figure."""
    for name, value in run(measure, redis_url, **options).items():
        print(f"{name:>16}: {value:,.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--entries", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    result = run(measure, options.redis_url, entries=options.entries, rounds=options.rounds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
