"""Rows per second of a Spark batch read (local[2]) of a topic stream, against a plain Python XRANGE loop.

    python -m bench.spark_read [--redis-url URL] [--entries 1000000] [--rounds 2]

Fills a topic stream with ``entries`` entries in the committed-entry format (transaction_id, body, keys,
properties) by pipelined XADD, then alternates a Spark read of every column (written to the ``noop`` sink) and a
Python loop of XRANGE calls (1000 entries each) that decodes every entry into a row tuple.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

import redis

from redis_txmq.embedded import EmbeddedRedis

TOPIC = "bench-spark-read"


def fill(client: redis.Redis, entries: int) -> None:
    client.delete(TOPIC)
    body = b'{"order_id": 123456, "amount": 42.5, "customer": "someone"}'
    for start in range(0, entries, 10_000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(entries, start + 10_000)):
            pipe.xadd(
                TOPIC,
                {
                    "transaction_id": uuid.uuid4().hex,
                    "body": body,
                    "keys": f"order-{i}",
                    "properties": '{"source":"bench"}',
                },
            )
        pipe.execute()


def python_loop(client: redis.Redis) -> int:
    from redis_txmq.entries import decode_topic_entry

    rows, cursor = 0, "-"
    while True:
        batch = client.xrange(TOPIC, cursor, "+", count=1000)
        for entry_id, fields in batch:
            decode_topic_entry(TOPIC, TOPIC, entry_id, fields)
            rows += 1
        if len(batch) < 1000:
            return rows
        cursor = "(" + batch[-1][0].decode()


def measure(redis_url: str, entries: int, rounds: int) -> dict[str, float]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import spark_connector

    client = redis.Redis.from_url(redis_url)
    fill(client, entries)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    df = spark.read.format("redis-txmq").option("redis.url", redis_url).option("topics", TOPIC).load()
    spark_rates, loop_rates = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        spark_rates.append(entries / (time.perf_counter() - start))
        start = time.perf_counter()
        assert python_loop(client) == entries
        loop_rates.append(entries / (time.perf_counter() - start))
    partitions = df.rdd.getNumPartitions()
    spark.stop()
    client.delete(TOPIC)
    client.close()
    return {
        "entries": entries,
        "spark_partitions": partitions,
        "spark_rows_per_s": statistics.median(spark_rates),
        "xrange_rows_per_s": statistics.median(loop_rates),
        "ratio": statistics.median(s / p for s, p in zip(spark_rates, loop_rates, strict=True)),
    }


def run_and_print(measure, redis_url: str | None, **options) -> None:
    """Run ``measure(url, **options)`` on ``redis_url``, or on a redis-server of its own; print each figure."""
    if redis_url:
        result = measure(redis_url, **options)
    else:
        with EmbeddedRedis() as server:
            result = measure(server.url, **options)
    for name, value in result.items():
        print(f"{name:>16}: {value:,.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    run_and_print(measure, options.redis_url, entries=options.entries, rounds=options.rounds)


if __name__ == "__main__":
    main()
