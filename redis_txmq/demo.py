"""``txmq demo``: a small order service, told end to end.

An order service keeps orders in its own database (SQLite here) and publishes ``orders`` events with
transactional messages: an order that is saved is published once, an order that fails is never seen.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from .consumer import Consumer
from .message import LocalTransactionState, Message
from .producer import TransactionListener, TransactionProducer

TOPIC = "orders"
PRODUCER_GROUP = "order-service"


class OrderListener(TransactionListener):
    """Saves the order and the transaction id in one local (SQLite) transaction."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE TABLE orders (order_id INTEGER PRIMARY KEY, amount REAL, transaction_id TEXT)")
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        order = json.loads(message.body)
        with self.lock:
            try:
                with self.db:
                    self.db.execute(
                        "INSERT INTO orders VALUES (?, ?, ?)",
                        (order["order_id"], order["amount"], message.transaction_id),
                    )
                    if order["amount"] <= 0:
                        raise ValueError(f"order {order['order_id']}: amount must be positive")
            except ValueError:
                return LocalTransactionState.ROLLBACK
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        with self.lock:
            row = self.db.execute("SELECT 1 FROM orders WHERE transaction_id = ?", (message.transaction_id,)).fetchone()
        return LocalTransactionState.COMMIT if row else LocalTransactionState.ROLLBACK


@dataclass
class DemoOutcome:
    committed: list[int]
    rolled_back: list[int]
    consumed: list[int]

    @property
    def ok(self) -> bool:
        return sorted(self.committed) == sorted(self.consumed) and not set(self.rolled_back) & set(self.consumed)


ORDERS: list[tuple[int, float, str]] = [
    (1, 25.0, "ada"),
    (2, -5.0, "bob"),
    (3, 99.9, "cy"),
    (4, 0.0, "dee"),
    (5, 12.5, "eve"),
]


def run_demo(redis_url: str, console: Console) -> DemoOutcome:
    """Send the orders through a transactional producer, then read ``orders`` with a consumer group."""
    group = f"billing-demo-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(TOPIC, group, redis_url=redis_url, start_id="$", block=0.2)
    outcome = DemoOutcome([], [], [])
    sends = Table(title=f"order-service sends to topic '{TOPIC}'")
    for column in ("order", "amount", "local transaction", "transaction id", "topic entry"):
        sends.add_column(column)
    with TransactionProducer(PRODUCER_GROUP, OrderListener(), redis_url=redis_url) as producer:
        for order_id, amount, customer in ORDERS:
            body = json.dumps({"order_id": order_id, "amount": amount, "customer": customer}).encode()
            message = Message(TOPIC, body, keys=f"order-{order_id}", tags="created", properties={"source": "demo"})
            result = producer.send_message_in_transaction(message)
            state = result.local_transaction_state
            (outcome.committed if state is LocalTransactionState.COMMIT else outcome.rolled_back).append(order_id)
            sends.add_row(
                str(order_id), f"{amount:.2f}", state.value, result.transaction_id, result.committed_id or "-"
            )
    console.print(sends)

    received = Table(title=f"consumer group '{group}' reads '{TOPIC}'")
    for column in ("entry id", "keys", "tags", "body"):
        received.add_column(column)
    try:
        for _ in range(25):
            for msg in consumer.poll():
                body = json.loads(msg.body)
                outcome.consumed.append(body["order_id"])
                received.add_row(msg.id, " ".join(msg.keys), msg.tags or "", msg.body.decode())
                consumer.ack(msg)
            if len(outcome.consumed) >= len(outcome.committed):
                break
    finally:
        consumer.client.xgroup_destroy(consumer.keys.topic_stream, group)
        consumer.close()
    console.print(received)
    return outcome
