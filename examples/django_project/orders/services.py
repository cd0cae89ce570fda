"""Placing an order: the order row and its ``django-orders`` message, both or neither."""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, transaction

from redis_txmq import Message

from .models import Order
from .txmq import TOPIC, async_producer, log, producer


class OrderRefused(Exception):
    """The local transaction refused the order, so its message was rolled back; ``status`` is the HTTP answer."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


@dataclass
class Placed:
    order: dict[str, Any]
    transaction_id: str
    committed_id: str | None
    """The order's entry id on the topic; None when the end call did not reach Redis: the order is saved and the
    check-back publishes it."""


def _message(order: dict[str, Any]) -> Message:
    return Message(TOPIC, json.dumps(order).encode(), keys=f"order-{order['id']}", tags="created")


def _save(tx: Any, order: dict[str, Any]) -> None:
    """The local transaction: the log row first (the check-back's answer), then the order, in one atomic block."""
    with transaction.atomic():
        log.record(tx)
        Order.objects.create(
            order_id=order["id"],
            transaction_id=tx.transaction_id,
            customer=order["customer"],
            amount=Decimal(str(order["amount"])),
        )


def _refused(order: dict[str, Any], exc: IntegrityError) -> OrderRefused:
    if Order.objects.filter(order_id=order["id"]).exists():
        return OrderRefused(409, f"order {order['id']} exists")
    # the log row was refused: a check-back had given the transaction up (fenced it); nothing is saved
    return OrderRefused(503, f"order {order['id']} took too long and was not saved; retry")


def place_order(order: dict[str, Any]) -> Placed:
    """Save and publish (sync views). An exception in the block rolls the message back and goes on; the database
    commit happens inside the block, before the message's commit."""
    try:
        with producer().transaction(_message(order)) as tx:
            _save(tx, order)
    except IntegrityError as exc:
        raise _refused(order, exc) from exc
    return Placed(order, tx.transaction_id, tx.result.committed_id if tx.result is not None else None)


async def place_order_async(order: dict[str, Any]) -> Placed:
    """:func:`place_order` for async views: the asyncio producer on the loop, the atomic block on one thread
    (``sync_to_async``: Django's transactions are per thread)."""
    try:
        async with (await async_producer()).transaction(_message(order)) as tx:
            await sync_to_async(_save)(tx, order)
    except IntegrityError as exc:
        raise await sync_to_async(_refused)(order, exc) from exc
    return Placed(order, tx.transaction_id, tx.result.committed_id if tx.result is not None else None)
