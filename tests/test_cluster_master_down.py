"""A Redis Cluster with one master down: producers and checkers start, and the topics on healthy masters work.

Uses a 3-master cluster of its own (the session's cluster stays whole), with ``cluster-require-full-coverage no``
so that the healthy masters keep serving their slots, as a production cluster configured for partial availability.
"""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from checker import Checker
from redis_txmq import Message, Settings, TransactionProducer
from redis_txmq.embedded import embedded_cluster
from redis_txmq.keys import CHECKER_INSTANCES, GROUP_REGISTRY, REPLY_STREAM, TOPIC_REGISTRY, GroupKeys

from .helpers import wait_until
from .test_checker import COMMIT, UNKNOWN, Answers, running

pytestmark = pytest.mark.slow

SETTINGS = Settings(cluster=True, transaction_timeout=0, check_interval=0.3, heartbeat_interval=0.3, claim_idle=1)


def _names_on(cluster: RedisCluster, avoid: str, want: bool, prefix: str) -> str:
    """A name whose slot is (``want``) or is not on the master ``avoid``."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if (cluster.get_node_from_key(name).name == avoid) == want:
            return name
    raise AssertionError("no such name")


def test_producer_and_checker_start_and_serve_healthy_masters_when_one_master_is_down():
    with embedded_cluster() as url:
        cluster = RedisCluster.from_url(url)
        for node in cluster.get_primaries():
            cluster.config_set("cluster-require-full-coverage", "no", target_nodes=node)
        infrastructure = {REPLY_STREAM, CHECKER_INSTANCES, TOPIC_REGISTRY, GROUP_REGISTRY}
        busy = {cluster.get_node_from_key(key).name for key in infrastructure}
        victim = next(node for node in cluster.get_primaries() if node.name not in busy)
        group = next(
            g
            for g in (f"group-{i}" for i in range(1000))
            if cluster.get_node_from_key(GroupKeys(g).check_requests).name != victim.name
        )
        stranded_group = next(
            g
            for g in (f"stranded-{i}" for i in range(1000))
            if cluster.get_node_from_key(GroupKeys(g).check_requests).name == victim.name
        )
        down_topic = _names_on(cluster, victim.name, True, "down")
        up_topic = _names_on(cluster, victim.name, False, "up")

        listener = Answers(default=COMMIT)
        with TransactionProducer(group, listener, client=cluster, settings=SETTINGS) as producer:
            producer.send_message_in_transaction(Message(down_topic, b"before"), arg=COMMIT)
        try:
            redis.Redis(host=victim.host, port=victim.port).shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it goes
        survivors = RedisCluster.from_url(url)
        try:
            with TransactionProducer(group, listener, client=survivors, settings=SETTINGS) as producer:
                sent = producer.send_message_in_transaction(Message(up_topic, b"direct"), arg=COMMIT)
                assert sent.committed_id and not sent.end_error
                late = producer.send_message_in_transaction(Message(up_topic, b"by check-back"), arg=UNKNOWN)
                checker = Checker(survivors, SETTINGS, scan_interval=0.05)
                with running(checker):
                    wait_until(lambda: survivors.xlen(up_topic) == 2, timeout=60)
                    wait_until(lambda: checker.metrics.topic_errors.labels(down_topic)._value.get() >= 1, timeout=60)
                bodies = [fields[b"body"] for _, fields in survivors.xrange(up_topic)]
                assert bodies == [b"direct", b"by check-back"]
            # a group whose request stream lives on the dead master: the producer starts and sends all the same
            with TransactionProducer(stranded_group, listener, client=survivors, settings=SETTINGS) as stranded:
                assert stranded.send_message_in_transaction(Message(up_topic, b"stranded"), arg=COMMIT).committed_id
                assert late.transaction_id in {f[b"transaction_id"].decode() for _, f in survivors.xrange(up_topic)}
        finally:
            survivors.close()
            cluster.close()
