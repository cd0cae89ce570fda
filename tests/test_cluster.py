"""The same guarantees on a 3-master Redis Cluster: every key a script touches is in one hash slot."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis.cluster import RedisCluster

from redis_txmq import (
    Consumer,
    LocalTransactionState,
    Message,
    Settings,
    TransactionListener,
    TransactionProducer,
    TxMQConnectionError,
)
from redis_txmq.cli import main
from redis_txmq.core.keys import CHECKER_INSTANCES, GroupKeys, TopicKeys

from .helpers import wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
TOPICS = [f"cluster-topic-{i}" for i in range(12)]


class Knows(TransactionListener):
    def __init__(self, committed: set[str]) -> None:
        self.committed = committed

    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        return COMMIT if message.transaction_id in self.committed else ROLLBACK


@pytest.fixture
def cluster(cluster_url):
    client = RedisCluster.from_url(cluster_url)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def test_topics_spread_over_the_slots_of_every_master(cluster):
    slots = {cluster.keyslot(t) for t in TOPICS}
    owners = {cluster.get_node_from_key(t).name for t in TOPICS}
    assert len(slots) == len(TOPICS) and len(owners) == 3
    for topic in TOPICS:
        assert {cluster.keyslot(k) for k in TopicKeys(topic).script_keys()} == {cluster.keyslot(topic)}


def test_one_way_ends_are_batched_per_master_and_applied_once(cluster, make_producer):
    """redis-py's cluster pipeline refuses EVALSHA: the flusher splits a batch by master (the asyncio one sends
    them as concurrent calls)."""
    settings = Settings(cluster=True, end_batch_delay=0.05)
    with make_producer("oneway_cluster", Knows(set()), client=cluster, settings=settings, oneway_end=True) as p:
        results = [
            p.send_message_in_transaction(Message(topic, b"%d" % i), COMMIT if i % 4 else ROLLBACK)
            for i in range(6)
            for topic in TOPICS
        ]
        # every end applied first: a SCRIPT FLUSH landing between a first use's SCRIPT LOAD and its EVALSHA
        # refuses that call twice (redis-py loads once), and the end is left to the checker; this test is about a
        # master that lost scripts it had
        assert p.flush(timeout=30)
        for node in cluster.get_primaries():  # a master that lost its scripts loads them again
            node.redis_connection.script_flush()
        results += [p.send_message_in_transaction(Message(topic, b"late"), COMMIT) for topic in TOPICS]
        assert p.flush(timeout=30)
        assert p._flusher.failed == 0 and p._flusher.applied == len(results)
    for topic in TOPICS:
        expected = {r.transaction_id for r in results if r.topic == topic and r.local_transaction_state is COMMIT}
        seen = collections.Counter(f[b"transaction_id"].decode() for _, f in cluster.xrange(topic))
        assert seen == {tx: 1 for tx in expected}
        assert cluster.hlen(TopicKeys(topic).inflight) == 0


def test_check_back_through_two_txmq_checker_cluster_one_killed(cluster, cluster_url, make_producer):
    settings = Settings(heartbeat_interval=0.5, cluster=True)
    committed: set[str] = set()
    listener = Knows(committed)
    rolled_back = []
    with make_producer("cluster_group", listener, client=cluster, settings=settings) as producer:
        for topic in TOPICS:
            committed.add(producer.send_message_in_transaction(Message(topic, b"commit"), COMMIT).transaction_id)
            rolled_back.append(producer.send_message_in_transaction(Message(topic, b"rollback"), ROLLBACK))
            unknown = producer.send_message_in_transaction(Message(topic, b"checked"), UNKNOWN)
            committed.add(unknown.transaction_id)
            rolled_back.append(producer.send_message_in_transaction(Message(topic, b"checked-out"), UNKNOWN))
        command = [
            str(Path(sys.executable).parent / "txmq"),
            "checker",
            "--cluster",
            "--redis-url",
            cluster_url,
            "--transaction-timeout",
            "0.5",
            "--check-interval",
            "1",
            "--claim-idle",
            "1",
        ]
        env = os.environ | {"TXMQ_HEARTBEAT_INTERVAL": "0.5"}
        doomed = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        survivor = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # both started (a SIGTERM before the survivor's handler is set would just kill it)
            wait_until(lambda: cluster.zcard(CHECKER_INSTANCES) >= 2, timeout=60)
            wait_until(lambda: sum(cluster.xlen(t) for t in TOPICS) > len(TOPICS), timeout=60)
            doomed.send_signal(signal.SIGKILL)  # a checker dies mid-work; the other finishes
            wait_until(lambda: all(cluster.hlen(TopicKeys(t).inflight) == 0 for t in TOPICS), timeout=60)
        finally:
            doomed.kill()
            doomed.wait(10)
            survivor.send_signal(signal.SIGTERM)
            assert survivor.wait(15) == 0, survivor.stderr.read().decode()[-2000:]
    seen = collections.Counter(
        fields[b"transaction_id"].decode() for topic in TOPICS for _, fields in cluster.xrange(topic)
    )
    assert seen == {t: 1 for t in committed}
    for topic in TOPICS:
        assert sorted(f[b"body"] for _, f in cluster.xrange(topic)) == [b"checked", b"commit"]
    report = json.loads(CliRunner().invoke(main, ["status", "--cluster", "--json", "--redis-url", cluster_url]).output)
    assert {t["topic"]: (t["committed"], t["in_flight"]) for t in report["topics"]} == {t: (2, 0) for t in TOPICS}


def test_consumer_and_dead_letters_on_cluster(cluster, cluster_url, make_producer):
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1, heartbeat_interval=0.5, cluster=True)
    with make_producer("cluster_dead", Knows(set()), client=cluster, settings=settings) as producer:
        kept = producer.send_message_in_transaction(Message(TOPICS[0], b"kept"), COMMIT)
        lost = producer.send_message_in_transaction(Message(TOPICS[1], b"lost"), UNKNOWN)
    from redis_txmq.checker import Checker

    checker = Checker(cluster, settings)
    wait_until(lambda: checker.run_round() and cluster.xlen(TopicKeys(TOPICS[1]).dead_stream) == 1)
    runner = CliRunner()
    listed = json.loads(runner.invoke(main, ["dead", "list", "--cluster", "--json", "--redis-url", cluster_url]).output)
    assert [row["transaction_id"] for row in listed] == [lost.transaction_id]
    out = runner.invoke(main, ["dead", "commit", lost.transaction_id, "--cluster", "--redis-url", cluster_url])
    assert out.exit_code == 0, out.output
    with Consumer(TOPICS[1], "billing", client=cluster, block=0.05) as consumer:
        assert [m.body for m in consumer.poll()] == [b"lost"]
    with Consumer(TOPICS[0], "billing", client=cluster, block=0.05) as consumer:
        (message,) = consumer.poll()
        assert message.transaction_id == kept.transaction_id
        consumer.ack(message)


def test_spark_reads_topics_on_every_master(cluster, cluster_url, spark):
    with TransactionProducer(
        "cluster_spark", Knows(set()), client=cluster, settings=Settings(heartbeat_interval=0.5, cluster=True)
    ) as producer:
        for topic in TOPICS:
            producer.send_message_in_transaction(Message(topic, topic.encode()), COMMIT)
            producer.send_message_in_transaction(Message(topic, b"never"), ROLLBACK)
    df = (
        spark.read.format("redis-txmq")
        .option("redis.url", cluster_url)
        .option("redis.cluster", "true")
        .option("topics", ",".join(TOPICS))
        .load()
    )
    assert sorted(bytes(r.body).decode() for r in df.collect()) == sorted(TOPICS)


def test_a_partitioned_topic_spreads_over_the_masters(cluster, cluster_url, spark):
    from redis_txmq import create_topic

    create_topic(cluster, "hot", 8)
    streams = [TopicKeys("hot", p, partitioned=True).topic_stream for p in range(8)]
    assert len({cluster.get_node_from_key(s).name for s in streams}) == 3
    with TransactionProducer(
        "cluster_hot", Knows(set()), client=cluster, settings=Settings(heartbeat_interval=0.5, cluster=True)
    ) as producer:
        results = [
            producer.send_message_in_transaction(Message("hot", str(i).encode(), keys=f"k{i}"), COMMIT)
            for i in range(40)
        ]
    assert len({r.partition for r in results}) == 8
    with Consumer("hot", "billing", client=cluster, block=0.05) as consumer:
        seen = [m.body for _ in range(20) for m in consumer.poll()]
    assert sorted(int(b) for b in seen) == list(range(40))
    df = (
        spark.read.format("redis-txmq")
        .option("redis.url", cluster_url)
        .option("redis.cluster", "true")
        .option("topics", "hot")
        .load()
    )
    assert sorted(int(bytes(r.body)) for r in df.collect()) == list(range(40))
    assert {r.partition for r in df.select("partition").distinct().collect()} == set(range(8))


def test_check_back_on_a_partitioned_topic_while_heartbeats_reassert_it(cluster, make_producer):
    """A producer re-asserts its topics' partitions with every heartbeat (one script call per topic: cluster
    pipelines refuse scripts); it keeps answering check-backs, on both APIs."""
    from redis_txmq import create_topic
    from redis_txmq.checker import Checker

    settings = Settings(cluster=True, transaction_timeout=0, check_interval=0.3, heartbeat_interval=0.1, claim_idle=1)
    create_topic(cluster, "parted-cluster", 3)
    listener = Knows(set())
    with make_producer("parted_group", listener, client=cluster, settings=settings) as producer:
        sent = producer.send_message_in_transaction(Message("parted-cluster", b"x", keys="k"), UNKNOWN)
        listener.committed.add(sent.transaction_id)
        stream = f"parted-cluster#{sent.partition}"
        producers, beats = GroupKeys("parted_group").producers, set()
        wait_until(lambda: beats.add(cluster.zscore(producers, producer.instance_id)) or len(beats) >= 3)
        checker = Checker(cluster, settings)
        wait_until(lambda: checker.run_round() is not None and cluster.xlen(stream) == 1, timeout=30)
    ((_, fields),) = cluster.xrange(stream)
    assert fields[b"transaction_id"].decode() == sent.transaction_id


def test_a_transaction_of_messages_on_every_master(cluster):
    """One transaction's messages in the slots of every master, its decision in a slot of its own: all commit
    together; a second one rolls back whole; the checker finishes one whose producer died after its decision."""
    from redis_txmq.checker import Checker
    from redis_txmq.core.keys import decision_key

    settings = Settings(cluster=True, transaction_timeout=0, check_interval=0.05)
    with TransactionProducer("many_cluster", Knows(set()), client=cluster, settings=settings) as producer:
        committed = producer.send_messages_in_transaction([Message(t, b"c") for t in TOPICS], COMMIT)
        rolled_back = producer.send_messages_in_transaction([Message(t, b"r") for t in TOPICS], ROLLBACK)
        assert {r.local_transaction_state for r in committed} == {COMMIT}
        assert {r.local_transaction_state for r in rolled_back} == {ROLLBACK}

        def died(ends):
            raise TxMQConnectionError("the producer died after its decision")

        producer.broker.end_transactions = died
        orphaned = producer.send_messages_in_transaction([Message(t, b"o") for t in TOPICS], COMMIT)
        parent = orphaned[0].transaction_id.split(".")[0]
        assert cluster.hget(decision_key(parent), "outcome") == b"COMMIT"
        checker = Checker(cluster, settings)
        wait_until(lambda: checker.run_round() is not None and all(cluster.xlen(t) == 2 for t in TOPICS), timeout=30)
    for topic in TOPICS:
        assert [f[b"body"] for _, f in cluster.xrange(topic)] == [b"c", b"o"]
        assert cluster.hlen(TopicKeys(topic).inflight) == 0


def test_a_cluster_node_whose_port_was_taken_meanwhile_starts_on_another() -> None:
    """Ports are chosen when the cluster is made and taken when each node starts: one taken meanwhile by another
    process (the test session runs many servers) moves its node to another free port instead of failing."""
    from redis_txmq.transport.embedded import LocalCluster

    cluster = LocalCluster(masters=3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", cluster.ports[1]))
        squatter.listen()
        taken = cluster.ports[1]
        cluster.start()
        try:
            assert taken not in cluster.ports and len(set(cluster.ports)) == 3
            client = RedisCluster.from_url(cluster.url)
            try:
                assert client.set("k", "v") and client.get("k") == b"v"
            finally:
                client.close()
        finally:
            cluster.stop()
