"""Every part works as an ACL user limited to the rules of :mod:`redis_txmq.ops.acl` (what ``txmq acl`` prints), and
those users can do no more than their part: a wrong key or command is refused (NOPERM)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionProducer, create_topic
from redis_txmq.checker import Checker
from redis_txmq.cli import main
from redis_txmq.core.keys import TopicKeys
from redis_txmq.ops.acl import acl_rules

from .helpers import ScriptedListener, wait_until

pytestmark = pytest.mark.real

TOPICS = ["orders", "payments"]
GROUP, CONSUMER_GROUP = "orders-service", "billing"
FAST = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.3, claim_idle=1.0)
COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN


@pytest.fixture
def users(real_client: redis.Redis, redis_url: str) -> Iterator[dict[str, str]]:
    """Role -> the URL of an ACL user with that role's rules on the session's server (removed afterwards)."""
    rules = {
        "producer": acl_rules("producer", topics=TOPICS, producer_groups=[GROUP], durability="replica"),
        "checker": acl_rules("checker", topics=TOPICS, durability="replica"),
        "consumer": acl_rules("consumer", topics=TOPICS, consumer_group=CONSUMER_GROUP),
        "spark": acl_rules("spark", topics=TOPICS),
        "spark-writer": acl_rules("spark-writer", topics=TOPICS, durability="replica"),
    }
    host = redis_url.split("://", 1)[1].split("/", 1)[0]
    urls = {}
    for role, rule in rules.items():
        real_client.execute_command("ACL", "SETUSER", f"txmq-{role}", "on", f">pw-{role}", *rule)
        urls[role] = f"redis://txmq-{role}:pw-{role}@{host}/0"
    create_topic(real_client, "payments", 2)
    try:
        yield urls
    finally:
        real_client.execute_command("ACL", "DELUSER", *(f"txmq-{role}" for role in rules))


class Service:
    """Commits, rolls back or leaves UNKNOWN as asked; the check-back commits what it left."""

    def execute_local_transaction(self, message: Message, arg: LocalTransactionState) -> LocalTransactionState:
        return arg

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return COMMIT


def test_each_part_works_with_its_least_privilege_user(users: dict[str, str], real_client: redis.Redis, spark) -> None:
    from redis_txmq import TransactionListener

    class Listener(Service, TransactionListener):
        pass

    settings = replace(FAST, redis_url=users["producer"])
    stop = threading.Event()
    checker_client = redis.Redis.from_url(users["checker"])
    checking = threading.Thread(target=Checker(checker_client, FAST, scan_interval=0.05).run, args=(stop,))
    checking.start()
    try:
        with (
            TransactionProducer(GROUP, Listener(), settings=settings) as producer,
            TransactionProducer(GROUP, Listener(), settings=settings, oneway_end=True) as oneway,
        ):
            sent = [
                producer.send_message_in_transaction(Message(topic, f"{topic} {arg.value}".encode(), keys="k"), arg)
                for topic in TOPICS
                for arg in (COMMIT, ROLLBACK, UNKNOWN)
            ]
            sent.append(oneway.send_message_in_transaction(Message("orders", b"one-way"), COMMIT))
            both = [Message("orders", b"orders of several"), Message("payments", b"payments of several")]
            sent += producer.send_messages_in_transaction(both, COMMIT)
            assert oneway.flush(10)
            assert all(result.end_error is None for result in sent)
            in_flight = [TopicKeys("orders").inflight, TopicKeys("payments", 0, True).inflight]
            wait_until(lambda: all(real_client.hlen(key) == 0 for key in in_flight), timeout=15)
    finally:
        stop.set()
        checking.join(10)
        checker_client.close()
    committed = {r.transaction_id for r in sent if r.local_transaction_state in (COMMIT, UNKNOWN)}

    received = set()
    for topic in TOPICS:
        with Consumer(
            topic, CONSUMER_GROUP, redis_url=users["consumer"], block=0.1, max_deliveries=1, min_idle_time=0.1
        ) as consumer:
            for _ in range(3):  # every partition of the topic
                for message in consumer.poll():
                    received.add(message.transaction_id)
                    if message.body != b"orders UNKNOWN":
                        consumer.ack(message)  # the other one is redelivered once, then dead-lettered
            if topic == "orders":  # the unacked one comes back past max_deliveries: dead-lettered by the consumer

                def dead_lettered(c: Consumer = consumer) -> bool:
                    c.poll(timeout=0.05)
                    return real_client.xlen(TopicKeys("orders").consumer_dead_stream(CONSUMER_GROUP)) == 1

                wait_until(dead_lettered, timeout=10)
    assert received == committed

    report = CliRunner().invoke(main, ["status", "--json", "--redis-url", users["checker"]])  # an operator's view
    assert report.exit_code == 0, report.output
    assert "pw-checker" not in report.output
    assert {t["stream"]: t["committed"] for t in json.loads(report.output)["topics"]}["orders"] == 4
    rows = spark.read.format("redis-txmq").option("redis.url", users["spark"]).option("topics", ",".join(TOPICS)).load()
    assert {r.transaction_id for r in rows.select("transaction_id").collect()} == committed

    written = spark.createDataFrame([("from spark", "k")], "body string, keys string")
    writer = written.write.format("redis-txmq").option("redis.url", users["spark-writer"]).mode("append")
    writer.option("topic", "payments").save()
    payments = [f[b"body"] for s in ("payments#0", "payments#1") for _, f in real_client.xrange(s)]
    assert payments.count(b"from spark") == 1 and real_client.zcard("txmq:jobs") == 0


def test_an_asyncio_producers_batched_prepares_and_ends_work_with_its_least_privilege_user(
    users: dict[str, str], real_client: redis.Redis
) -> None:
    """Sends in flight together go out as one call of prepare_halves / end_transactions (the asyncio lane): every
    command those scripts run is in the producer's rules, or the whole call is refused (NOPERM)."""
    from redis_txmq.asyncio import TransactionListener as AsyncListener
    from redis_txmq.asyncio import TransactionProducer as AsyncProducer

    from .test_lane_batch import watch_batches

    class Listener(AsyncListener):
        async def execute_local_transaction(self, message: Message, arg: LocalTransactionState) -> Any:
            return arg

        async def check_local_transaction(self, message: Message) -> Any:
            return COMMIT

    async def scenario() -> tuple[list[Any], list[tuple[str, int]], list[tuple[str, int]]]:
        settings = replace(FAST, redis_url=users["producer"], transaction_timeout=60)
        async with AsyncProducer(GROUP, Listener(), settings=settings) as producer:
            lane = producer.broker.runner._lane
            prepares, ends = watch_batches(lane, "prepares"), watch_batches(lane, "ends")
            sends = [
                producer.send_message_in_transaction(Message("orders", b"%d" % i), COMMIT if i % 4 else ROLLBACK)
                for i in range(32)
            ]
            return await asyncio.gather(*sends), prepares, ends

    results, prepares, ends = asyncio.run(scenario())
    assert max(calls for _, calls in prepares) > 1 and max(calls for _, calls in ends) > 1, "sent in batches"
    assert not [r.end_error for r in results if r.end_error]
    assert real_client.xlen(TopicKeys("orders").topic_stream) == 24
    assert real_client.hlen(TopicKeys("orders").inflight) == 0


@pytest.mark.parametrize("topic", TOPICS)
def test_a_consumer_runs_stops_and_hands_back_with_its_least_privilege_user(
    users: dict[str, str], real_client: redis.Redis, topic: str
) -> None:
    """The consumer's lease, its check before each handler call, its hand-back on stop and another consumer's
    taking over what was handed back (and the removal of the gone consumer) all run under the consumer's rules, on
    a topic of one partition and one of two."""
    with TransactionProducer(GROUP, ScriptedListener(), client=real_client) as producer:
        for n in range(6):
            producer.send_message_in_transaction(Message(topic, b"%d" % n, keys=f"k{n % 2}"), COMMIT)
    url = users["consumer"]
    options: dict[str, Any] = {"block": 0.05, "batch_size": 10, "min_idle_time": 3600}
    with Consumer(topic, CONSUMER_GROUP, "first", redis_url=url, **options) as first:

        def handle(message: Any) -> None:
            first.stop()

        assert first.run(handle) == 1
    with Consumer(topic, CONSUMER_GROUP, "second", redis_url=url, max_deliveries=1, **options) as second:
        taken: list[Any] = []
        wait_until(lambda: taken.extend(second.poll(0.05)) or len(taken) == 5)
        for message in taken:
            second.ack(message)
    streams = [topic] if topic == "orders" else [f"{topic}#0", f"{topic}#1"]
    assert sum(real_client.xpending(s, CONSUMER_GROUP)["pending"] for s in streams) == 0
    assert real_client.keys("txmq:*:consumer-dead:*") == [], "nothing dead-lettered"


def test_the_users_can_do_no_more_than_their_part(users: dict[str, str]) -> None:
    refused = [
        ("producer", ("GET", "somebody-elses-key")),
        ("producer", ("XADD", "invoices", "*", "f", "v")),
        ("producer", ("FLUSHALL",)),
        ("consumer", ("HSET", "txmq:{orders}:inflight", "f", "v")),
        ("consumer", ("XADD", "txmq:{orders}:consumer-dead:payroll", "*", "f", "v")),
        ("consumer", ("HSET", "txmq:{orders}:consumer-leases:payroll", "c", "1")),
        ("spark", ("XADD", "orders", "*", "f", "v")),
        ("spark", ("XGROUP", "CREATE", "orders", "spark", "$", "MKSTREAM")),
        ("checker", ("CONFIG", "GET", "requirepass")),
    ]
    for role, command in refused:
        with redis.Redis.from_url(users[role]) as client:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)


def test_the_writing_roles_may_confirm_at_their_durability_level(users: dict[str, str]) -> None:
    """The users above were made for durability replica: WAIT is theirs (a reader's is refused); without a level
    the rules leave it out."""
    for role in ("producer", "checker", "spark-writer"):
        with redis.Redis.from_url(users[role]) as client:
            assert client.execute_command("WAIT", 0, 0) == 0
    with redis.Redis.from_url(users["spark"]) as client, pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command("WAIT", 0, 0)
    assert "+wait" not in acl_rules("producer", topics=TOPICS, producer_groups=[GROUP])
    assert "+waitaof" in acl_rules("checker", topics=TOPICS, durability="aof")


def test_txmq_acl_prints_the_setuser_line() -> None:
    out = CliRunner().invoke(main, ["acl", "consumer", "--topic", "orders", "--consumer-group", "billing"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("ACL SETUSER txmq-consumer on >YOUR-PASSWORD resetkeys ~orders ~orders#* ")
    assert "~txmq:{orders}:consumer-dead:billing ~txmq:{orders#*}:consumer-dead:billing " in out.output
    assert "~txmq:{orders}:consumer-leases:billing ~txmq:{orders#*}:consumer-leases:billing resetchannels" in out.output
    refused = CliRunner().invoke(main, ["acl", "producer", "--topic", "orders"])
    assert refused.exit_code == 1 and "name its producer group" in refused.output
