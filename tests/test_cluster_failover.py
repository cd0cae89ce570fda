"""A Redis Cluster with one replica per master through failovers: ``CLUSTER FAILOVER`` (coordinated, the replica
takes over once in sync) and a master SIGKILLed (the replica is elected after the node timeout; the killed node
returns as its replica). Producers, a checker and consumers run through it on topics spread over every master;
the topic streams are then compared with ground truth as in the Sentinel tests (:func:`tests.failover.judge`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from redis_txmq import Settings
from redis_txmq.core.keys import topic_stream_key
from redis_txmq.transport.embedded import LocalCluster

from .failover import FAST, Run, appended, dead_lettered, judge
from .helpers import wait_through_errors

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(600)]

NODE_TIMEOUT_MS = 2000
ACKED_BEFORE, ACKED_AFTER = 150, 150


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """Three masters with a replica each, for one test (a failover changes it for good)."""
    built = LocalCluster(masters=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS).start()
    try:
        yield built
    finally:
        built.stop()


def topic_on_each_master(client: RedisCluster) -> list[str]:
    """One topic name whose stream lives on each master."""
    topics: dict[str, str] = {}
    for i in range(10_000):
        name = f"orders-{i}"
        topics.setdefault(client.get_node_from_key(topic_stream_key(name)).name, name)
        if len(topics) == len(client.get_primaries()):
            return sorted(topics.values())
    raise AssertionError("no topic for every master")


def roles(port: int) -> str:
    with redis.Redis(port=port) as node:
        return str(node.info("replication")["role"])


def replica_of(cluster: LocalCluster, master_port: int) -> int:
    with redis.Redis(port=master_port) as master:
        info = master.info("replication")
    (replica,) = [int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return replica


def in_sync(port: int) -> bool:
    with redis.Redis(port=port) as node:
        info = node.info("replication")
        return info.get("master_link_status") == "up" and b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO")


@pytest.mark.parametrize("fault", ["cluster_failover", "kill_master"])
@pytest.mark.parametrize("durability", ["replica", "master"])
def test_a_cluster_failover_loses_no_acknowledged_commit_at_durability_replica(
    cluster: LocalCluster, durability: str, fault: str, report: list[str]
) -> None:
    client = RedisCluster.from_url(cluster.url)
    topics = topic_on_each_master(client)
    victim = client.get_node_from_key(topic_stream_key(topics[0])).port
    successor = replica_of(cluster, victim)
    settings = Settings(redis_url=cluster.url, cluster=True, durability=durability, **FAST)  # type: ignore[arg-type]
    run = Run(settings, topics)
    run.start()
    try:
        run.wait_for_acks(ACKED_BEFORE, "before the failover")
        began = time.monotonic()
        if fault == "cluster_failover":
            with redis.Redis(port=successor) as replica:
                replica.execute_command("CLUSTER", "FAILOVER")
        else:
            cluster.kill(victim)
        wait_through_errors(lambda: roles(successor) == "master", f"the replica :{successor} to take over", 60)
        if fault == "kill_master":
            cluster.restart(victim)
        wait_through_errors(lambda: in_sync(victim), f"the old master :{victim} to replicate :{successor}", 60)
        recovered = time.monotonic() - began
        run.wait_for_acks(run.acked_count() + ACKED_AFTER, "after the failover")
        run.stop_sending.set()

        run.settle(client, lambda: set(appended(client, topics)))
        visible = appended(client, topics)
        dead = dead_lettered(client, topics)
    finally:
        run.stop()
        client.close()
    what = f"cluster {fault}, durability {durability}, :{successor} took over :{victim} in {recovered:.1f} s"
    report.append(judge(run, visible, durability, what, dead))


def test_the_asyncio_producer_confirms_on_the_master_that_ran_each_script(cluster: LocalCluster) -> None:
    import asyncio
    import os
    import signal

    from redis_txmq import LocalTransactionState, Message, PrepareError
    from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer

    client = RedisCluster.from_url(cluster.url)
    topics = topic_on_each_master(client)
    stopped_master = client.get_node_from_key(topic_stream_key(topics[0])).port
    stopped = cluster.processes[replica_of(cluster, stopped_master)]
    client.close()
    settings = Settings(redis_url=cluster.url, cluster=True, durability="replica", durability_timeout=0.3)

    async def sends() -> list[str]:
        commit = LocalTransactionState.COMMIT
        async with AsyncTransactionProducer("durable", checker=lambda m: commit, settings=settings) as producer:
            sent = []
            for topic in topics:  # one on each master, each confirmed by that master's replica
                async with producer.transaction(Message(topic, b"confirmed")) as tx:
                    pass
                assert tx.result is not None and tx.result.end_error is None, tx.result
                sent.append(tx.transaction_id)
            os.kill(stopped.pid, signal.SIGSTOP)
            try:
                with pytest.raises(PrepareError, match=r"0 of 1 replica"):
                    async with producer.transaction(Message(topics[0], b"refused")):
                        raise AssertionError("ran without a confirmed prepare")
                async with producer.transaction(Message(topics[1], b"another master")) as other:
                    pass  # its master's replica is running: confirmed
                assert other.result is not None and other.result.end_error is None
            finally:
                os.kill(stopped.pid, signal.SIGCONT)
            return sent

    sent = asyncio.run(sends())
    client = RedisCluster.from_url(cluster.url)
    try:
        for topic, transaction_id in zip(topics, sent, strict=True):
            (entry,) = client.xrange(topic_stream_key(topic), count=1)
            assert entry[1][b"transaction_id"].decode() == transaction_id
    finally:
        client.close()
