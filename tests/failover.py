"""Producers, a checker and consumers through a failover, and what each of them saw: the ground truth that the
failover tests (:mod:`tests.test_sentinel`, :mod:`tests.test_cluster_failover`) compare the topic streams with."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from redis_txmq import (
    Consumer,
    LocalTransactionState,
    Message,
    PrepareError,
    Settings,
    TransactionListener,
    TransactionProducer,
)
from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys, topic_stream_key
from redis_txmq.ops.admin import status
from redis_txmq.transport.connection import connect

FAST = {
    "transaction_timeout": 0.5,
    "check_interval": 0.5,
    "check_max": 3,
    "heartbeat_interval": 0.5,
    "claim_idle": 1.0,
}
"""Short intervals, and none of them a budget that a slow machine or a long failover spends: check_max counts the
checks that reached the service, which answers each COMMIT or ROLLBACK, so 3 is plenty; it used to count the checks
sent every check_interval while no producer could read them (the default 15 took 7.5 s of an 11 s failover on a
busy machine and dead-lettered two committed transactions; 3 made that one run in three), which a low budget
catches. claim_idle and heartbeat_interval only decide who takes work over and who is listed live."""

SENDERS = 3
DEADLINE_SECONDS = 120.0
"""How long to wait for acknowledged sends, and for everything to settle: a deadline, generous for a loaded machine
(it ends a test that fails, it never measures one that passes)."""


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

    def __init__(self, settings: Settings, topics: list[str]) -> None:
        self.settings = settings
        self.topics = topics
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
        workers = [self._send for _ in range(SENDERS)] + [self._check]
        workers += [lambda topic=topic: self._consume(topic) for topic in self.topics]
        self.threads = [threading.Thread(target=work, daemon=True) for work in workers]
        for thread in self.threads:
            thread.start()

    def _send(self) -> None:
        n = 0
        while not self.stop_sending.is_set():
            n += 1
            try:
                topic = self.topics[n % len(self.topics)]
                result = self.producer.send_message_in_transaction(Message(topic, b"order"), n)
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
        client = connect(self.settings.redis_url, cluster=self.settings.cluster)
        Checker(client, self.settings, scan_interval=0.1).run(self.stop_all)
        client.close()

    def _consume(self, topic: str) -> None:
        def record(message: Any) -> None:
            with self.lock:
                self.delivered[message.transaction_id] += 1

        with Consumer(topic, "billing", settings=self.settings, block=0.1, min_idle_time=1.0) as consumer:
            stopper = threading.Thread(target=lambda: (self.stop_all.wait(), consumer.stop()), daemon=True)
            stopper.start()
            consumer.run(record)

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def wait_for_acks(self, count: int, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while self.acked_count() < count:
            assert time.monotonic() < deadline, (
                f"only {self.acked_count()} commits acknowledged {what}: {self.outcomes}"
            )
            time.sleep(0.05)

    def settle(self, client: Any, visible: Callable[[], set[str]]) -> None:
        """Until nothing is in flight and the consumer received every visible transaction."""
        deadline = time.monotonic() + DEADLINE_SECONDS
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


def appended(client: Any, topics: list[str]) -> collections.Counter[str]:
    """Transaction id -> how many times it is in the topic streams (once, if all is well)."""
    found: collections.Counter[str] = collections.Counter()
    for topic in topics:
        for _id, fields in client.xrange(topic_stream_key(topic)):
            found[fields[b"transaction_id"].decode()] += 1
    return found


def dead_lettered(client: Any, topics: list[str]) -> dict[str, str]:
    """Transaction id -> the reason the checker gave it up, for every topic."""
    found: dict[str, str] = {}
    for topic in topics:
        for _id, fields in client.xrange(TopicKeys(topic).dead_stream):
            found[fields[b"transaction_id"].decode()] = fields.get(b"dead_reason", b"").decode()
    return found


def judge(run: Run, appended: collections.Counter[str], durability: str, what: str, dead: dict[str, str]) -> str:
    """Assert what every level keeps (nothing twice, nothing rolled back or uncommitted visible, every visible one
    delivered, nothing dead-lettered) and, at ``replica``, that nothing acknowledged or committed is missing;
    returns the counts.

    Nothing may be dead-lettered at any level: every check the service reads is answered COMMIT or ROLLBACK, and
    the checks sent while no producer could read them (the failover, the readers reconnecting) do not count towards
    ``check_max``, however slow the machine; a dead letter here is a transaction that needs an operator because
    Redis failed over."""
    committed, rolled_back, acked = run.orders.committed, run.orders.rolled_back, run.acked
    lost_acked = acked - appended.keys()
    lost_committed = committed - appended.keys()
    summary = (
        f"{what}: {len(acked)} acknowledged commits, {len(committed)} committed, {sum(appended.values())} visible; "
        f"lost: {len(lost_acked)} acknowledged, {len(lost_committed)} committed; sends: {dict(run.outcomes)}; "
        f"deliveries {sum(run.delivered.values())} of {len(run.delivered)}; dead-lettered {len(dead)}"
    )
    twice = {tx: n for tx, n in appended.items() if n > 1}
    assert not twice, f"appended more than once: {twice}"
    assert not dead, f"dead-lettered: {sorted(collections.Counter(dead.values()).items())}; {summary}"
    phantoms = appended.keys() - committed
    assert not phantoms, f"visible without a committed local transaction: {sorted(phantoms)[:10]}"
    assert not appended.keys() & rolled_back, "rolled back transactions are visible"
    assert appended.keys() <= run.delivered.keys(), "visible transactions never delivered"
    if durability == "replica":
        assert not lost_acked, f"acknowledged commits lost at durability replica: {sorted(lost_acked)[:10]}"
        assert not lost_committed, f"committed transactions lost at durability replica: {sorted(lost_committed)[:10]}"
    return summary
