"""``manage.py bill_orders``: invoice each published order once (``txmq_consume`` with this service's defaults)."""

from redis_txmq.django.management.commands.txmq_consume import Command as ConsumeCommand


class Command(ConsumeCommand):
    help = "Invoice each order published on the orders topic, once, through the inbox."
    default_topic = "orders"
    default_group = "billing"
    default_handler = "orders.billing.invoice"
