"""What recovers by itself: a damaged topic, Redis lost data, Redis not there at start, dead instances' names."""

from __future__ import annotations

import subprocess
import threading

import pytest
import redis

from redis_txmq import Settings, TransactionProducer, create_topic
from redis_txmq.checker import Checker
from redis_txmq.core.keys import (
    CHECKER_INSTANCES,
    CHECKERS_CONSUMER_GROUP,
    GROUP_REGISTRY,
    PRODUCERS_CONSUMER_GROUP,
    REPLY_STREAM,
    TOPIC_REGISTRY,
    GroupKeys,
    TopicKeys,
)
from redis_txmq.core.message import Message
from redis_txmq.sync.broker import RedisBroker
from redis_txmq.transport.connection import connect
from redis_txmq.transport.embedded import free_port, wait_for_ping

from .helpers import wait_until
from .test_checker import COMMIT, GROUP, KEYS, TOPIC, UNKNOWN, Answers, committed, prepare, running

FAST = Settings(transaction_timeout=0, check_interval=0.2, check_max=3, heartbeat_interval=0.2, claim_idle=0.5)


def test_a_damaged_topic_does_not_stop_check_backs_of_the_others(real_client):
    """A topic whose keys are damaged is skipped and counted; the others are checked and their answers applied: a
    transaction answered COMMIT is committed, not dead-lettered after check_max rounds that never applied it."""
    other = TopicKeys("other")
    real_client.sadd(TOPIC_REGISTRY, other.topic_stream)
    real_client.set(other.unchecked, "not a zset")
    listener = Answers(default=COMMIT)
    with TransactionProducer(GROUP, listener, client=real_client, settings=FAST) as producer:
        result = producer.send_message_in_transaction(Message(TOPIC, b"late"), arg=UNKNOWN)
        checker = Checker(real_client, FAST, scan_interval=0.05)
        with running(checker):
            wait_until(lambda: committed(real_client) == {result.transaction_id: 1})
            wait_until(lambda: checker.metrics.topic_errors.labels("other")._value.get() >= 2)
    assert real_client.xlen(KEYS.dead_stream) == 0
    assert real_client.hlen(KEYS.inflight) == 0


def test_after_redis_lost_its_data_producers_and_checkers_heal(real_client):
    """FLUSHALL (as a restart without persistence or a failover to a lagging replica leaves it): the producer
    recreates its check-request group and re-registers its group and topics within a heartbeat, the checker
    recreates the reply group, and a check-back works again.

    Nothing here depends on the machine's speed: the checks sent before the producer has its group back are never
    read, so they do not count towards check_max 3 (they used to: a producer slower than three check intervals
    to come back saw the transaction dead-lettered), and the waits are deadlines, generous on a loaded machine."""
    listener = Answers(default=COMMIT)
    with TransactionProducer(GROUP, listener, client=real_client, settings=FAST) as producer:
        producer.send_message_in_transaction(Message(TOPIC, b"before"), arg=COMMIT)
        checker = Checker(real_client, FAST, scan_interval=0.05)
        with running(checker):
            wait_until(lambda: group_names(real_client, REPLY_STREAM), timeout=30)
            real_client.flushall()
            wait_until(lambda: real_client.sismember(TOPIC_REGISTRY, TOPIC), timeout=30)
            wait_until(lambda: real_client.sismember(GROUP_REGISTRY, GROUP), timeout=30)
            broker = RedisBroker(real_client, FAST)
            prepare(broker, "after-loss", b"lost and found")
            wait_until(lambda: committed(real_client) == {"after-loss": 1}, timeout=60)
    assert real_client.xlen(KEYS.dead_stream) == 0
    assert group_names(real_client, GroupKeys(GROUP).check_requests) == {PRODUCERS_CONSUMER_GROUP}
    assert group_names(real_client, REPLY_STREAM) == {CHECKERS_CONSUMER_GROUP}


def group_names(client: redis.Redis, stream: str) -> set[str]:
    """The consumer groups of ``stream``; none while the stream does not exist."""
    if not client.exists(stream):
        return set()
    return {g["name"].decode() for g in client.xinfo_groups(stream)}


def test_checker_started_before_redis_waits_for_it():
    """`txmq checker` started while Redis is down retries with backoff instead of exiting; once Redis answers,
    it joins (its heartbeat shows) and works."""
    port = free_port()
    client = connect(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
    checker = Checker(client, FAST, scan_interval=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=checker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: checker.metrics.errors.labels("start")._value.get() >= 1)
        assert thread.is_alive()
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            wait_for_ping(url, process=server)
            direct = redis.Redis.from_url(url)
            wait_until(lambda: direct.zcard(CHECKER_INSTANCES) == 1, timeout=40)
            direct.close()
        finally:
            stop.set()
            thread.join(10)
            server.terminate()
            server.wait(10)
    finally:
        stop.set()
    assert not thread.is_alive()


def test_in_flight_gauge_is_the_sum_of_the_partitions(real_client):
    create_topic(real_client, "parted", 3)
    broker = RedisBroker(real_client, FAST)
    broker.load_scripts()
    partitions = [TopicKeys("parted", p, partitioned=True) for p in range(3)]
    for p, count in zip(range(3), (2, 3, 4), strict=True):
        for i in range(count):
            broker.prepare_half(partitions[p], Message("parted", b"x"), f"tx-{p}-{i}", GROUP)
    checker = Checker(real_client, Settings(transaction_timeout=3600))
    checker.run_round()
    assert checker.metrics.in_flight.labels("parted")._value.get() == 9


@pytest.mark.parametrize("stream,group", [(REPLY_STREAM, CHECKERS_CONSUMER_GROUP), ("requests", "producers")])
def test_names_of_dead_instances_are_forgotten_once_their_work_was_taken_over(real_client, stream, group):
    """A reader that died with an entry in hand: a live instance takes the entry over, then the dead name is
    removed from the consumer group (it used to list every instance that ever ran)."""
    listener = Answers(default=COMMIT)
    if stream == "requests":
        stream = GroupKeys(GROUP).check_requests
    real_client.xgroup_create(stream, group, "0", mkstream=True)
    broker = RedisBroker(real_client, FAST)
    broker.load_scripts()
    prepare(broker, "taken-over")
    if stream == REPLY_STREAM:
        real_client.xadd(
            stream,
            {"stream": TOPIC, "transaction_id": "taken-over", "producer_group": GROUP, "state": "COMMIT"},
        )
    else:
        fields = real_client.xrange(KEYS.half_stream)[0][1]
        real_client.xadd(
            stream, {**fields, b"stream": TOPIC, b"half_id": real_client.hget(KEYS.inflight, "taken-over")}
        )
    real_client.xreadgroup(group, "dead-instance", {stream: ">"})

    def names() -> set[str]:
        return {c["name"].decode() for c in real_client.xinfo_consumers(stream, group)}

    with TransactionProducer(GROUP, listener, client=real_client, settings=FAST):
        checker = Checker(real_client, FAST, scan_interval=0.05)
        with running(checker):
            wait_until(lambda: committed(real_client) == {"taken-over": 1})
            wait_until(lambda: "dead-instance" not in names())
    assert names(), "the live instances stay"


def test_no_check_is_counted_while_answers_cannot_be_read(real_client):
    """The reply stream unreachable (damaged here; its cluster master down in production): the checker stops
    sending checks, which would only count towards check_max, and resumes once the replies can be read again."""
    settings = Settings(transaction_timeout=0, check_interval=0.1, check_max=2, heartbeat_interval=0.2)
    listener = Answers(default=COMMIT)
    with TransactionProducer(GROUP, listener, client=real_client, settings=settings) as producer:
        checker = Checker(real_client, settings, scan_interval=0.05)
        checker.start()
        real_client.delete(REPLY_STREAM)
        real_client.set(REPLY_STREAM, "damaged")
        sent = producer.send_message_in_transaction(Message(TOPIC, b"wait for me"), arg=UNKNOWN)
        with running(checker):
            wait_until(lambda: checker.metrics.errors.labels("replies")._value.get() >= 5)
            assert int(real_client.hget(KEYS.checks, sent.transaction_id) or 0) <= 1
            assert real_client.xlen(KEYS.dead_stream) == 0
            real_client.delete(REPLY_STREAM)
            wait_until(lambda: committed(real_client) == {sent.transaction_id: 1})
    assert real_client.xlen(KEYS.dead_stream) == 0


def test_producer_puts_back_the_partitions_redis_lost(real_client):
    """After data loss a producer started anew would read "one partition" and write every message to the bare
    stream no consumer of the partitions reads; live producers put the partition count back with their heartbeat."""
    create_topic(real_client, "parted", 4)
    with TransactionProducer(GROUP, Answers(), client=real_client, settings=FAST) as producer:
        producer.send_message_in_transaction(Message("parted", b"x", keys="k"), arg=COMMIT)
        real_client.flushall()
        wait_until(lambda: real_client.hget("txmq:topic:{parted}", "partitions") == b"4", timeout=5)
        wait_until(lambda: real_client.sismember(TOPIC_REGISTRY, "parted#" + str(_partition_of("k", 4))), timeout=5)
    with TransactionProducer(GROUP, Answers(), client=real_client, settings=FAST) as fresh:
        assert fresh.send_message_in_transaction(Message("parted", b"y", keys="k"), arg=COMMIT).partition > -1
    assert not real_client.exists("parted"), "nothing written to the unpartitioned stream"


def _partition_of(key: str, partitions: int) -> int:
    import zlib

    return zlib.crc32(key.encode()) % partitions
