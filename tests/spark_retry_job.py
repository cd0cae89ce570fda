"""A Spark job in local[2,3] whose tasks fail on their first attempt after staging rows:
``python -m tests.spark_retry_job REDIS_URL``. Writes 400 rows to topic ``retried``; prints how many first
attempts failed (counted in Redis, since the attempts run in Spark's Python workers)."""

from __future__ import annotations

import sys


def main() -> None:
    redis_url = sys.argv[1]
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, udf

    import redis_txmq.spark

    spark = (
        SparkSession.builder.master("local[2,3]")
        .appName("redis-txmq-retries")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    redis_txmq.spark.register(spark)

    @udf("string")
    def fail_first_attempts(body: str) -> str:
        context = TaskContext.get()
        if context.attemptNumber() == 0 and context.partitionId() % 2 == 0 and body.endswith("0"):
            import redis

            redis.Redis.from_url(redis_url).incr("test:failed-attempts")
            raise RuntimeError("the first attempt of this task fails")
        return body

    rows = spark.range(400).selectExpr("concat('row ', id) as body").repartition(4)
    (
        rows.select(fail_first_attempts(col("body")).alias("body"))
        .write.format("redis-txmq")
        .option("redis.url", redis_url)
        .option("topic", "retried")
        .option("writeBatchSize", "7")
        .mode("append")
        .save()
    )
    import redis

    client = redis.Redis.from_url(redis_url)
    print(f"failed first attempts: {int(client.get('test:failed-attempts') or 0)}")
    spark.stop()


if __name__ == "__main__":
    main()
