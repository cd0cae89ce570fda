"""The example Django service (``examples/django_project``) end to end on a real Redis and SQLite: every order its
sync and async views save is received once, a refused order never; the billing command invoices each order once,
through a redelivery. Also: the migrations match the models, and the core imports no Django."""

from __future__ import annotations

import asyncio
import collections
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import AsyncClient, Client
from orders import txmq
from orders.billing import BILLING_GROUP, invoice
from orders.models import Invoice, Order

from redis_txmq import Consumer, LocalTransactionState, Message, TransactionProducer
from redis_txmq.core.keys import TopicKeys
from redis_txmq.django import Inbox

from ..helpers import pending

KEYS = TopicKeys(txmq.TOPIC)
ON_SQLITE = pytest.mark.parametrize("django_database", ["sqlite"], indirect=True)  # the example's database: default


@pytest.fixture
def service(django_database: str, txmq_redis: str, real_client: Any) -> Iterator[None]:
    """The example on the test database and the session's Redis; its sync producer stopped after the test."""
    try:
        yield
    finally:
        txmq.shutdown_producer()


def consume(redis_url: str, expected: int) -> list[Any]:
    """Read the example's topic through a new group until ``expected`` messages came, acking each; then nothing more
    is there."""
    received: list[Any] = []
    with Consumer(txmq.TOPIC, "audit", redis_url=redis_url) as consumer:
        for _ in range(50):
            for message in consumer.poll(timeout=0.2):
                received.append(message)
                consumer.ack(message)
            if len(received) >= expected:
                break
        assert consumer.poll(timeout=0) == [], "no message beyond the saved orders"
    return received


@ON_SQLITE
def test_each_saved_order_is_received_once_and_refused_ones_never(service: None, real_client: Any, redis_url: str):
    http = Client()
    replies: dict[int, Any] = {}
    for i in range(1, 7):
        response = http.post("/orders", {"id": i, "customer": f"c{i}", "amount": 10.0 + i}, "application/json")
        assert response.status_code == 201, response.content
        replies[i] = response.json()
    for i in (2, 5):
        response = http.post("/orders", {"id": i, "customer": "again", "amount": 1.0}, "application/json")
        assert response.status_code == 409, "one of each pair is refused"
    for invalid in ({"id": 20, "customer": "zero", "amount": 0}, {"id": 21, "amount": 3.0}, [1]):
        assert http.post("/orders", invalid, "application/json").status_code == 422
    assert http.post("/orders", b"not json", "application/json").status_code == 422
    assert http.get("/orders").status_code == 405

    async def place_async() -> None:
        async_http = AsyncClient()
        try:
            for i in range(7, 11):
                response = await async_http.post(
                    "/async/orders", {"id": i, "customer": f"c{i}", "amount": 10.0 + i}, "application/json"
                )
                assert response.status_code == 201, response.content
                replies[i] = response.json()
            again = await async_http.post("/async/orders", {"id": 8, "customer": "x", "amount": 1}, "application/json")
            assert again.status_code == 409
            bad = await async_http.post("/async/orders", {"id": -1, "customer": "x", "amount": 1}, "application/json")
            assert bad.status_code == 422
        finally:
            await txmq.shutdown_async_producer()

    asyncio.run(place_async())
    assert all(reply["committed_id"] for reply in replies.values()), "every end call was applied"
    for i, reply in replies.items():
        stored = http.get(f"/orders/{i}")
        assert stored.status_code == 200 and stored.json() == {"id": i, "customer": f"c{i}", "amount": 10.0 + i}
        assert reply["order"]["id"] == i
    assert http.get("/orders/20").status_code == 404
    assert Order.objects.count() == 10
    assert real_client.hlen(KEYS.inflight) == 0, "every transaction ended: committed or rolled back"

    received = consume(redis_url, expected=10)
    counts = collections.Counter(message.transaction_id for message in received)
    assert counts == {reply["transaction_id"]: 1 for reply in replies.values()}
    for message in received:
        body = json.loads(message.body)
        assert message.transaction_id == replies[body["id"]]["transaction_id"]
        assert body["customer"] == f"c{body['id']}", "the body is the saved order, never the refused duplicate"


@ON_SQLITE
def test_the_billing_command_invoices_each_order_once_through_a_redelivery(service: None, redis_url: str) -> None:
    http = Client()
    for i in (1, 2, 3):
        response = http.post("/orders", {"id": i, "customer": f"c{i}", "amount": 10 * i}, "application/json")
        assert response.status_code == 201
    handler = Inbox().handler(invoice, consumer_group=BILLING_GROUP)
    with Consumer(txmq.TOPIC, BILLING_GROUP, redis_url=redis_url, block=0.05, min_idle_time=0.2) as dying:
        (first, *_) = dying.poll(timeout=1)
        handler(first)  # invoiced and committed; the process dies before the ack
    out = io.StringIO()
    call_command("bill_orders", max_messages=3, block=0.05, min_idle_time=0.2, stdout=out)
    assert f"3 message(s) handled by group {BILLING_GROUP}" in out.getvalue()
    assert sorted(Invoice.objects.values_list("order_id", flat=True)) == [1, 2, 3], "each order invoiced once"


NOT_ORDERS = [b"{not json", json.dumps({"order_id": 1, "amount": 25.0, "customer": "ada"}).encode()]
"""A body that is not JSON, and one shaped as ``txmq demo`` writes its orders (``order_id``: no ``id``)."""


@ON_SQLITE
def test_the_billing_command_says_once_that_a_message_is_not_an_order_and_goes_on(
    service: None, real_client: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two messages the billing command cannot parse, then an order: each of the two is logged once (topic, entry
    id, transaction id, what to do) and skipped, never handed out again; the order behind them is invoiced."""
    caplog.set_level(logging.INFO)
    bad = []
    with TransactionProducer(
        "another-writer", checker=lambda message: LocalTransactionState.COMMIT, redis_url=redis_url
    ) as producer:
        for body in NOT_ORDERS:
            with producer.transaction(Message(txmq.TOPIC, body)) as tx:
                pass
            bad.append(tx.transaction_id)
    response = Client().post("/orders", {"id": 1, "customer": "ada", "amount": 25}, "application/json")
    assert response.status_code == 201
    entry_of = {f[b"transaction_id"].decode(): entry.decode() for entry, f in real_client.xrange(KEYS.topic_stream)}

    out = io.StringIO()
    call_command("bill_orders", max_messages=3, block=0.05, min_idle_time=0.2, stdout=out)

    assert f"3 message(s) handled by group {BILLING_GROUP}" in out.getvalue()
    assert list(Invoice.objects.values_list("order_id", flat=True)) == [1], "the order behind the two is invoiced"
    said = [r for r in caplog.records if r.name == "orders.billing"]
    assert [r.levelno for r in said] == [logging.WARNING] * 2, [r.getMessage() for r in said]
    for record, transaction_id in zip(said, bad, strict=True):
        line = record.getMessage()
        entry = entry_of[transaction_id]
        assert f"topic={txmq.TOPIC} entry={entry} tx={transaction_id} is not an order" in line
        assert f"XRANGE {KEYS.topic_stream} {entry} {entry}" in line and "place the order again" in line
    assert "the body is not JSON" in said[0].getMessage()
    assert "the body is not an order" in said[1].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no handler failure, no traceback"
    assert pending(real_client, KEYS.topic_stream, BILLING_GROUP) == 0, "nothing left to deliver again"


@ON_SQLITE
def test_the_migrations_match_the_models(django_database: str) -> None:
    call_command("makemigrations", "txmq", "orders", check=True, dry_run=True, verbosity=0)


def test_the_core_does_not_import_django() -> None:
    code = (
        "import sys, redis_txmq, redis_txmq.asyncio, redis_txmq.sync.consumer, redis_txmq.sync.producer\n"
        "assert 'django' not in sys.modules, sorted(m for m in sys.modules if m.startswith('django'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
