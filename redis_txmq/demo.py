"""``txmq demo``: a small order service, told end to end.

An order service keeps orders in its own database (SQLite here) and publishes ``orders`` events with
transactional messages: an order that is saved is published once, an order that fails is never seen, and an
order whose service crashed before it could say COMMIT is published by the check-back, once.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from .config import Settings
from .consumer import Consumer
from .listener import TransactionListener
from .message import LocalTransactionState, Message
from .producer import TransactionProducer

TOPIC = "orders"
PRODUCER_GROUP = "order-service"

ORDERS: list[tuple[int, float, str]] = [
    (1, 25.0, "ada"),
    (2, -5.0, "bob"),
    (3, 99.9, "cy"),
    (4, 0.0, "dee"),
    (5, 12.5, "eve"),
]
CRASHING_ORDER = (6, 42.0, "fay")
"""Saved locally, but the service 'crashes' before it can say COMMIT: the check-back must publish it."""

CheckerRunner = Callable[[str, Settings, threading.Event], None]
"""Runs a checker on a Redis URL until the event is set (the CLI supplies it: the core does not import checker/)."""


class OrderDatabase:
    """The order service's own database, shared by its instances (an in-memory SQLite here)."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE TABLE orders (order_id INTEGER PRIMARY KEY, amount REAL, transaction_id TEXT)")
        self.lock = threading.Lock()

    def save(self, order: dict[str, Any], transaction_id: str) -> bool:
        """Insert the order in one local transaction; False (rolled back) when it is invalid."""
        with self.lock:
            try:
                with self.db:
                    self.db.execute(
                        "INSERT INTO orders VALUES (?, ?, ?)", (order["order_id"], order["amount"], transaction_id)
                    )
                    if order["amount"] <= 0:
                        raise ValueError(f"order {order['order_id']}: amount must be positive")
            except ValueError:
                return False
        return True

    def has_transaction(self, transaction_id: str | None) -> bool:
        with self.lock:
            row = self.db.execute("SELECT 1 FROM orders WHERE transaction_id = ?", (transaction_id,)).fetchone()
        return row is not None


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
        found = self.database.has_transaction(message.transaction_id)
        return LocalTransactionState.COMMIT if found else LocalTransactionState.ROLLBACK


@dataclass
class DemoOutcome:
    committed: list[int] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)
    recovered_after_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return sorted(self.committed) == sorted(self.consumed) and not set(self.rolled_back) & set(self.consumed)


def _order_message(order_id: int, amount: float, customer: str) -> Message:
    body = json.dumps({"order_id": order_id, "amount": amount, "customer": customer}).encode()
    return Message(TOPIC, body, keys=f"order-{order_id}", tags="created", properties={"source": "demo"})


def run_demo(redis_url: str, console: Console, run_checker: CheckerRunner | None = None) -> DemoOutcome:
    """Send the orders, crash on one when a checker is given, then read ``orders`` with a consumer group."""
    group = f"billing-demo-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(TOPIC, group, redis_url=redis_url, start_id="$", block=0.2)
    database = OrderDatabase()
    outcome = DemoOutcome()
    try:
        _send_orders(redis_url, database, console, outcome, crash=run_checker is not None)
        if run_checker is not None:
            _recover_by_check_back(redis_url, database, console, outcome, run_checker)
        _consume(consumer, console, outcome)
    finally:
        consumer.delete_group()
        consumer.close()
    return outcome


def _send_orders(redis_url: str, database: OrderDatabase, console: Console, outcome: DemoOutcome, crash: bool) -> None:
    sends = Table(title=f"order-service sends to topic '{TOPIC}'")
    for column in ("order", "amount", "local transaction", "transaction id", "topic entry"):
        sends.add_column(column)
    orders = ORDERS + [CRASHING_ORDER] if crash else ORDERS
    listener = OrderListener(database, crash_on=CRASHING_ORDER[0] if crash else None)
    with TransactionProducer(PRODUCER_GROUP, listener, redis_url=redis_url) as producer:
        for order_id, amount, customer in orders:
            result = producer.send_message_in_transaction(_order_message(order_id, amount, customer))
            state = result.local_transaction_state
            if state is LocalTransactionState.COMMIT or order_id == CRASHING_ORDER[0]:
                outcome.committed.append(order_id)
            else:
                outcome.rolled_back.append(order_id)
            note = "  (service crashes here)" if state is LocalTransactionState.UNKNOWN else ""
            sends.add_row(
                str(order_id), f"{amount:.2f}", state.value + note, result.transaction_id, result.committed_id or "-"
            )
    console.print(sends)


def _recover_by_check_back(
    redis_url: str, database: OrderDatabase, console: Console, outcome: DemoOutcome, run_checker: CheckerRunner
) -> None:
    """A new instance of the order service and a checker find out that order 6 was saved, and publish it."""
    settings = Settings.from_env(
        redis_url=redis_url, transaction_timeout=1.0, check_interval=1.0, heartbeat_interval=1.0
    )
    console.print(
        f"Order {CRASHING_ORDER[0]} is saved but its outcome never reached Redis. A new order-service "
        "instance starts, and a checker (transaction_timeout=1s) asks it what happened..."
    )
    stop = threading.Event()
    worker = threading.Thread(target=run_checker, args=(redis_url, settings, stop), daemon=True)
    started = time.monotonic()
    with TransactionProducer(PRODUCER_GROUP, OrderListener(database), redis_url=redis_url, settings=settings) as new:
        worker.start()
        try:
            deadline = started + 30
            while not (recovered := _committed_order(new.client, CRASHING_ORDER[0])) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            worker.join(10)
    if recovered:
        outcome.recovered_after_seconds = time.monotonic() - started
        console.print(
            f"[green]check-back[/]: order {CRASHING_ORDER[0]} committed after {outcome.recovered_after_seconds:.1f} s"
        )
    else:
        console.print(f"[red]check-back did not commit order {CRASHING_ORDER[0]} within 30 s[/]")


def _committed_order(client: Any, order_id: int) -> bool:
    return any(f"order-{order_id}".encode() == fields.get(b"keys") for _, fields in client.xrevrange(TOPIC, count=20))


def _consume(consumer: Consumer, console: Console, outcome: DemoOutcome) -> None:
    received = Table(title=f"consumer group '{consumer.group}' reads '{TOPIC}'")
    for column in ("entry id", "keys", "tags", "body"):
        received.add_column(column)
    for _ in range(25):
        for msg in consumer.poll():
            outcome.consumed.append(json.loads(msg.body)["order_id"])
            received.add_row(msg.id, " ".join(msg.keys), msg.tags or "", msg.body.decode())
            consumer.ack(msg)
        if len(outcome.consumed) >= len(outcome.committed):
            break
    console.print(received)
