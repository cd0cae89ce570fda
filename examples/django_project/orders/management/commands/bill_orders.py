"""``manage.py bill_orders``: invoice each published order once (``txmq_consume`` with this service's defaults)."""

from orders.billing import BILLING_GROUP
from orders.txmq import TOPIC
from redis_txmq.django.management.commands.txmq_consume import Command as ConsumeCommand


class Command(ConsumeCommand):
    help = f"Invoice each order published on the {TOPIC} topic, once, through the inbox."
    default_topic = TOPIC
    default_group = BILLING_GROUP
    default_handler = "orders.billing.invoice"
