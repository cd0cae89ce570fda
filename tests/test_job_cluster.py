"""Write jobs on a Redis Cluster: the Spark writer's task and driver code (``redis_txmq.spark.writer``, run here
without Spark) against faults of a cluster: a stage write whose reply is lost and that redis-py sends again, a master
down (the one of the job registry, or one holding none of the job's keys) on a cluster whose scripts were never
loaded."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
import redis
import redis.cluster as redis_cluster
from redis.cluster import RedisCluster

from redis_txmq import create_topic
from redis_txmq.core.keys import JOB_REGISTRY, JobKeys, TopicKeys, topic_meta_key
from redis_txmq.jobs import WriteJob

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # the tasks and drivers are the Spark writer's code (no SparkSession)
    pytest.importorskip("pyspark", reason="the writer's code needs the spark extra: pip install -e '.[spark,dev]'")

import pyarrow as pa  # noqa: E402
from pyspark.sql.types import StringType, StructField, StructType  # noqa: E402

from redis_txmq.spark.writer import parse_write_options, write_rows  # noqa: E402

from .test_cluster_master_down import OneMasterDown, one_master_down_of  # noqa: E402

pytestmark = pytest.mark.real


def writer_options(url: str, topic: str, **extra: str) -> Any:
    schema = StructType([StructField("body", StringType())])
    given = {"redis.url": url, "redis.cluster": "true", "topic": topic, **extra}
    return parse_write_options(given, schema, streaming=False)


def task(options: Any, keys: JobKeys, rows: list[str]) -> Any:
    """One task attempt of the writer (no Spark task: partition 0)."""
    return write_rows(options, keys, iter([pa.RecordBatch.from_pydict({"body": rows})]))


def bodies(client: Any, stream: str) -> list[str]:
    return [fields[b"body"].decode() for _, fields in client.xrange(stream)]


def test_a_stage_write_sent_again_after_its_reply_was_lost_stages_its_rows_once(cluster_url, monkeypatch):
    """At durability master the stage writes go through redis-py's cluster pipeline, which sends a command again
    when the connection dropped before its reply: the server had run the XADDs. Each stage entry has its counted
    id, so the repeat is refused and taken as written: the stage holds each row once, and the commit publishes each
    once (it used to publish 10 rows of 5, then park the job)."""
    lost = {"replies": 1}
    real_read = redis_cluster.NodeCommands.read

    def read(self: Any) -> None:
        real_read(self)  # the server ran the commands and answered
        if lost["replies"] and any(c.args[0] == "XADD" and ":stage:" in str(c.args[1]) for c in self.commands):
            lost["replies"] -= 1
            self.connection.disconnect()
            for command in self.commands:
                command.result = redis.ConnectionError("connection reset before the replies arrived")

    monkeypatch.setattr(redis_cluster.NodeCommands, "read", read)
    client = RedisCluster.from_url(cluster_url)
    topic = f"dup-{uuid.uuid4().hex[:8]}"
    try:
        create_topic(client, topic, 1)
        keys = JobKeys(uuid.uuid4().hex)
        staged = task(writer_options(cluster_url, topic), keys, [f"row-{n}" for n in range(5)])
        assert lost["replies"] == 0, "a reply was lost, and the writes sent again"
        assert staged.rows == 5 and client.xlen(staged.stages[0]) == 1, "one entry of 5 rows, not two"
        job = WriteJob(client, keys)
        try:
            job.commit(staged.counts)
        finally:
            job.close()
        assert bodies(client, TopicKeys(topic).topic_stream) == [f"row-{n}" for n in range(5)]
    finally:
        client.close()


def _on_healthy(down: OneMasterDown, make: Any) -> Any:
    """The first of ``make(i)`` whose keys are all on healthy masters (``make`` returns (value, keys))."""
    for i in range(1000):
        value, keys = make(i)
        if not any(down.on_victim(key) for key in keys):
            return value
    raise AssertionError("no such name")


@pytest.mark.slow
@pytest.mark.parametrize("down_master", ["registry", "other"])
def test_a_write_job_on_healthy_masters_runs_while_one_master_is_down(down_master):
    """One master of the cluster is down: the one of the job registry (``txmq:jobs``), or one holding none of the
    job's keys on a cluster whose scripts were never loaded (a new cluster, a restart, a failover). A job whose
    record, stages and topic stream live on the healthy masters is staged, committed and published: the listing is
    best effort (a live driver settles its own job), and each script is loaded on its key's own master. Both used
    to fail every job ("could not list"; redis-py loading the scripts on every master)."""
    with one_master_down_of(JOB_REGISTRY if down_master == "registry" else None) as down:
        client = down.cluster
        topic = _on_healthy(down, lambda i: (f"up-{i}", [TopicKeys(f"up-{i}").topic_stream, topic_meta_key(f"up-{i}")]))
        create_topic(client, topic, 1)
        keys = _on_healthy(down, lambda i: (JobKeys(f"{i:032x}"), [JobKeys(f"{i:032x}").decision]))
        if down_master == "other":  # the scripts were never loaded
            for node in client.get_primaries():
                client.execute_command("SCRIPT FLUSH", target_nodes=node)
        else:  # a first job while every master is up: the scripts are loaded everywhere
            first = JobKeys(uuid.uuid4().hex)
            job = WriteJob(client, first)
            try:
                job.commit(task(writer_options(down.url, topic), first, ["w0"]).counts)
            finally:
                job.close()
            client.delete(TopicKeys(topic).topic_stream)
        down.goes_down()
        survivors = RedisCluster.from_url(down.url)
        try:
            staged = task(writer_options(down.url, topic), keys, ["x0", "x1"])
            job = WriteJob(survivors, keys)
            try:
                assert job.commit(staged.counts).status == "DECIDED"
            finally:
                job.close()
            assert bodies(survivors, TopicKeys(topic).topic_stream) == ["x0", "x1"]
            assert not survivors.exists(*staged.stages)
        finally:
            survivors.close()
