"""A Redis Cluster with one master down: producers, checkers and consumers start, and the topics on healthy masters
work.

Uses a 3-master cluster of its own per test (the session's cluster stays whole), with ``cluster-require-full-coverage
no`` so that the healthy masters keep serving their slots, as a production cluster configured for partial
availability. The master taken down holds none of the keys every part shares (the reply stream, the registries,
the checkers' set): only its own slots stop; one test takes down the master of the topic registry instead, and the
durability test uses a cluster with a replica per master (the dead master's replica goes down first, so that
nothing takes its place).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from redis_txmq import Message, Settings, TransactionProducer, TxMQError, create_topic
from redis_txmq.checker import Checker, CheckerMetrics
from redis_txmq.core.keys import (
    CHECKER_INSTANCES,
    GROUP_REGISTRY,
    REPLY_STREAM,
    SCHEDULE,
    TOPIC_REGISTRY,
    GroupKeys,
    TopicKeys,
    topic_meta_key,
)
from redis_txmq.core.protocol import SentCheck
from redis_txmq.ops.admin import registered_topics
from redis_txmq.sync.broker import RedisBroker
from redis_txmq.transport.embedded import LocalCluster

from .helpers import server_ms, wait_until
from .test_checker import COMMIT, UNKNOWN, Answers, running
from .test_consumer import AsyncioApi, SyncApi
from .test_consumer import running as consuming
from .test_consumer_lag import samples

pytestmark = pytest.mark.slow

SETTINGS = Settings(cluster=True, transaction_timeout=0, check_interval=0.3, heartbeat_interval=0.3, claim_idle=1)
PATIENT = Settings(
    cluster=True, transaction_timeout=0, check_interval=0.3, check_max=1000, heartbeat_interval=0.3, claim_idle=1
)
"""Checks are not counted out while a test waits on a slow machine: only the test's deadline decides."""
SHARED_KEYS = {REPLY_STREAM, CHECKER_INSTANCES, TOPIC_REGISTRY, GROUP_REGISTRY, SCHEDULE}


def _names_on(cluster: RedisCluster, avoid: str, want: bool, prefix: str) -> str:
    """A name whose slot is (``want``) or is not on the master ``avoid``."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if (cluster.get_node_from_key(name).name == avoid) == want:
            return name
    raise AssertionError("no such name")


class OneMasterDown:
    """A 3-master cluster whose ``victim`` master :meth:`goes_down`: one that holds none of :data:`SHARED_KEYS`, or
    the master of ``holding`` (not the reply stream's nor the checkers' set)."""

    def __init__(self, url: str, holding: str | None = None) -> None:
        self.url = url
        self.cluster = RedisCluster.from_url(url)
        for node in self.cluster.get_primaries():
            self.cluster.config_set("cluster-require-full-coverage", "no", target_nodes=node)
        if holding is None:
            busy = {self.cluster.get_node_from_key(key).name for key in SHARED_KEYS}
            self.victim = next(node for node in self.cluster.get_primaries() if node.name not in busy)
        else:
            self.victim = self.cluster.get_node_from_key(holding)
            assert not any(self.on_victim(key) for key in (REPLY_STREAM, CHECKER_INSTANCES))

    def on_victim(self, key: str) -> bool:
        return self.cluster.get_node_from_key(key).name == self.victim.name

    def group(self, prefix: str = "group") -> str:
        """A producer group whose check requests live on a healthy master."""
        names = (f"{prefix}-{i}" for i in range(1000))
        return next(g for g in names if not self.on_victim(GroupKeys(g).check_requests))

    def stranded_group(self) -> str:
        """A producer group whose check requests live on the master that goes down."""
        names = (f"stranded-{i}" for i in range(1000))
        return next(g for g in names if self.on_victim(GroupKeys(g).check_requests))

    def goes_down(self) -> None:
        """Shut the victim down, its replicas first (none takes its place)."""
        for replica in self.cluster.get_replicas():
            node = redis.Redis(host=replica.host, port=replica.port)
            if int(node.info("replication").get("master_port", 0)) == self.victim.port:
                _shutdown(node)
        _shutdown(redis.Redis(host=self.victim.host, port=self.victim.port))

    def close(self) -> None:
        self.cluster.close()


def _shutdown(node: redis.Redis) -> None:
    try:
        node.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # the server closes the connection as it goes
    finally:
        node.close()


@contextlib.contextmanager
def one_master_down_of(holding: str | None = None, replicas: int = 0) -> Iterator[OneMasterDown]:
    """A cluster of its own with :class:`OneMasterDown` on it."""
    cluster = LocalCluster(masters=3, replicas=replicas).start()
    try:
        down = OneMasterDown(cluster.url, holding)
        try:
            yield down
        finally:
            down.close()
    finally:
        cluster.stop()


@pytest.fixture
def one_master_down() -> Iterator[OneMasterDown]:
    with one_master_down_of() as down:
        yield down


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
    group, stranded_group = down.group(), down.stranded_group()
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
    caplog.set_level(logging.WARNING, logger="redis_txmq.sync.check_handler")
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


def test_at_durability_replica_a_producer_and_a_checker_start_with_a_master_down_and_confirm_on_the_others(
    make_producer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The level is checked at start on the masters that answer (the dead one is skipped with a warning) and
    enforced on every call: sends to a healthy master are confirmed by its replica, and the check-back commits."""
    settings = replace(PATIENT, durability="replica", durability_timeout=5.0)
    caplog.set_level(logging.WARNING, logger="redis_txmq.core.durability")
    with one_master_down_of(replicas=1) as down:
        cluster = down.cluster
        up_topic = _names_on(cluster, down.victim.name, False, "up")
        group = down.group()
        down.goes_down()
        with make_producer(group, Answers(default=COMMIT), client=cluster, settings=settings) as producer:
            sent = producer.send_message_in_transaction(Message(up_topic, b"confirmed"), arg=COMMIT)
            assert sent.committed_id and not sent.end_error
            late = producer.send_message_in_transaction(Message(up_topic, b"by check-back"), arg=UNKNOWN)
            checker = Checker(cluster, settings, scan_interval=0.05)
            checker.start()
            with running(checker):
                wait_until(lambda: cluster.xlen(up_topic) == 2, timeout=60)
        assert [f[b"transaction_id"].decode() for _, f in cluster.xrange(up_topic)][1] == late.transaction_id
    skipped = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(skipped) == 2, "the producer and the checker each checked the level, skipping the dead master"
    assert all(down.victim.name in message for message in skipped), "the master skipped is named"


@pytest.mark.parametrize("api_class", [SyncApi, AsyncioApi], ids=["sync", "async"])
def test_a_consumer_of_a_topic_on_a_healthy_master_reads_while_another_master_is_down(
    one_master_down: OneMasterDown, api_class: type
) -> None:
    """The consumer's blocking reads go to the master of the topic's stream, not to the node redis-py looks the keys
    of XREADGROUP up on, which here is the dead master."""
    down = one_master_down
    cluster = down.cluster
    up_topic = _names_on(cluster, down.victim.name, False, "up")
    with TransactionProducer(down.group(), Answers(default=COMMIT), client=cluster, settings=SETTINGS) as producer:
        assert producer.send_message_in_transaction(Message(up_topic, b"before"), arg=COMMIT).committed_id
        down.goes_down()
        reader, api = RedisCluster.from_url(down.url), api_class()
        try:
            consumer = api.Consumer(up_topic, "billing", "c1", client=reader, block=0.2)
            key_lookups_on(consumer.client, down.victim.name)
            with consuming(consumer) as handled:
                assert producer.send_message_in_transaction(Message(up_topic, b"after"), arg=COMMIT).committed_id
                wait_until(lambda: len(handled) == 2, timeout=60)
            assert handled == [b"before", b"after"]
        finally:
            api.close()
            reader.close()


def test_a_group_whose_check_requests_are_on_the_dead_master_does_not_hold_back_the_checks_of_the_others(
    one_master_down: OneMasterDown, caplog: pytest.LogCaptureFixture
) -> None:
    """Transactions of two producer groups in one topic on a healthy master, one group's request stream on the dead
    master: the other group's transaction is checked and committed, and the stranded one's checks, never sent, are
    not counted (it is not dead-lettered however long its master is down)."""
    down = one_master_down
    cluster = down.cluster
    up_topic = _names_on(cluster, down.victim.name, False, "up")
    stranded_group = down.stranded_group()
    caplog.set_level(logging.WARNING, logger="redis_txmq.checker.worker")
    with TransactionProducer(stranded_group, Answers(default=UNKNOWN), client=cluster, settings=PATIENT) as stranded:
        stuck = stranded.send_message_in_transaction(Message(up_topic, b"its group is on the dead master"), UNKNOWN)
    down.goes_down()
    with TransactionProducer(down.group(), Answers(default=COMMIT), client=cluster, settings=PATIENT) as producer:
        late = producer.send_message_in_transaction(Message(up_topic, b"by check-back"), arg=UNKNOWN)
        checker = Checker(cluster, PATIENT, scan_interval=0.05)
        with running(checker):
            wait_until(lambda: cluster.xlen(up_topic) == 1, timeout=60)
            wait_until(lambda: checker.metrics.errors.labels("check requests")._value.get() >= 2, timeout=60)
    assert [f[b"transaction_id"].decode() for _, f in cluster.xrange(up_topic)] == [late.transaction_id]
    keys = TopicKeys(up_topic)
    assert cluster.hexists(keys.inflight, stuck.transaction_id), "still in flight, not dead-lettered"
    assert int(cluster.hget(keys.checks, stuck.transaction_id) or 0) == 0, "a check never sent is not counted"
    assert any(stranded_group in r.getMessage() and "not sent" in r.getMessage() for r in caplog.records)


def test_a_checker_goes_on_checking_the_topics_it_knows_while_the_topic_registry_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="redis_txmq.checker.worker")
    with one_master_down_of(holding=TOPIC_REGISTRY) as down:
        cluster = down.cluster
        up_topic = _names_on(cluster, down.victim.name, False, "up")
        with TransactionProducer(down.group(), Answers(default=COMMIT), client=cluster, settings=PATIENT) as producer:
            first = producer.send_message_in_transaction(Message(up_topic, b"checked before"), arg=UNKNOWN)
            with running(Checker(cluster, PATIENT, scan_interval=0.05)):
                wait_until(lambda: cluster.xlen(up_topic) == 1, timeout=60)
                down.goes_down()
                late = producer.send_message_in_transaction(Message(up_topic, b"checked while it is down"), UNKNOWN)
                wait_until(lambda: cluster.xlen(up_topic) == 2, timeout=60)
        published = [f[b"transaction_id"].decode() for _, f in cluster.xrange(up_topic)]
        assert published == [first.transaction_id, late.transaction_id]
    unreachable = [r for r in caplog.records if f"topic registry {TOPIC_REGISTRY}" in r.getMessage()]
    assert len(unreachable) == 1, "logged when it becomes unreachable, not at every scan"


def test_a_check_never_sent_gives_its_count_back_once(cluster_url: str) -> None:
    """``lua/note_requests.lua``: a claimed check whose request could not be sent is taken off the count while the
    count is still the one its claim left, so a note repeated after a lost reply gives nothing back twice."""
    client = RedisCluster.from_url(cluster_url)
    try:
        topic = f"never-sent-{uuid.uuid4().hex}"
        with TransactionProducer("never-sent", Answers(default=UNKNOWN), client=client, settings=PATIENT) as producer:
            tx = producer.send_message_in_transaction(Message(topic, b"asked, never sent"), arg=UNKNOWN)
        broker, keys = RedisBroker(client, PATIENT), TopicKeys(topic)
        broker.load_scripts()
        (claimed,) = broker.claim_checks(keys, 10).to_check
        assert claimed.check_times == 1
        (note,) = Checker._never_sent(claimed)
        assert broker.note_check_requests(keys, [note]).given_back == 1
        assert broker.note_check_requests(keys, [note]).given_back == 0, "repeated: nothing given back twice"
        assert client.hget(keys.checks, tx.transaction_id) == b"0"
        assert client.hexists(keys.inflight, tx.transaction_id)
        with pytest.raises(TxMQError, match="BADARG"):
            broker.note_check_requests(keys, [SentCheck(tx.transaction_id, "", "")])
    finally:
        client.close()


def test_the_gauges_of_topics_on_healthy_masters_follow_them_while_another_master_is_down(
    one_master_down: OneMasterDown,
) -> None:
    """The checker's gauges are read in pipelines over all topics: a master down fails its own topics' reads (they
    keep their last values, counted as errors), and the other topics' gauges still follow what happens on theirs."""
    down = one_master_down
    cluster, victim = down.cluster, down.victim
    up_topic = _names_on(cluster, victim.name, False, "up")
    down_topic = _names_on(cluster, victim.name, True, "down")
    settings = replace(PATIENT, transaction_timeout=3600)
    listener = Answers(default=COMMIT)
    with TransactionProducer(down.group(), listener, client=cluster, settings=settings) as producer:
        for topic in (up_topic, down_topic):
            producer.send_message_in_transaction(Message(topic, b"before"), arg=UNKNOWN)
    metrics = CheckerMetrics(observe_interval=3600)
    assert metrics.observer.observe(cluster, registered_topics(cluster), force=True)
    before = samples(metrics)
    down_gauge = ("txmq_oldest_in_flight_age_seconds", (("topic", down_topic),))
    assert down_gauge in before

    down.goes_down()
    survivors = RedisCluster.from_url(down.url)
    try:
        survivors.xgroup_create(up_topic, "billing", id="0", mkstream=True)
        survivors.xadd(up_topic, {"body": b"after"})
        errors = metrics.errors.labels("observe")._value.get()
        assert metrics.observer.observe(survivors, registered_topics(survivors), force=True)
        exposed = samples(metrics)
        assert exposed[("txmq_consumer_lag", (("group", "billing"), ("topic", up_topic)))] == 1
        assert exposed[("txmq_oldest_in_flight_age_seconds", (("topic", up_topic),))] > 0
        assert exposed[down_gauge] == before[down_gauge]  # kept
        assert metrics.errors.labels("observe")._value.get() == errors + 1  # the dead master's topic alone
    finally:
        survivors.close()
