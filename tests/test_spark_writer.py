"""The redis-txmq Spark writer on a real Redis with Spark local[2]: a job's rows reach their topics exactly once,
or never; failed task attempts and replayed micro-batches publish nothing; no stage is left behind."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # CI sets it: there, a missing pyspark fails instead of skipping
    pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark,dev]'")

from redis_txmq import Settings, create_topic  # noqa: E402
from redis_txmq.core.keys import JOB_REGISTRY, JobKeys  # noqa: E402
from redis_txmq.jobs import JobNotCommittedError, settle_jobs  # noqa: E402
from redis_txmq.spark.options import SparkSourceError  # noqa: E402

from .helpers import wait_until  # noqa: E402
from .replicas import replicated_fixture  # noqa: E402, F401 - the fixture 'replicated'

ROOT = Path(__file__).resolve().parent.parent


def bodies(client, *streams: str) -> collections.Counter:
    return collections.Counter(f[b"body"].decode() for s in streams for _, f in client.xrange(s))


def stages_left(client) -> list[bytes]:
    return list(client.scan_iter(match="txmq:*:stage:*")) + list(client.scan_iter(match="txmq:job:*:stages"))


def test_a_batch_write_publishes_every_row_once(spark, real_client, redis_url):
    create_topic(real_client, "audit", 2)
    rows = [(f"order {n}", f"order-{n}", "orders" if n % 3 else "audit", {"n": str(n)}) for n in range(600)]
    df = spark.createDataFrame(rows, "body string, keys string, topic string, properties map<string,string>")
    df.repartition(3).write.format("redis-txmq").option("redis.url", redis_url).mode("append").save()
    seen = bodies(real_client, "orders", "audit#0", "audit#1")
    assert seen == {f"order {n}": 1 for n in range(600)}
    audit = [f for s in ("audit#0", "audit#1") for _, f in real_client.xrange(s)]
    assert len(audit) == 200 and all(f[b"properties"].startswith(b'{"n":') for f in audit)
    ids = [f[b"transaction_id"].decode() for _, f in real_client.xrange("orders")]
    assert len(set(ids)) == 400, "each row has its own transaction id"
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


def test_a_job_whose_task_fails_publishes_nothing_and_leaves_nothing(spark, real_client, redis_url):
    from pyspark.sql.functions import col, udf

    @udf("string")
    def fail_late(body):
        if body == "row 299":
            raise ValueError("a bad row")
        return body

    # one task, which writes 299 rows in pipelines of 10 before it fails: with two, Spark would cancel the other
    # one, whose Python worker may go on writing after this test (the job's decision refuses it then, see
    # test_jobs; a later test's FLUSHALL would have erased that decision)
    df = spark.range(300).selectExpr("concat('row ', id) as body").repartition(1)
    with pytest.raises(Exception, match="a bad row"):
        (
            df.select(fail_late(col("body")).alias("body"))
            .write.format("redis-txmq")
            .option("redis.url", redis_url)
            .option("topic", "orders")
            .option("writeBatchSize", "10")
            .mode("append")
            .save()
        )
    assert real_client.xlen("orders") == 0
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


def test_at_level_replica_stage_writes_are_confirmed_or_the_job_publishes_nothing(spark, replicated):
    """With ``durability`` replica each pipeline of stage writes waits for the replicas: one replica confirms
    them; asking for two (only one is attached) fails the task, the job rolls back and leaves nothing behind."""
    import redis

    url, _ = replicated
    df = spark.range(300).selectExpr("concat('row ', id) as body").repartition(1)  # one task: none is cancelled

    def write(replicas: int) -> None:
        (
            df.write.format("redis-txmq")
            .option("redis.url", url)
            .option("topic", "orders")
            .option("durability", "replica")
            .option("durability.replicas", str(replicas))
            .option("durability.timeout", "0.2")
            .mode("append")
            .save()
        )

    write(1)
    with redis.Redis.from_url(url) as client:
        assert bodies(client, "orders") == {f"row {n}": 1 for n in range(300)}
        with pytest.raises(Exception, match=r"stage writes not confirmed as durable \(replica\): 1 of 2 replica"):
            write(2)
        assert client.xlen("orders") == 300
        assert stages_left(client) == [] and client.zcard(JOB_REGISTRY) == 0


@pytest.mark.parametrize(
    "source, published",
    [("CommitFailsBeforeDeciding", 0), ("CommitDiesAfterDeciding", 400)],
)
def test_a_job_whose_driver_fails_after_its_tasks_wrote_publishes_each_row_once_or_none(
    spark, real_client, redis_url, source, published
):
    """The tasks wrote their stages, then the driver's commit fails: before deciding, Spark's abort rolls the job
    back; right after writing the decision (its process exits), the abort finds the COMMIT that stands and
    publishes it. Either way each row once or none, and nothing left."""
    from . import spark_driver_failures

    spark.dataSource.register(getattr(spark_driver_failures, source))
    df = spark.range(400).selectExpr("concat('row ', id) as body").repartition(2)
    with pytest.raises(Exception):  # noqa: B017 - Spark wraps the driver's error in its own
        df.write.format(source_name(spark_driver_failures, source)).option("redis.url", redis_url).option(
            "topic", "orders"
        ).mode("append").save()
    assert bodies(real_client, "orders") == {f"row {n}": 1 for n in range(published)}
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


def source_name(module, source: str) -> str:
    return getattr(module, source).name()


@pytest.mark.slow
def test_on_a_cluster_each_master_confirms_the_stage_writes_it_took(spark):
    """Three masters with a replica each, a topic on each: at durability replica every master's share of the stage
    writes is confirmed by its own replica; asking for two replicas fails the job, which leaves nothing."""
    import redis
    from redis.cluster import RedisCluster

    from redis_txmq.core.keys import topic_stream_key
    from redis_txmq.transport.embedded import LocalCluster

    cluster = LocalCluster(masters=3, replicas=1).start()
    client = RedisCluster.from_url(cluster.url)
    try:
        topics: dict[str, str] = {}
        for i in range(10_000):
            topics.setdefault(client.get_node_from_key(topic_stream_key(f"t{i}")).name, f"t{i}")
            if len(topics) == 3:
                break
        names = sorted(topics.values())
        df = spark.createDataFrame([(f"row {n}", names[n % 3]) for n in range(300)], "body string, topic string")

        def write(replicas: int, timeout: str) -> None:
            (
                df.repartition(1)
                .write.format("redis-txmq")
                .option("redis.url", cluster.url)
                .option("redis.cluster", "true")
                .option("durability", "replica")
                .option("durability.replicas", str(replicas))
                .option("durability.timeout", timeout)
                .mode("append")
                .save()
            )

        write(1, "5")
        for i, topic in enumerate(names):
            assert bodies(client, topic) == {f"row {n}": 1 for n in range(i, 300, 3)}
        with pytest.raises(Exception, match=r"stage writes not confirmed as durable \(replica\): 1 of 2 replica"):
            write(2, "0.2")
        assert sum(client.xlen(topic) for topic in names) == 300
        for port in cluster.ports[:3]:
            with redis.Redis(port=port) as master:
                assert stages_left(master) == []
        assert client.zcard(JOB_REGISTRY) == 0
    finally:
        client.close()
        cluster.stop()


def test_a_write_without_a_body_or_a_topic_is_refused(spark, redis_url):
    df = spark.createDataFrame([("x",)], "payload string")
    with pytest.raises(Exception, match="body"):
        df.write.format("redis-txmq").option("redis.url", redis_url).option("topic", "orders").mode("append").save()
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="topic"):
        df.write.format("redis-txmq").option("redis.url", redis_url).mode("append").save()


def test_a_write_can_only_append(spark, redis_url):
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="cannot overwrite"):
        df.write.format("redis-txmq").option("redis.url", redis_url).option("topic", "orders").mode("overwrite").save()


def test_write_options_are_checked_on_the_driver():
    from pyspark.sql.types import StringType, StructField, StructType

    from redis_txmq.core.durability import Durability
    from redis_txmq.spark.writer import parse_write_options

    schema = StructType([StructField("body", StringType())])
    with pytest.raises(SparkSourceError, match="sinkId"):
        parse_write_options({"topic": "orders"}, schema, streaming=True)
    with pytest.raises(SparkSourceError, match="unknown option"):
        parse_write_options({"topic": "orders", "topics": "x"}, schema, streaming=False)
    options = parse_write_options({"topic": "orders", "sinkId": "s1", "redis.password": "pw"}, schema, True)
    assert options.sink_id == "s1" and "pw" not in repr(options)
    with pytest.raises(SparkSourceError, match="durability must be one of"):
        parse_write_options({"topic": "orders", "durability": "disk"}, schema, streaming=False)
    durable = parse_write_options({"topic": "orders", "durability": "aof", "durability.timeout": "2"}, schema, False)
    assert durable.settings.durability_level() == Durability("aof", 0, 2.0)


def stream_copy(spark, redis_url, checkpoint, sink="redis-txmq", **options):
    source = (
        spark.readStream.format("redis-txmq")
        .option("redis.url", redis_url)
        .option("topics", "source")
        .option("maxEntriesPerTrigger", "40")
        .load()
        .selectExpr("body", "keys")
    )
    writer = (
        source.writeStream.format(sink)
        .option("redis.url", redis_url)
        .option("topic", "copies")
        .option("sinkId", "copier")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    query.awaitTermination(120)
    return query


def test_a_streaming_write_is_exactly_once_across_a_restart_that_replays_a_batch(
    spark, real_client, redis_url, tmp_path
):
    """A query killed between the sink's commit and the checkpoint's: the restart runs that micro-batch again, and
    the sink recognises it (its decision, kept under the sinkId) and publishes nothing new."""
    pipe = real_client.pipeline(transaction=False)
    for n in range(100):
        pipe.xadd("source", {"transaction_id": f"t{n}", "body": f"row {n}", "keys": f"k{n}"})
    pipe.execute()
    checkpoint = tmp_path / "checkpoint"
    stream_copy(spark, redis_url, str(checkpoint))
    assert bodies(real_client, "copies") == {f"row {n}": 1 for n in range(100)}
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()  # the sink committed batch `last`, the checkpoint never recorded it
    for crc in (checkpoint / "commits").glob(f".{last}.crc"):
        crc.unlink()
    stream_copy(spark, redis_url, str(checkpoint))
    assert bodies(real_client, "copies") == {f"row {n}": 1 for n in range(100)}, "the replayed batch is not republished"
    pipe = real_client.pipeline(transaction=False)
    for n in range(100, 130):
        pipe.xadd("source", {"transaction_id": f"t{n}", "body": f"row {n}", "keys": f"k{n}"})
    pipe.execute()
    stream_copy(spark, redis_url, str(checkpoint))
    assert bodies(real_client, "copies") == {f"row {n}": 1 for n in range(130)}
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


@pytest.mark.slow
def test_task_retries_in_local_2_3_publish_each_row_once(real_client, redis_url):
    """Spark local[2,3]: the first attempt of every other task fails after staging some rows; the job commits the
    retries' stages only (``tests/spark_retry_job.py`` runs its own SparkSession)."""
    job = subprocess.run(
        [sys.executable, "-m", "tests.spark_retry_job", redis_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert "failed first attempts: " in job.stdout and "failed first attempts: 0" not in job.stdout, job.stdout
    assert bodies(real_client, "retried") == {f"row {n}": 1 for n in range(400)}
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


def test_the_example_pipeline_publishes_its_summary_and_a_consumer_reads_it(spark, real_client, redis_url):
    import importlib.util
    import json

    from redis_txmq import Consumer, Message, TransactionProducer

    path = ROOT / "examples" / "order_events_job.py"
    spec = importlib.util.spec_from_file_location("order_events_job", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    with TransactionProducer("shop", checker=lambda m: None, client=real_client) as producer:
        for i in range(3):
            body = json.dumps({"order_id": i, "amount": 10.5, "customer": "c"}).encode()
            with producer.transaction(Message("orders", body)):
                pass
    orders = job.parse(spark.read.format("redis-txmq").option("redis.url", redis_url).option("topics", "orders").load())
    job.publish(job.per_minute(orders), redis_url, "order-stats")
    with Consumer("order-stats", group="dashboard", client=real_client) as consumer:
        read = [json.loads(message.body) for message in consumer.poll(timeout=1.0)]
    assert sum(row["orders"] for row in read) == 3 and sum(row["revenue"] for row in read) == 31.5


def seed_source(client, start: int, end: int) -> None:
    pipe = client.pipeline(transaction=False)
    for n in range(start, end):
        pipe.xadd("source", {"transaction_id": f"t{n}", "body": f"row {n}", "keys": f"k{n}"})
    pipe.execute()


def test_a_micro_batch_whose_commit_raised_after_its_decision_is_published_by_the_abort(
    spark, real_client, redis_url, tmp_path
):
    """Issue 23, defect 3: the sink's commit decides COMMIT and raises; Spark calls abort, which publishes the
    decided rows (it used to delete them, the decision and the sink's last batch staying: rows lost). The query
    fails; restarted, it runs that batch again (its decision stands: nothing new) and goes on."""
    from pyspark.errors import StreamingQueryException

    from . import spark_driver_failures

    spark.dataSource.register(spark_driver_failures.StreamCommitRaisesAfterDeciding)
    seed_source(real_client, 0, 100)
    checkpoint = str(tmp_path / "checkpoint")
    with pytest.raises(StreamingQueryException, match="dropped after the sink decided"):
        stream_copy(spark, redis_url, checkpoint, sink="redis-txmq-stream-commit-raises")
    assert bodies(real_client, "copies") == {f"row {n}": 1 for n in range(40)}, "the first batch, by the abort"
    stream_copy(spark, redis_url, checkpoint)
    assert bodies(real_client, "copies") == {f"row {n}": 1 for n in range(100)}
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


def test_a_batch_job_that_runs_longer_than_its_lease_and_the_checkers_max_age_publishes_every_row(
    spark, real_client, redis_url
):
    """Issue 23, defect 4: a checker with a tiny max_age runs beside a job whose tasks take longer than its lease:
    the tasks renew the lease, the checker leaves the job to its driver, every row is published once (a job older
    than max_age used to be rolled back while Spark reported success). The checker runs while the tasks do: the
    gap between the last task and the driver's commit is Spark's, and a loaded machine may stretch it."""
    import threading
    import time

    import redis
    from pyspark.sql.functions import col, udf

    @udf("string")
    def slow(body):
        time.sleep(0.15)  # the job's own work: 40 rows take each task about 6 s, longer than the 4 s lease
        with redis.Redis.from_url(redis_url) as client:
            client.incr("test:rows-done")
        return body

    checker = Settings(max_age=0.001, transaction_timeout=60)  # decided jobs stay the driver's
    stop = threading.Event()
    rounds = [0]

    def check() -> None:
        while not stop.wait(0.05) and int(real_client.get("test:rows-done") or 0) < 80:
            settle_jobs(real_client, checker)
            rounds[0] += 1

    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    try:
        df = spark.range(80).selectExpr("concat('row ', id) as body").repartition(2)
        (
            df.select(slow(col("body")).alias("body"))
            .write.format("redis-txmq")
            .option("redis.url", redis_url)
            .option("topic", "orders")
            .option("writeBatchSize", "5")
            .option("jobLease", "4")
            .mode("append")
            .save()
        )
    finally:
        stop.set()
        thread.join(timeout=10)
    assert rounds[0] > 10, "the checker ran beside the tasks"
    assert bodies(real_client, "orders") == {f"row {n}": 1 for n in range(80)}
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


def write_options(redis_url: str, streaming: bool, **extra: str):
    from pyspark.sql.types import StringType, StructField, StructType

    from redis_txmq.spark.writer import parse_write_options

    schema = StructType([StructField("body", StringType())])
    given = {"redis.url": redis_url, "topic": "orders", **({"sinkId": "copier"} if streaming else {}), **extra}
    return parse_write_options(given, schema, streaming=streaming)


def task(options, keys: JobKeys, rows: list[str]):
    """One task attempt of the writer, run here (no Spark task: partition 0)."""
    import pyarrow as pa

    from redis_txmq.spark.writer import write_rows

    return write_rows(options, keys, iter([pa.RecordBatch.from_pydict({"body": rows})]))


@pytest.mark.parametrize("then", ["abort", "replay"])
def test_a_micro_batch_decided_commit_is_published_by_the_abort_or_the_replay(real_client, redis_url, then):
    """Issue 23, defect 3, without Spark: the sink's commit raised right after deciding; Spark's abort publishes the
    batch (it used to delete its stages: 0 of 2,500 rows), or, the driver dead, the restarted query's replay does
    (its tasks write nothing: the batch is decided)."""
    from redis_txmq.spark.writer import StreamWriter

    from .spark_driver_failures import _CommitRaisesAfterDeciding

    options = write_options(redis_url, streaming=True)
    keys = JobKeys.of_batch("copier", 4)
    messages = [task(options, keys, [f"row {n}" for n in range(2500)])]
    with pytest.raises(RuntimeError, match="dropped after the sink decided"):
        _CommitRaisesAfterDeciding(options).commit(messages, 4)
    assert real_client.xlen("orders") == 0
    if then == "abort":
        StreamWriter(options).abort(messages, 4)
    else:
        replayed = [task(options, keys, ["a new row"])]
        assert replayed[0].stages == [], "a decided batch's tasks write nothing"
        StreamWriter(options).commit(replayed, 4)
    assert bodies(real_client, "orders") == {f"row {n}": 1 for n in range(2500)}
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0


def test_a_batch_commit_raises_when_the_checker_rolled_the_job_back(real_client, redis_url):
    """Issue 23, defect 4, without Spark: the driver stalled past the job's lease (nothing renewed it); the checker
    rolled the job back; the driver's commit raises, so Spark reports the job failed (it used to return)."""
    from redis_txmq.spark.writer import BatchWriter

    options = write_options(redis_url, streaming=False, jobLease="0.2")
    writer = BatchWriter(options)
    messages = [task(options, writer.keys, ["a", "b"])]
    wait_until(lambda: settle_jobs(real_client, Settings()) == 1)
    with pytest.raises(JobNotCommittedError, match="ROLLBACK stands"):
        writer.commit(messages)
    assert real_client.xlen("orders") == 0
    assert stages_left(real_client) == [] and real_client.zcard(JOB_REGISTRY) == 0
