"""``txmq demo``: a small order service, told end to end.

An order service keeps orders in its own database (SQLite here) and publishes ``orders`` events with
transactional messages: an order that is saved is published once, an order that fails is never seen, and an
order whose service crashed before it could say COMMIT is published by the check-back, once.

The demo may run on a user's Redis, again and again, and beside other services: each run has its own run id, producer
group and consumer group, reads back only its own transactions, ends whatever of its own is still in flight on the
way out, and removes the groups it made. Its checker looks at ``orders`` only.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from ..core.config import Settings
from ..core.keys import TopicKeys
from ..core.listener import TransactionListener
from ..core.message import LocalTransactionState, Message, TransactionSendResult
from ..core.protocol import EndSource
from ..core.topics import partition_keys
from ..sync.broker import RedisBroker
from ..sync.consumer import Consumer
from ..sync.producer import TransactionProducer
from .admin import forget_producer_group

logger = logging.getLogger(__name__)

TOPIC = "orders"
SERVICE = "order-service"
"""The story's service; a run's producer group is ``order-service-demo-<run id>``, so it never answers the checks of
a real group of that name."""
CHECK_IMMUNITY_SECONDS = 1.0
"""The demo's messages carry their own check immunity: the check-back comes after 1 s, and the checker keeps the
deployment's timing for every other transaction."""
RECOVERY_TIMEOUT = 30.0

ORDERS: list[tuple[int, float, str]] = [
    (1, 25.0, "ada"),
    (2, -5.0, "bob"),
    (3, 99.9, "cy"),
    (4, 0.0, "dee"),
    (5, 12.5, "eve"),
]
CRASHING_ORDER = (6, 42.0, "fay")
"""Saved locally, but the service 'crashes' before it can say COMMIT: the check-back must publish it."""

CheckerRunner = Callable[[str, Settings, str, threading.Event], None]
"""Runs a checker of one topic on a Redis URL until the event is set (the CLI supplies it: the core does not import
checker/)."""


class OrderDatabase:
    """The order service's own database, shared by its instances (an in-memory SQLite here)."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE TABLE orders (order_id INTEGER PRIMARY KEY, amount REAL, transaction_id TEXT)")
        self.db.execute("CREATE TABLE aborted (transaction_id TEXT PRIMARY KEY)")
        self.lock = threading.Lock()

    def save(self, order: dict[str, Any], transaction_id: str) -> bool:
        """Insert the order in one local transaction; False (rolled back) when it is invalid or a check-back already
        declared its transaction rolled back."""
        with self.lock:
            try:
                with self.db:
                    if self.db.execute("SELECT 1 FROM aborted WHERE transaction_id = ?", (transaction_id,)).fetchone():
                        raise ValueError(f"transaction {transaction_id} was rolled back by a check-back")
                    self.db.execute(
                        "INSERT INTO orders VALUES (?, ?, ?)", (order["order_id"], order["amount"], transaction_id)
                    )
                    if order["amount"] <= 0:
                        raise ValueError(f"order {order['order_id']}: amount must be positive")
            except ValueError:
                return False
        return True

    def committed(self, transaction_id: str | None) -> bool:
        """Whether the transaction's order is saved. When it is not, the transaction is marked aborted in the same
        step, so a local transaction still running can no longer save it: a check-back that answers ROLLBACK must
        not race a local transaction that would commit a moment later."""
        with self.lock, self.db:
            if self.db.execute("SELECT 1 FROM orders WHERE transaction_id = ?", (transaction_id,)).fetchone():
                return True
            self.db.execute("INSERT OR IGNORE INTO aborted VALUES (?)", (transaction_id,))
            return False


class OrderListener(TransactionListener):
    """Saves the order and the transaction id together, so a check-back can find out what happened."""

    def __init__(self, database: OrderDatabase, crash_on: int | None = None) -> None:
        self.database = database
        self.crash_on = crash_on

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        order = json.loads(message.body)
        if not self.database.save(order, message.transaction_id or ""):
            return LocalTransactionState.ROLLBACK
        if order["order_id"] == self.crash_on:
            return LocalTransactionState.UNKNOWN  # the process dies here: the outcome never reaches Redis
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return _decision(self.database, message.transaction_id)


def _decision(database: OrderDatabase, transaction_id: str | None) -> LocalTransactionState:
    return LocalTransactionState.COMMIT if database.committed(transaction_id) else LocalTransactionState.ROLLBACK


@dataclass
class DemoOutcome:
    """What one run did. ``transactions`` maps each order to its transaction id; ``ok`` means every committed order
    was consumed once, no rolled-back one was seen, and the crashed order was recovered by the check-back."""

    run_id: str = ""
    committed: list[int] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)
    transactions: dict[int, str] = field(default_factory=dict)
    crashed: bool = False
    recovered_after_seconds: float | None = None

    @property
    def ok(self) -> bool:
        recovered = not self.crashed or self.recovered_after_seconds is not None
        no_rollback_seen = not set(self.rolled_back) & set(self.consumed)
        return recovered and no_rollback_seen and sorted(self.committed) == sorted(self.consumed)

    @property
    def committed_transaction_ids(self) -> list[str]:
        return [self.transactions[order_id] for order_id in self.committed if order_id in self.transactions]


@dataclass
class _Run:
    """One run's names and state, shared by its steps."""

    redis_url: str
    console: Console
    outcome: DemoOutcome
    database: OrderDatabase = field(default_factory=OrderDatabase)
    sent: dict[int, TransactionSendResult] = field(default_factory=dict)

    @property
    def producer_group(self) -> str:
        return f"{SERVICE}-demo-{self.outcome.run_id}"


def run_demo(
    redis_url: str,
    console: Console,
    run_checker: CheckerRunner | None = None,
    *,
    recovery_timeout: float = RECOVERY_TIMEOUT,
) -> DemoOutcome:
    """Send the orders, crash on one when a checker is given, then read ``orders`` with a consumer group.

    Whatever happens, the run leaves none of its transactions in flight and removes its producer and consumer
    groups; it reads back, answers checks for and ends its own transactions only."""
    run = _Run(redis_url, console, DemoOutcome(run_id=uuid.uuid4().hex[:8]))
    consumer = Consumer(TOPIC, f"billing-demo-{run.outcome.run_id}", redis_url=redis_url, start_id="$", block=0.2)
    try:
        try:
            _send_orders(run, crash=run_checker is not None)
            if run_checker is not None:
                _recover_by_check_back(run, run_checker, recovery_timeout)
            _consume(consumer, run)
        finally:
            _end_what_is_left(run, consumer.client)
    finally:
        consumer.delete_group()
        consumer.close()
    return run.outcome


def _order_message(run_id: str, order_id: int, amount: float, customer: str) -> Message:
    body = json.dumps({"order_id": order_id, "amount": amount, "customer": customer}).encode()
    return Message(
        TOPIC,
        body,
        keys=f"order-{order_id}",
        tags="created",
        properties={"source": "demo", "demo_run": run_id},
        check_immunity_seconds=CHECK_IMMUNITY_SECONDS,
    )


def _send_orders(run: _Run, crash: bool) -> None:
    outcome = run.outcome
    sends = Table(title=f"order-service sends to topic '{TOPIC}' (demo run {outcome.run_id})")
    for column in ("order", "amount", "local transaction", "transaction id", "topic entry"):
        sends.add_column(column)
    orders = ORDERS + [CRASHING_ORDER] if crash else ORDERS
    listener = OrderListener(run.database, crash_on=CRASHING_ORDER[0] if crash else None)
    with TransactionProducer(run.producer_group, listener, redis_url=run.redis_url) as producer:
        for order_id, amount, customer in orders:
            result = producer.send_message_in_transaction(_order_message(outcome.run_id, order_id, amount, customer))
            run.sent[order_id] = result
            outcome.transactions[order_id] = result.transaction_id
            state = result.local_transaction_state
            if state is LocalTransactionState.COMMIT or order_id == CRASHING_ORDER[0]:
                outcome.committed.append(order_id)
            else:
                outcome.rolled_back.append(order_id)
            note = "  (service crashes here)" if state is LocalTransactionState.UNKNOWN else ""
            sends.add_row(
                str(order_id), f"{amount:.2f}", state.value + note, result.transaction_id, result.committed_id or "-"
            )
    outcome.crashed = crash
    run.console.print(sends)


def _recover_by_check_back(run: _Run, run_checker: CheckerRunner, recovery_timeout: float) -> None:
    """A new instance of the order service and a checker find out that order 6 was saved, and publish it."""
    crashed = run.sent[CRASHING_ORDER[0]]
    settings = Settings.from_env(redis_url=run.redis_url, heartbeat_interval=1.0)
    run.console.print(
        f"Order {CRASHING_ORDER[0]} is saved but its outcome never reached Redis. A new order-service "
        f"instance starts, and a checker asks it what happened once the message's check immunity "
        f"({CHECK_IMMUNITY_SECONDS:g} s) is over..."
    )
    stop = threading.Event()
    failures: list[BaseException] = []

    def work() -> None:
        try:
            run_checker(run.redis_url, settings, TOPIC, stop)
        except Exception as exc:  # noqa: BLE001 - re-raised in the demo's own thread below
            failures.append(exc)

    worker = threading.Thread(target=work, name="txmq-demo-checker", daemon=True)
    started = time.monotonic()
    recovered = None
    with TransactionProducer(
        run.producer_group, OrderListener(run.database), redis_url=run.redis_url, settings=settings
    ) as new:
        keys = _keys_of(new.client, crashed)
        worker.start()
        try:
            deadline = started + recovery_timeout
            while not failures and time.monotonic() < deadline:
                recovered = _ended_state(new.client, keys, crashed.transaction_id)
                if recovered:
                    break
                time.sleep(0.05)
        finally:
            stop.set()
            worker.join(10)
    if failures:
        raise failures[0]
    if recovered == LocalTransactionState.COMMIT.value:
        run.outcome.recovered_after_seconds = time.monotonic() - started
        run.console.print(
            f"[green]check-back[/]: order {CRASHING_ORDER[0]} committed after "
            f"{run.outcome.recovered_after_seconds:.1f} s"
        )
    elif recovered:
        run.console.print(f"[red]check-back ended order {CRASHING_ORDER[0]} with {recovered}, not COMMIT[/]")
    else:
        run.console.print(f"[red]check-back did not commit order {CRASHING_ORDER[0]} within {recovery_timeout:g} s[/]")


def _keys_of(client: Any, result: TransactionSendResult) -> TopicKeys:
    return partition_keys(client, result.topic)[result.partition]


def _ended_state(client: Any, keys: TopicKeys, transaction_id: str) -> str | None:
    """COMMIT or ROLLBACK once the transaction has ended (its ``ended`` record: ``<state>|<committed id>|...``)."""
    if client.hexists(keys.inflight, transaction_id):
        return None
    record = client.hget(keys.ended, transaction_id)
    if record is None:
        return None
    return record.decode().split("|", 1)[0]


def _consume(consumer: Consumer, run: _Run) -> None:
    outcome = run.outcome
    mine = {txid: order_id for order_id, txid in outcome.transactions.items()}
    received = Table(title=f"consumer group '{consumer.group}' reads '{TOPIC}'")
    for column in ("entry id", "keys", "tags", "body"):
        received.add_column(column)
    for _ in range(25):
        for msg in consumer.poll():
            consumer.ack(msg)
            if msg.transaction_id not in mine:
                continue  # another writer's entry: not part of this run's story
            outcome.consumed.append(mine[msg.transaction_id])
            received.add_row(msg.id, " ".join(msg.keys), msg.tags or "", msg.body.decode())
        if len(outcome.consumed) >= len(outcome.committed):
            break
    run.console.print(received)


def _end_what_is_left(run: _Run, client: Any) -> None:
    """End this run's transactions that are still in flight, as its order database says, then remove its producer
    group: a failed or interrupted run leaves nothing for a checker to find."""
    broker = RedisBroker(client)
    try:
        for order_id, result in run.sent.items():
            keys = _keys_of(client, result)
            if not client.hexists(keys.inflight, result.transaction_id):
                continue
            decision = _decision(run.database, result.transaction_id)
            broker.end_transaction(
                keys,
                result.transaction_id,
                run.producer_group,
                decision,
                source=EndSource.PRODUCER,
                remark="txmq demo: ended on its way out",
                half_id=result.half_id,
            )
            run.console.print(f"order {order_id} was still in flight: ended with {decision.value}")
    finally:
        broker.close()
    if run.sent and not forget_producer_group(client, run.producer_group):
        logger.warning("demo producer group %s has instances or check requests; left registered", run.producer_group)
