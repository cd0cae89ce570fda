"""The Django inbox: a redelivered message (its consumer died between the database commit and the ack, another
instance claimed it) changes the consumer's database once — sync and asyncio, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone
from orders.models import Invoice

from redis_txmq import ConsumedMessage, Consumer, LocalTransactionState, Message, TransactionProducer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.core.errors import ConfigurationError
from redis_txmq.django import Inbox
from redis_txmq.django.models import InboxEntry

REDELIVER_SOON: dict[str, Any] = {"block": 0.05, "min_idle_time": 0.2}


def a_message(transaction_id: str = "tx-1", order_id: int = 1) -> ConsumedMessage:
    body = json.dumps({"id": order_id, "amount": 10}).encode()
    return ConsumedMessage("orders", "txmq:{orders}:topic", "1-0", body, transaction_id)


def invoicing(alias: str) -> Any:
    def invoice(message: ConsumedMessage) -> None:
        order = json.loads(message.body)
        Invoice.objects.using(alias).create(order_id=order["id"], amount=order["amount"])

    return invoice


def invoices(alias: str) -> list[int]:
    return sorted(Invoice.objects.using(alias).values_list("order_id", flat=True))


def test_a_message_is_claimed_once_per_group(django_database: str) -> None:
    inbox = Inbox(using=django_database)
    with transaction.atomic(using=django_database):
        assert inbox.claim("billing", a_message()) is True
    with transaction.atomic(using=django_database):
        assert inbox.claim("billing", a_message()) is False, "already applied by this group"
        assert inbox.claim("shipping", a_message()) is True, "another group applies it too"
        assert inbox.claim("Billing", a_message()) is True, "a group differing in case is another group"


def test_a_claim_rolled_back_with_its_transaction_is_claimed_again(django_database: str) -> None:
    inbox = Inbox(using=django_database)
    with pytest.raises(RuntimeError), transaction.atomic(using=django_database):
        assert inbox.claim("billing", a_message())
        raise RuntimeError("the handler failed: nothing of this transaction stays")
    with transaction.atomic(using=django_database):
        assert inbox.claim("billing", a_message()) is True


def test_a_claim_outside_an_atomic_block_and_bad_names_are_refused(django_database: str) -> None:
    inbox = Inbox(using=django_database)
    with pytest.raises(ConfigurationError, match="inside the transaction"):
        inbox.claim("billing", a_message())
    with pytest.raises(ConfigurationError, match="consumer_group"):
        inbox.handler(invoicing(django_database), consumer_group="")
    with pytest.raises(ConfigurationError, match="message_id"), transaction.atomic(using=django_database):
        inbox.claim("billing", a_message("tx-" + "x" * 300))
    assert not InboxEntry.objects.using(django_database).exists()


def test_two_instances_handling_one_message_at_once_apply_it_once(django_database: str) -> None:
    """The second instance's claim waits for the first one's transaction, then finds its row."""
    inbox = Inbox(using=django_database)
    handler = inbox.handler(invoicing(django_database), consumer_group="billing")
    second_done = threading.Event()

    def second() -> None:
        try:
            handler(a_message())
            second_done.set()
        finally:
            connections.close_all()

    with transaction.atomic(using=django_database):
        assert inbox.claim("billing", a_message())
        invoicing(django_database)(a_message())
        other = threading.Thread(target=second)
        other.start()
        assert not second_done.wait(0.3), "the second claim waits for the first transaction"
    other.join(timeout=10)
    assert second_done.is_set() and invoices(django_database) == [1]


def test_purge_keeps_the_window(django_database: str) -> None:
    inbox = Inbox(using=django_database)
    with transaction.atomic(using=django_database):
        inbox.claim("billing", a_message("tx-1"))
        inbox.claim("billing", a_message("tx-2"))
    InboxEntry.objects.using(django_database).filter(message_id="tx-2").update(
        processed_at=timezone.now() - timedelta(hours=2)
    )
    assert inbox.purge(timedelta(hours=1)) == 1
    assert list(InboxEntry.objects.using(django_database).values_list("message_id", flat=True)) == ["tx-1"]
    assert inbox.purge(timedelta(0), batch_size=1) == 1


def place_orders(redis_url: str, count: int) -> list[str]:
    placed = []
    with TransactionProducer(
        "orders-service", checker=lambda message: LocalTransactionState.COMMIT, redis_url=redis_url
    ) as producer:
        for i in range(1, count + 1):
            with producer.transaction(Message("orders", json.dumps({"id": i, "amount": 10 * i}).encode())) as tx:
                placed.append(tx.transaction_id)
    return placed


def test_a_consumer_that_dies_before_its_ack_does_not_apply_the_message_twice(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    """The first consumer commits the invoice and its inbox row, then dies before the ack; the next one is handed the
    message again, acks it without invoicing it again, and invoices the others."""
    place_orders(redis_url, 3)
    inbox = Inbox(using=django_database)
    handler = inbox.handler(invoicing(django_database), consumer_group="billing")
    with Consumer("orders", "billing", redis_url=redis_url, **REDELIVER_SOON) as dying:
        (first, *_) = dying.poll(timeout=1)
        handler(first)  # committed; the process dies before the ack
    with Consumer("orders", "billing", redis_url=redis_url, **REDELIVER_SOON) as consumer:
        assert consumer.run(handler, max_messages=3) == 3
    assert invoices(django_database) == [1, 2, 3], "each order invoiced once"
    assert InboxEntry.objects.using(django_database).count() == 3


def test_the_async_handler_applies_on_one_thread_and_acks_after_the_commit(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    place_orders(redis_url, 2)
    inbox = Inbox(using=django_database)
    threads: set[int] = set()
    invoice = invoicing(django_database)

    def apply(message: ConsumedMessage) -> None:
        assert connections[django_database].in_atomic_block, "inside the inbox's transaction"
        threads.add(threading.get_ident())
        invoice(message)

    async def run() -> int:
        handler = inbox.async_handler(apply, consumer_group="billing")
        async with txmq_asyncio.Consumer("orders", "billing", redis_url=redis_url, **REDELIVER_SOON) as dying:
            (first, *_) = await dying.poll(timeout=1)
            await handler(first)  # committed, never acked: handed over again below, and skipped
        async with txmq_asyncio.Consumer("orders", "billing", redis_url=redis_url, **REDELIVER_SOON) as consumer:
            return await asyncio.wait_for(consumer.run(handler, max_messages=2), 15)

    assert asyncio.run(run()) == 2
    assert invoices(django_database) == [1, 2]
    assert threading.get_ident() not in threads, "the database work ran off the event loop's thread"
