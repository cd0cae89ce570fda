"""The consuming side: one invoice per published order, through the inbox (``manage.py bill_orders``)."""

from __future__ import annotations

import json
from decimal import Decimal

from redis_txmq import ConsumedMessage

from .models import Invoice

BILLING_GROUP = "billing"


def invoice(message: ConsumedMessage) -> None:
    """Runs inside the inbox's ``transaction.atomic()``: the invoice and the inbox row commit together."""
    order = json.loads(message.body)
    Invoice.objects.create(order_id=order["id"], amount=Decimal(str(order["amount"])))
