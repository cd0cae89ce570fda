"""Redis behind Sentinel: the ``redis+sentinel://`` URL for every part, and failovers counted against ground truth.

A failover test runs producers (sync, three threads), a checker and a consumer on one Sentinel URL, forces a
failover (SIGKILL of the master, or ``SENTINEL FAILOVER``) while they send, lets everything settle, then compares
the topic stream with what the services know: the transactions whose local transaction committed (ground truth)
and the sends acknowledged as committed (COMMIT with no end error). At durability ``replica`` no acknowledged commit
and no committed transaction may be missing; at ``master`` whatever went missing is reported (the price of that
level). At every level nothing is duplicated and nothing rolled back is visible."""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from checker import Checker
from redis_txmq import (
    Consumer,
    LocalTransactionState,
    Message,
    PrepareError,
    Settings,
    TransactionListener,
    TransactionProducer,
)
from redis_txmq.admin import status
from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer
from redis_txmq.cli import main
from redis_txmq.connection import connect
from redis_txmq.keys import topic_stream_key

from .sentinel_fixture import SentinelGroup

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "orders"
FAST = {"transaction_timeout": 0.5, "check_interval": 0.5, "heartbeat_interval": 0.5, "claim_idle": 1.0}
SENDERS = 3
ACKED_BEFORE, ACKED_AFTER = 150, 150
"""Acknowledged commits to see before the failover, and after it."""
SETTLE_SECONDS = 60.0


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


class Orders(TransactionListener):
    """The service: every fifth order rolls back; the others commit (the ground truth is :attr:`committed`).

    A check that finds no commit fences the transaction, as a real service must (the transaction log's fence): a
    check can overtake a slow prepare (one that waited for its replica), and the local transaction that runs after
    it must then roll back, not commit what the check already rolled back."""

    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        with self.lock:
            transaction_id = message.transaction_id or ""
            if arg % 5 == 4 or transaction_id in self.rolled_back:
                self.rolled_back.add(transaction_id)
                return LocalTransactionState.ROLLBACK
            self.committed.add(transaction_id)
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        with self.lock:
            if message.transaction_id in self.committed:
                return LocalTransactionState.COMMIT
            self.rolled_back.add(message.transaction_id or "")
        return LocalTransactionState.ROLLBACK


class Run:
    """Senders, a checker and a consumer on one Sentinel URL, and what each of them saw."""

    def __init__(self, url: str, durability: str) -> None:
        self.settings = Settings(redis_url=url, durability=durability, **FAST)  # type: ignore[arg-type]
        self.orders = Orders()
        self.acked: set[str] = set()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.delivered: collections.Counter[str] = collections.Counter()
        self.stop_sending = threading.Event()
        self.stop_all = threading.Event()
        self.lock = threading.Lock()
        self.producer = TransactionProducer("sentinel-orders", self.orders, settings=self.settings)
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self.producer.start()
        workers = [self._send for _ in range(SENDERS)] + [self._check, self._consume]
        self.threads = [threading.Thread(target=work, daemon=True) for work in workers]
        for thread in self.threads:
            thread.start()

    def _send(self) -> None:
        n = 0
        while not self.stop_sending.is_set():
            n += 1
            try:
                result = self.producer.send_message_in_transaction(Message(TOPIC, b"order"), n)
            except PrepareError:
                with self.lock:
                    self.outcomes["prepare failed"] += 1
                time.sleep(0.01)
                continue
            state = result.local_transaction_state.value
            with self.lock:
                self.outcomes[f"{state}{' end_error' if result.end_error else ''}"] += 1
                if result.local_transaction_state is LocalTransactionState.COMMIT and result.end_error is None:
                    self.acked.add(result.transaction_id)

    def _check(self) -> None:
        client = connect(self.settings.redis_url)
        Checker(client, self.settings, scan_interval=0.1).run(self.stop_all)
        client.close()

    def _consume(self) -> None:
        def record(message: Any) -> None:
            with self.lock:
                self.delivered[message.transaction_id] += 1

        with Consumer(TOPIC, "billing", redis_url=self.settings.redis_url, block=0.1, min_idle_time=1.0) as consumer:
            stopper = threading.Thread(target=lambda: (self.stop_all.wait(), consumer.stop()), daemon=True)
            stopper.start()
            consumer.run(record)

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def wait_for_acks(self, count: int, what: str) -> None:
        deadline = time.monotonic() + 60
        while self.acked_count() < count:
            assert time.monotonic() < deadline, (
                f"only {self.acked_count()} commits acknowledged {what}: {self.outcomes}"
            )
            time.sleep(0.05)

    def settle(self, client: Any, visible: Any) -> None:
        """Until nothing is in flight and the consumer received every visible transaction."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            try:
                in_flight = sum(t["in_flight"] for t in status(client, live_seconds=1.5)["topics"])
                seen = visible()
            except redis.RedisError:
                in_flight, seen = -1, set()
            with self.lock:
                undelivered = seen - self.delivered.keys()
            if in_flight == 0 and not undelivered:
                return
            assert time.monotonic() < deadline, f"not settled: {in_flight} in flight, {len(undelivered)} undelivered"
            time.sleep(0.2)

    def stop(self) -> None:
        self.stop_sending.set()
        self.stop_all.set()
        for thread in self.threads:
            thread.join(15)
        self.producer.shutdown()


@pytest.mark.parametrize("fault", ["kill_master", "sentinel_failover"])
@pytest.mark.parametrize("durability", ["replica", "master"])
def test_a_failover_loses_no_acknowledged_commit_at_durability_replica(
    sentinel_group: SentinelGroup, durability: str, fault: str, report: list[str]
) -> None:
    run = Run(sentinel_group.url, durability)
    run.start()
    client = connect(sentinel_group.url)
    try:
        run.wait_for_acks(ACKED_BEFORE, "before the failover")
        began = time.monotonic()
        new_master = sentinel_group.kill_master() if fault == "kill_master" else sentinel_group.failover()
        recovered = time.monotonic() - began
        run.wait_for_acks(run.acked_count() + ACKED_AFTER, "after the failover")
        run.stop_sending.set()

        def visible() -> collections.Counter[str]:
            entries = client.xrange(topic_stream_key(TOPIC))
            return collections.Counter(fields[b"transaction_id"].decode() for _id, fields in entries)

        run.settle(client, lambda: set(visible()))
        appended = visible()
    finally:
        run.stop()
        client.close()

    committed, rolled_back, acked = run.orders.committed, run.orders.rolled_back, run.acked
    lost_acked = acked - appended.keys()
    lost_committed = committed - appended.keys()
    report.append(
        f"sentinel {fault}, durability {durability}: {len(acked)} acknowledged commits, {len(committed)} committed, "
        f"{sum(appended.values())} visible; lost: {len(lost_acked)} acknowledged, {len(lost_committed)} committed; "
        f"new master :{new_master} serving after {recovered:.1f} s; sends: {dict(run.outcomes)}; "
        f"deliveries {sum(run.delivered.values())} of {len(run.delivered)}"
    )
    twice = {tx: n for tx, n in appended.items() if n > 1}
    assert not twice, f"appended more than once: {twice}"
    phantoms = appended.keys() - committed
    assert not phantoms, f"visible without a committed local transaction: {sorted(phantoms)[:10]}"
    assert not appended.keys() & rolled_back
    assert appended.keys() <= run.delivered.keys()
    if durability == "replica":
        assert not lost_acked, f"acknowledged commits lost at durability replica: {sorted(lost_acked)[:10]}"
        assert not lost_committed, f"committed transactions lost at durability replica: {sorted(lost_committed)[:10]}"


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
