"""A Redis Cluster with one master down: producers and checkers start, and the topics on healthy masters work.

Uses a 3-master cluster of its own per test (the session's cluster stays whole), with ``cluster-require-full-coverage
no`` so that the healthy masters keep serving their slots, as a production cluster configured for partial
availability. The master taken down holds none of the keys every part shares (the reply stream, the registries,
the checkers' set): only its own slots stop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from checker import Checker
from redis_txmq import Message, Settings, TransactionProducer, create_topic
from redis_txmq.embedded import embedded_cluster
from redis_txmq.keys import (
    CHECKER_INSTANCES,
    GROUP_REGISTRY,
    REPLY_STREAM,
    TOPIC_REGISTRY,
    GroupKeys,
    topic_meta_key,
)

from .helpers import server_ms, wait_until
from .test_checker import COMMIT, UNKNOWN, Answers, running

pytestmark = pytest.mark.slow

SETTINGS = Settings(cluster=True, transaction_timeout=0, check_interval=0.3, heartbeat_interval=0.3, claim_idle=1)
PATIENT = Settings(
    cluster=True, transaction_timeout=0, check_interval=0.3, check_max=1000, heartbeat_interval=0.3, claim_idle=1
)
"""Checks are not counted out while a test waits on a slow machine: only the test's deadline decides."""
SHARED_KEYS = {REPLY_STREAM, CHECKER_INSTANCES, TOPIC_REGISTRY, GROUP_REGISTRY}


def _names_on(cluster: RedisCluster, avoid: str, want: bool, prefix: str) -> str:
    """A name whose slot is (``want``) or is not on the master ``avoid``."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if (cluster.get_node_from_key(name).name == avoid) == want:
            return name
    raise AssertionError("no such name")


class OneMasterDown:
    """A 3-master cluster whose ``victim`` master (one that holds none of :data:`SHARED_KEYS`) :meth:`goes_down`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.cluster = RedisCluster.from_url(url)
        for node in self.cluster.get_primaries():
            self.cluster.config_set("cluster-require-full-coverage", "no", target_nodes=node)
        busy = {self.cluster.get_node_from_key(key).name for key in SHARED_KEYS}
        self.victim = next(node for node in self.cluster.get_primaries() if node.name not in busy)

    def on_victim(self, key: str) -> bool:
        return self.cluster.get_node_from_key(key).name == self.victim.name

    def group(self, prefix: str = "group") -> str:
        """A producer group whose check requests live on a healthy master."""
        names = (f"{prefix}-{i}" for i in range(1000))
        return next(g for g in names if not self.on_victim(GroupKeys(g).check_requests))

    def goes_down(self) -> None:
        try:
            redis.Redis(host=self.victim.host, port=self.victim.port).shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it goes

    def close(self) -> None:
        self.cluster.close()


@pytest.fixture
def one_master_down() -> Iterator[OneMasterDown]:
    with embedded_cluster() as url:
        down = OneMasterDown(url)
        try:
            yield down
        finally:
            down.close()


def a_beat_later(cluster: RedisCluster, group: str, instance_id: str) -> None:
    """Wait until the producer ``instance_id`` of ``group`` beat after now (its loop went round once)."""
    keys = GroupKeys(group)
    now = server_ms(cluster.get_node_from_key(keys.producers).redis_connection)
    wait_until(lambda: (cluster.zscore(keys.producers, instance_id) or 0) > now, timeout=30)


def key_lookups_on(client: Any, node_name: str) -> None:
    """Make ``node_name`` the node where redis-py looks up the keys of a command whose keys sit at no fixed position
    (XREADGROUP): the default node of a sync cluster client, the command parser's node of an asyncio one. redis-py
    takes any master for it (the first of its slot map, another one after some errors)."""
    node = client.get_node(node_name=node_name)
    client.set_default_node(node)
    if not isinstance(client, RedisCluster):
        client.commands_parser.node = node


def test_producer_and_checker_start_and_serve_healthy_masters_when_one_master_is_down(
    one_master_down: OneMasterDown,
) -> None:
    down = one_master_down
    cluster, victim = down.cluster, down.victim
    group, stranded_group = (
        down.group(),
        next(g for g in (f"stranded-{i}" for i in range(1000)) if down.on_victim(GroupKeys(g).check_requests)),
    )
    down_topic = _names_on(cluster, victim.name, True, "down")
    up_topic = _names_on(cluster, victim.name, False, "up")

    listener = Answers(default=COMMIT)
    with TransactionProducer(group, listener, client=cluster, settings=SETTINGS) as producer:
        producer.send_message_in_transaction(Message(down_topic, b"before"), arg=COMMIT)
    down.goes_down()
    survivors = RedisCluster.from_url(down.url)
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


def test_a_producer_that_wrote_to_the_dead_masters_topic_answers_the_checks_of_the_others(
    one_master_down: OneMasterDown, make_producer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The producer re-asserts the partitions of a topic on the dead master with every heartbeat: that fails, is
    logged once, and the beat and the reading of check requests go on, so a transaction on a healthy master left
    UNKNOWN is committed by the check-back."""
    down = one_master_down
    cluster = down.cluster
    # the topic's metadata (what the producer re-asserts) and a partition of it on the master that goes down
    names = (f"dead-{i}" for i in range(1000))
    dead_topic = next(t for t in names if down.on_victim(topic_meta_key(t)) and down.on_victim(f"{t}#0"))
    create_topic(cluster, dead_topic, 2)
    up_topic = _names_on(cluster, down.victim.name, False, "up")
    group = down.group()
    caplog.set_level(logging.WARNING, logger="redis_txmq.check_handler")
    with make_producer(group, Answers(default=COMMIT), client=cluster, settings=PATIENT) as producer:
        for body in (b"before", b"before, the other partition"):  # round robin
            assert producer.send_message_in_transaction(Message(dead_topic, body), arg=COMMIT).committed_id
        down.goes_down()
        a_beat_later(cluster, group, producer.instance_id)
        late = producer.send_message_in_transaction(Message(up_topic, b"by check-back"), arg=UNKNOWN)
        survivors = RedisCluster.from_url(down.url)
        try:
            with running(Checker(survivors, PATIENT, scan_interval=0.05)):
                wait_until(lambda: survivors.xlen(up_topic) == 1, timeout=60)
        finally:
            survivors.close()
    assert [f[b"transaction_id"].decode() for _, f in cluster.xrange(up_topic)] == [late.transaction_id]
    failed = [r for r in caplog.records if f"partitions of topic {dead_topic!r}" in r.getMessage()]
    assert len(failed) == 1, "logged when it starts failing, not at every beat"


def test_a_checker_started_while_a_master_is_down_and_producers_read_from_the_masters_of_their_streams(
    one_master_down: OneMasterDown, make_producer: Any
) -> None:
    """redis-py looks up the keys of XREADGROUP on one node of its choosing (which here is the dead master): the
    blocking reads of check requests and of answers go to the master of their stream instead, so the check-back of
    the healthy masters works with a producer and a checker whose clients chose the dead master."""
    down = one_master_down
    cluster = down.cluster
    up_topic = _names_on(cluster, down.victim.name, False, "up")
    group = down.group()
    with make_producer(group, Answers(default=COMMIT), client=cluster, settings=PATIENT) as producer:
        assert producer.send_message_in_transaction(Message(up_topic, b"before"), arg=COMMIT).committed_id
        down.goes_down()
        key_lookups_on(producer.client, down.victim.name)
        a_beat_later(cluster, group, producer.instance_id)  # no read from before is still waiting
        late = producer.send_message_in_transaction(Message(up_topic, b"by check-back"), arg=UNKNOWN)
        survivors = RedisCluster.from_url(down.url)
        checker = Checker(survivors, PATIENT, scan_interval=0.05)
        checker.start()  # its scripts are loaded on every master: the dead one makes redis-py choose its nodes anew
        key_lookups_on(survivors, down.victim.name)
        try:
            with running(checker):
                wait_until(lambda: survivors.xlen(up_topic) == 2, timeout=60)
        finally:
            survivors.close()
    assert [f[b"transaction_id"].decode() for _, f in cluster.xrange(up_topic)][1] == late.transaction_id
