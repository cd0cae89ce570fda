"""Order events per minute: read the committed ``orders`` topic, parse the JSON body, aggregate, write Parquet.

    python examples/order_events_job.py --redis-url redis://localhost:6379/0 --output /tmp/order-stats
    spark-submit examples/order_events_job.py --redis-url ... --output ...      # the same job, submitted
    python examples/order_events_job.py ... --stream --checkpoint /tmp/order-stats-checkpoint
    python examples/order_events_job.py ... --publish order-stats    # also publish the summary as messages

Batch by default: the per-minute summary goes to ``--output``. With ``--stream`` it runs as Structured Streaming
with Trigger.AvailableNow and appends the parsed orders to the Parquet table at ``--output``: a second run with the
same checkpoint adds only what was committed since, each order once; the summary is then computed from that table.
With ``--publish TOPIC`` the per-minute summary is also published to that topic with the ``redis-txmq`` writer:
every minute's row once, or none if the job fails; any consumer (``redis_txmq.Consumer``) reads them.
Run ``txmq demo --redis-url ...`` first for some data. ``spark_connector.register`` runs a local session's Python
workers on this interpreter; on a cluster, point ``PYSPARK_PYTHON`` (or ``spark.pyspark.python``) at an interpreter
of the executors that has ``redis-txmq[spark]``.
"""

from __future__ import annotations

import argparse
import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import redis_txmq.spark

ORDER_SCHEMA = "order_id long, amount double, customer string"


def parse(orders: DataFrame) -> DataFrame:
    """One row per committed order: the entry id, its commit time and the JSON body's fields."""
    return orders.select("id", "timestamp", F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o")).select(
        "id", "timestamp", "o.order_id", "o.amount", "o.customer"
    )


def per_minute(orders: DataFrame) -> DataFrame:
    """Orders and revenue per minute of commit time."""
    return (
        orders.groupBy(F.window("timestamp", "1 minute").start.alias("minute"))
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
        .orderBy("minute")
    )


def publish(summary: DataFrame, redis_url: str, topic: str) -> None:
    """The summary as messages of ``topic``, exactly once: the minute is the key, the row its JSON body."""
    (
        summary.select(
            F.to_json(F.struct("minute", "orders", "revenue")).alias("body"),
            F.date_format("minute", "yyyy-MM-dd'T'HH:mm").alias("keys"),
            F.create_map(F.lit("source"), F.lit("order-events-per-minute")).alias("properties"),
        )
        .write.format("redis-txmq")
        .option("redis.url", redis_url)
        .option("topic", topic)
        .mode("append")
        .save()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("TXMQ_REDIS_URL", "redis://localhost:6379/0"))
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--output", required=True, help="Parquet folder")
    parser.add_argument("--stream", action="store_true", help="Structured Streaming, Trigger.AvailableNow")
    parser.add_argument("--checkpoint", help="checkpoint folder (with --stream)")
    parser.add_argument("--publish", metavar="TOPIC", help="also publish the per-minute summary to this topic")
    options = parser.parse_args()

    spark = SparkSession.builder.appName("order-events-per-minute").getOrCreate()
    redis_txmq.spark.register(spark)
    source = spark.readStream if options.stream else spark.read
    orders = parse(
        source.format("redis-txmq").option("redis.url", options.redis_url).option("topics", options.topic).load()
    )
    if not options.stream:
        per_minute(orders).write.mode("overwrite").parquet(options.output)
        summary = spark.read.parquet(options.output)
    else:
        if not options.checkpoint:
            parser.error("--stream needs --checkpoint")
        # Exactly once into a Parquet table of orders; the per-minute summary is a batch query over it.
        query = (
            orders.writeStream.format("parquet")
            .option("path", options.output)
            .option("checkpointLocation", options.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        summary = per_minute(spark.read.parquet(options.output))
    summary.show(truncate=False)
    if options.publish:
        publish(summary, options.redis_url, options.publish)
    spark.stop()


if __name__ == "__main__":
    main()
