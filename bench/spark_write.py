"""Rows per second of a Spark batch write (local[2]) to a topic, against a plain pipelined XADD of the same rows from
one process.

    python -m bench.spark_write [--redis-url URL] [--rows 200000] [--rounds 3]

Each round writes ``rows`` rows (a body of 60 bytes, a key, a properties map) with ``df.write.format("redis-txmq")``
— staged by the tasks, decided, published exactly once — and the same rows with ``XADD`` in pipelines of 1,000
from this process (the rows already built as Python tuples), in alternating order; the figure is the median of the
per-round ratios. The DataFrame is cached, and one untimed round of each goes first (Spark starts its Python
workers on the first write), so a round times the write, not its source or the start-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import redis

from .spark_read import run_and_print

TOPIC = "bench-spark-write"
PLAIN = "bench-spark-write-plain"


def plain_xadd(client: redis.Redis, rows: list[tuple[bytes, str, str]]) -> None:
    for start in range(0, len(rows), 1000):
        pipe = client.pipeline(transaction=False)
        for body, keys, properties in rows[start : start + 1000]:
            pipe.execute_command("XADD", PLAIN, "*", "body", body, "keys", keys, "properties", properties)
        pipe.execute()


def measure(redis_url: str, rows: int, rounds: int) -> dict[str, float]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import redis_txmq.spark

    client = redis.Redis.from_url(redis_url)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    redis_txmq.spark.register(spark)
    df = spark.range(rows).selectExpr(
        'concat(\'{"order_id": \', id, \', "amount": 42.5, "customer": "someone"}\') as body',
        "concat('order-', id) as keys",
        "map('source', 'bench') as properties",
    )
    df = df.repartition(2).cache()
    df.count()
    built = [
        (b'{"order_id": %d, "amount": 42.5, "customer": "someone"}' % i, f"order-{i}", '{"source":"bench"}')
        for i in range(rows)
    ]
    spark_rates, plain_rates = [], []

    def spark_round() -> None:
        client.delete(TOPIC)
        start = time.perf_counter()
        df.write.format("redis-txmq").option("redis.url", redis_url).option("topic", TOPIC).mode("append").save()
        spark_rates.append(rows / (time.perf_counter() - start))
        assert client.xlen(TOPIC) == rows

    def plain_round() -> None:
        client.delete(PLAIN)
        start = time.perf_counter()
        plain_xadd(client, built)
        plain_rates.append(rows / (time.perf_counter() - start))

    spark_round()  # warm-up: Spark starts its Python workers on the first write
    plain_round()
    spark_rates.clear()
    plain_rates.clear()
    for i in range(rounds):
        for run in (spark_round, plain_round) if i % 2 == 0 else (plain_round, spark_round):
            run()
    spark.stop()
    client.delete(TOPIC, PLAIN)
    client.close()
    ratios = [s / p for s, p in zip(spark_rates, plain_rates, strict=True)]
    return {
        "rows": rows,
        "spark_rows_per_s": statistics.median(spark_rates),
        "xadd_rows_per_s": statistics.median(plain_rates),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    run_and_print(measure, options.redis_url, rows=options.rows, rounds=options.rounds)


if __name__ == "__main__":
    main()
