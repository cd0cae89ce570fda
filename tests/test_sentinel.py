"""Redis behind Sentinel: the ``redis+sentinel://`` URL for every part, and failovers counted against ground truth.

A failover test runs producers (sync, three threads), a checker and a consumer on one Sentinel URL, forces a
failover (SIGKILL of the master, or ``SENTINEL FAILOVER``) while they send, lets everything settle, then compares
the topic stream with what the services know: the transactions whose local transaction committed (ground truth)
and the sends acknowledged as committed (COMMIT with no end error). At durability ``replica`` no acknowledged commit
and no committed transaction may be missing; at ``master`` whatever went missing is reported (the price of that
level). At every level nothing is duplicated and nothing rolled back is visible."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from redis_txmq import (
    Consumer,
    LocalTransactionState,
    Message,
    Settings,
    TransactionProducer,
)
from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer
from redis_txmq.cli import main
from redis_txmq.core.keys import topic_stream_key
from redis_txmq.transport.connection import connect

from .failover import FAST, Run, appended, dead_lettered, judge
from .sentinel_fixture import SentinelGroup

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(480)]

TOPIC = "orders"
ACKED_BEFORE, ACKED_AFTER = 150, 150
"""Acknowledged commits to see before the failover, and after it."""


def commit(_message: Message) -> LocalTransactionState:
    return LocalTransactionState.COMMIT


def test_every_part_works_through_a_sentinel_url(sentinel_group: SentinelGroup) -> None:
    url = sentinel_group.url
    with TransactionProducer("sentinel-orders", checker=commit, redis_url=url) as producer:
        with producer.transaction(Message(TOPIC, b"sync")) as tx:
            pass
    assert tx.result is not None and tx.result.end_error is None

    async def send_async() -> str:
        async with AsyncTransactionProducer("sentinel-orders", checker=commit, redis_url=url) as async_producer:
            async with async_producer.transaction(Message(TOPIC, b"async")) as atx:
                pass
        assert atx.result is not None
        return atx.result.transaction_id

    import asyncio

    async_id = asyncio.run(send_async())
    with Consumer(TOPIC, "billing", redis_url=url, block=0.1) as consumer:
        received = {m.transaction_id: m.body for m in consumer.poll()}
    assert received == {tx.transaction_id: b"sync", async_id: b"async"}
    with connect(url) as client:
        master = client.connection_pool.get_master_address()
        assert master[1] == sentinel_group.master_port()


@pytest.mark.parametrize("fault", ["kill_master", "sentinel_failover"])
@pytest.mark.parametrize("durability", ["replica", "master"])
def test_a_failover_loses_no_acknowledged_commit_at_durability_replica(
    sentinel_group: SentinelGroup, durability: str, fault: str, report: list[str]
) -> None:
    settings = Settings(redis_url=sentinel_group.url, durability=durability, **FAST)  # type: ignore[arg-type]
    run = Run(settings, [TOPIC])
    run.start()
    client = connect(sentinel_group.url)
    try:
        run.wait_for_acks(ACKED_BEFORE, "before the failover")
        began = time.monotonic()
        new_master = sentinel_group.kill_master() if fault == "kill_master" else sentinel_group.failover()
        recovered = time.monotonic() - began
        run.wait_for_acks(run.acked_count() + ACKED_AFTER, "after the failover")
        run.stop_sending.set()

        run.settle(client, lambda: set(appended(client, [TOPIC])))
        visible = appended(client, [TOPIC])
        dead = dead_lettered(client, [TOPIC])
    finally:
        run.stop()
        client.close()

    what = f"sentinel {fault}, durability {durability}, new master :{new_master} serving after {recovered:.1f} s"
    report.append(judge(run, visible, durability, what, dead))


def test_the_cli_and_spark_reach_the_master_through_the_sentinels(sentinel_group: SentinelGroup, spark) -> None:
    url = sentinel_group.url
    with TransactionProducer("sentinel-orders", checker=commit, redis_url=url) as producer:
        with producer.transaction(Message(TOPIC, b"for spark")) as tx:
            pass
    report = CliRunner().invoke(main, ["status", "--json", "--redis-url", url])
    assert report.exit_code == 0, report.output
    (server,) = json.loads(report.output)["servers"]
    assert server["address"].startswith(f"127.0.0.1:{sentinel_group.master_port()} ")
    assert server["role"] == "master" and len(server["replicas"]) == 1
    assert server["durability_levels"][:2] == ["master", "replica"]
    rows = (
        spark.read.format("redis-txmq")
        .option("redis.url", url)
        .option("topics", TOPIC)
        .load()
        .select("transaction_id", "body")
        .collect()
    )
    assert [(r.transaction_id, bytes(r.body)) for r in rows] == [(tx.transaction_id, b"for spark")]


def test_the_sentinels_password_is_kept_apart_from_the_datas_and_out_of_errors() -> None:
    group = SentinelGroup(data_password="data-secret", sentinel_password="sentinel-secret").start()
    try:
        with TransactionProducer(
            "sentinel-orders",
            checker=commit,
            redis_url=group.url + "?sentinel_password=sentinel-secret",
        ) as producer:
            with producer.transaction(Message(TOPIC, b"authenticated twice")) as tx:
                pass
        assert tx.result is not None and tx.result.end_error is None
        with connect(group.url, sentinel_password="sentinel-secret") as client:
            assert client.xlen(topic_stream_key(TOPIC)) == 1
        wrong = group.url + "?sentinel_password=not-it"
        producer = TransactionProducer("sentinel-orders", checker=commit, redis_url=wrong)
        with pytest.raises(Exception) as refused:
            producer.start()
        producer.shutdown()
        assert "not-it" not in str(refused.value) and "data-secret" not in str(refused.value)
    finally:
        group.stop()


def test_tls_to_the_sentinels_and_to_redis() -> None:
    group = SentinelGroup(tls=True).start()
    try:
        assert group.url.startswith("rediss+sentinel://")
        with TransactionProducer("sentinel-orders", checker=commit, redis_url=group.url) as producer:
            with producer.transaction(Message(TOPIC, b"over TLS")) as tx:
                pass
        assert tx.result is not None and tx.result.end_error is None
        with Consumer(TOPIC, "billing", redis_url=group.url, block=0.1) as consumer:
            assert [m.transaction_id for m in consumer.poll()] == [tx.transaction_id]
        new_master = group.kill_master()  # the TLS connections follow a failover too
        with TransactionProducer("sentinel-orders", checker=commit, redis_url=group.url) as producer:
            with producer.transaction(Message(TOPIC, b"after the failover")) as after:
                pass
        assert after.result is not None and after.result.end_error is None
        with connect(group.url) as client:
            assert client.connection_pool.get_master_address()[1] == new_master
    finally:
        group.stop()
