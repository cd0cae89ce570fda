"""The lag of consumer groups: undelivered, pending, the oldest pending's idle time and dead letters per group of
each topic (all partitions), in ``txmq status`` (JSON and table) and in the checker's gauges; on one server and on
a 3-master cluster."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from redis.cluster import RedisCluster

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.checker import Checker, CheckerMetrics
from redis_txmq.cli import main
from redis_txmq.core.keys import TopicKeys
from redis_txmq.core.topics import create_topic
from redis_txmq.ops.admin import consumer_lag, registered_topics
from redis_txmq.ops.admin import status as read_status

from .helpers import ScriptedListener, wait_until

COMMIT, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.UNKNOWN
SETTINGS = Settings(transaction_timeout=60, check_interval=60, heartbeat_interval=0.5)
SENT = 12


def commit_messages(client, topic: str, count: int = SENT, settings: Settings = SETTINGS) -> None:
    with TransactionProducer("lag_group", ScriptedListener(), client=client, settings=settings) as producer:
        for i in range(count):
            producer.send_message_in_transaction(Message(topic, b"m%d" % i, keys=f"k{i}"), COMMIT)


def lag_rows(client) -> dict[tuple[str, str], dict]:
    return {(row["topic"], row["group"]): row for row in read_status(client, 1.5)["consumer_groups"]}


def read_some(client, topic: str, group: str, batch_size: int, settings: Settings = SETTINGS) -> tuple[int, int]:
    """One poll of ``group``: one message acked, one dead-lettered, the rest left pending. Returns (delivered,
    pending)."""
    with Consumer(topic, group, client=client, settings=settings, batch_size=batch_size, block=0.05) as consumer:
        delivered = consumer.poll()
        assert len(delivered) >= 3, "the test needs an acked, a dead-lettered and a pending message"
        consumer.ack(delivered[0])
        assert consumer.dead_letter(delivered[1], "refused by the test")
    return len(delivered), len(delivered) - 2


def test_lag_of_groups_on_a_partitioned_topic(real_client, redis_url):
    """A group that read some (one acked, one dead-lettered, the rest pending), a group that read nothing, and
    nothing else: each figure counts the group's entries over both partitions."""
    create_topic(real_client, "lagged", 2)
    commit_messages(real_client, "lagged")
    Consumer("lagged", "audit", client=real_client, settings=SETTINGS).close()  # made, never read
    delivered, pending = read_some(real_client, "lagged", "billing", batch_size=4)

    rows = lag_rows(real_client)
    billing = rows[("lagged", "billing")]
    assert billing["partitions"] == 2 and billing["consumers"] == 1
    assert billing["undelivered"] == SENT - delivered and billing["undelivered_unknown_partitions"] == 0
    assert billing["pending"] == pending and billing["dead_letters"] == 1
    assert billing["oldest_pending_idle_seconds"] is not None and billing["oldest_pending_idle_seconds"] >= 0
    assert rows[("lagged", "audit")] == {
        "topic": "lagged",
        "group": "audit",
        "partitions": 2,
        "consumers": 0,
        "undelivered": SENT,
        "undelivered_unknown_partitions": 0,
        "pending": 0,
        "oldest_pending_idle_seconds": None,
        "dead_letters": 0,
    }
    assert set(rows) == {("lagged", "billing"), ("lagged", "audit")}

    # the oldest pending entry's idle time grows while nobody acks it
    wait_until(lambda: lag_rows(real_client)[("lagged", "billing")]["oldest_pending_idle_seconds"] >= 0.3)

    out = CliRunner().invoke(main, ["status", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    shown = {(r["topic"], r["group"]): r for r in json.loads(out.output)["consumer_groups"]}
    assert shown[("lagged", "billing")]["undelivered"] == SENT - delivered
    assert shown[("lagged", "billing")]["pending"] == pending

    table = CliRunner().invoke(main, ["status", "--redis-url", redis_url], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "consumer groups" in table.output
    (billing_line,) = [line for line in table.output.splitlines() if "billing" in line]
    cells = [cell.strip() for cell in billing_line.strip("│ ").split("│")]
    assert cells[:5] == ["lagged", "billing", "1", str(SENT - delivered), str(pending)]
    assert cells[6] == "1"
    (audit_line,) = [line for line in table.output.splitlines() if "audit" in line]
    assert [cell.strip() for cell in audit_line.strip("│ ").split("│")] == [
        "lagged",
        "audit",
        "0",
        str(SENT),
        "0",
        "-",
        "0",
    ]


def test_lag_that_redis_cannot_tell_is_unknown_unless_the_group_read_everything(real_client, redis_url):
    """Redis gives no lag for a group once an entry past its last delivery was deleted (XDEL): that partition is
    counted as unknown; a group that had read past the deleted entry still has its lag."""
    commit_messages(real_client, "gaps", count=4)
    Consumer("gaps", "late", client=real_client, settings=SETTINGS).close()
    with Consumer("gaps", "done", client=real_client, settings=SETTINGS, block=0.05) as consumer:
        for message in consumer.poll():
            consumer.ack(message)
    second = real_client.xrange("gaps")[1][0]
    real_client.xdel("gaps", second)
    assert {g["name"]: g["lag"] for g in real_client.xinfo_groups("gaps")} == {b"late": None, b"done": 0}

    rows = lag_rows(real_client)
    late, done = rows[("gaps", "late")], rows[("gaps", "done")]
    assert (late["undelivered"], late["undelivered_unknown_partitions"]) == (None, 1)
    assert (done["undelivered"], done["undelivered_unknown_partitions"]) == (0, 0)

    out = CliRunner().invoke(main, ["status", "--redis-url", redis_url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    (late_line,) = [line for line in out.output.splitlines() if "late" in line]
    assert "unknown" in late_line


def test_a_topic_without_groups_or_streams_has_no_rows(real_client):
    create_topic(real_client, "quiet", 3)  # registered partitions that nothing was committed to: no stream yet
    assert consumer_lag(real_client, registered_topics(real_client, "quiet")) == []
    assert lag_rows(real_client) == {}


def test_the_checker_exports_the_lag_and_drops_a_deleted_group(real_client):
    """The checker's gauges carry the figures of ``txmq status`` (the oldest in-flight transaction and the dead
    letters waiting too, and the master answering), and forget a group once it is deleted."""
    commit_messages(real_client, "watched")
    with TransactionProducer("lag_group", ScriptedListener(), client=real_client, settings=SETTINGS) as producer:
        producer.send_message_in_transaction(Message("watched", b"undecided"), UNKNOWN)
    delivered, pending = read_some(real_client, "watched", "billing", batch_size=5)
    metrics = CheckerMetrics(observe_interval=3600)
    checker = Checker(real_client, SETTINGS, metrics=metrics)
    checker.run_round()

    exposed = samples(metrics)
    billing = (("group", "billing"), ("topic", "watched"))
    assert exposed[("txmq_consumer_lag", billing)] == SENT - delivered
    assert exposed[("txmq_consumer_pending", billing)] == pending
    assert exposed[("txmq_consumer_dead_letters", billing)] == 1
    assert exposed[("txmq_consumer_oldest_pending_idle_seconds", billing)] >= 0
    assert exposed[("txmq_oldest_in_flight_age_seconds", (("topic", "watched"),))] >= 0
    assert exposed[("txmq_dead_letters_waiting", (("topic", "watched"),))] == 0
    assert exposed[("txmq_checker_topic_consecutive_failures", (("topic", "watched"),))] == 0
    port = real_client.connection_pool.connection_kwargs["port"]
    (master,) = [labels for name, labels in exposed if name == "txmq_redis_master_up"]
    assert dict(master)["address"].endswith(f":{port}") and exposed[("txmq_redis_master_up", master)] == 1
    bound = SETTINGS.transaction_timeout + (SETTINGS.check_max + 1) * SETTINGS.check_interval
    assert exposed[("txmq_in_flight_age_bound_seconds", ())] == bound

    real_client.xgroup_destroy("watched", "billing")
    assert metrics.observer.observe(real_client, registered_topics(real_client), force=True)
    assert not [key for key in samples(metrics) if key[0].startswith("txmq_consumer_")]


def samples(metrics: CheckerMetrics) -> dict[tuple[str, tuple], float]:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def cluster(cluster_url):
    client = RedisCluster.from_url(cluster_url)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def test_lag_on_a_cluster_reads_each_partition_on_its_master(cluster, cluster_url):
    """A topic whose partitions live on all three masters: each partition's figures come from its own master."""
    settings = Settings(transaction_timeout=60, check_interval=60, heartbeat_interval=0.5, cluster=True)
    create_topic(cluster, "spread", 6)
    owners = {cluster.get_node_from_key(TopicKeys("spread", p, True).topic_stream).name for p in range(6)}
    assert len(owners) == 3, "the test needs the partitions on every master"
    commit_messages(cluster, "spread", count=30, settings=settings)
    delivered, pending = read_some(cluster, "spread", "billing", batch_size=6, settings=settings)

    billing = lag_rows(cluster)[("spread", "billing")]
    assert billing["partitions"] == 6
    assert (billing["undelivered"], billing["pending"], billing["dead_letters"]) == (30 - delivered, pending, 1)

    out = CliRunner().invoke(main, ["status", "--cluster", "--json", "--redis-url", cluster_url])
    assert out.exit_code == 0, out.output
    (row,) = [r for r in json.loads(out.output)["consumer_groups"] if r["group"] == "billing"]
    assert row["undelivered"] == 30 - delivered


def pending_ids(client, topic: str, group: str) -> list[bytes]:
    return [entry["message_id"] for entry in client.xpending_range(topic, group, "-", "+", 1000)]


def test_the_oldest_pending_is_the_longest_idle_not_the_lowest_id(real_client):
    """A delivery is not in id order once entries are claimed again: the lowest id, claimed a moment ago, is the
    youngest delivery, while an entry after it has been held for long (a hung handler). The figure is the longest
    idle time of the group's pending entries, beyond the first hundred too."""
    commit_messages(real_client, "held", count=3)
    real_client.xgroup_create("held", "billing", id="0")
    real_client.xreadgroup("billing", "hung", {"held": ">"})
    first, second, third = pending_ids(real_client, "held", "billing")
    real_client.xclaim("held", "billing", "hung", 0, [second], idle=500_000)  # held for 500 s
    real_client.xclaim("held", "billing", "other", 0, [first], idle=1_000)  # claimed again 1 s ago
    real_client.xclaim("held", "billing", "hung", 0, [third], idle=2_000)
    idle = lag_rows(real_client)[("held", "billing")]["oldest_pending_idle_seconds"]
    assert 500 <= idle < 600

    metrics = CheckerMetrics(observe_interval=3600)
    Checker(real_client, SETTINGS, metrics=metrics).run_round()
    assert (
        500
        <= samples(metrics)[("txmq_consumer_oldest_pending_idle_seconds", (("group", "billing"), ("topic", "held")))]
        < 600
    )


def test_the_longest_idle_is_found_past_the_first_hundred_pending(real_client):
    """150 pending: the first hundred claimed again just now, the last fifty delivered earlier and held since."""
    commit_messages(real_client, "piled", count=150)
    real_client.xgroup_create("piled", "billing", id="0")
    real_client.xreadgroup("billing", "hung", {"piled": ">"})
    ids = pending_ids(real_client, "piled", "billing")
    assert len(ids) == 150

    def held_for() -> float:
        return min(e["time_since_delivered"] for e in real_client.xpending_range("piled", "billing", "-", "+", 200))

    wait_until(lambda: held_for() >= 300)
    held = held_for() / 1000
    real_client.xclaim("piled", "billing", "other", 0, ids[:100])  # idle back to 0
    assert lag_rows(real_client)[("piled", "billing")]["oldest_pending_idle_seconds"] >= held
