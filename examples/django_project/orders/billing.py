"""The consuming side: one invoice per published order, through the inbox (``manage.py bill_orders``)."""

from __future__ import annotations

import json
import logging
from decimal import Decimal, InvalidOperation

from redis_txmq import ConsumedMessage

from .models import Invoice

BILLING_GROUP = "django-billing"
"""This service's consumer group: its own, so that no other service's consumers share its messages."""

logger = logging.getLogger(__name__)


class NotAnOrder(ValueError):
    """A message whose body is not an order ``{id, customer, amount}``: no retry can ever invoice it."""


def order_of(message: ConsumedMessage) -> tuple[int, Decimal]:
    """The order's id and amount, or ``NotAnOrder`` saying what is wrong with the body."""
    try:
        order = json.loads(message.body)
    except ValueError as exc:  # not JSON, or not UTF-8
        raise NotAnOrder(f"the body is not JSON: {exc}") from None
    if not isinstance(order, dict) or not {"id", "amount"} <= set(order):
        raise NotAnOrder(f"the body is not an order {{id, customer, amount}}: {message.body[:100]!r}")
    order_id, amount = order["id"], order["amount"]
    if not isinstance(order_id, int) or isinstance(order_id, bool) or order_id <= 0:
        raise NotAnOrder(f"id must be a positive integer, not {order_id!r}")
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        value = None
    if value is None or isinstance(amount, bool) or not value.is_finite():
        raise NotAnOrder(f"amount must be a number, not {amount!r}")
    return order_id, value


def invoice(message: ConsumedMessage) -> None:
    """Runs inside the inbox's ``transaction.atomic()``: the invoice and the inbox row commit together.

    A message that is not an order is said once and skipped: raising would only have it delivered again, up to the
    consumer's ``max_deliveries`` (16), a traceback each time, before the consumer dead-letters it. Its inbox row
    commits without an invoice and it is acked, so a redelivery does not say it again. (``txmq_consume`` hands its
    handler the message only, not the consumer: a handler of it cannot call ``consumer.dead_letter``.)"""
    try:
        order_id, amount = order_of(message)
    except NotAnOrder as exc:
        logger.warning(
            "topic=%s entry=%s tx=%s is not an order (%s); skipped, not invoiced: it stays on the topic stream "
            "(XRANGE %s %s %s); fix what published it, then place the order again",
            message.topic,
            message.id,
            message.transaction_id,
            exc,
            message.stream,
            message.id,
            message.id,
        )
        return
    Invoice.objects.create(order_id=order_id, amount=amount)
