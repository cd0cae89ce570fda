"""The example Django order service and its billing consumer as processes that SIGKILL themselves at the worst
moment, on the database given as JSON in ``TXMQ_DJANGO_DATABASE`` (settings ``tests.django.settings``):

- ``python -m tests.django.service producer KILL_AT``: places orders ``1..ORDERS`` not in the database yet through
  the example's own ``place_order`` (the log row and the order in one atomic block inside a transaction handle); order
  ``KILL_AT`` kills the process right after its database commit, before the end call (an ``on_commit`` callback: the
  check-back must publish it). Then it answers check-backs until killed.
- ``python -m tests.django.service producer KILL_AT request-before|request-after``: the same, each order placed in
  an outer ``transaction.atomic()`` as ``ATOMIC_REQUESTS`` makes it (the handle's block ends inside it, its COMMIT
  waits for the outer commit); order ``KILL_AT`` kills the process after the handle's block, before the outer
  commit (``request-before``: the order rolls back with the process; the check-back must roll its message back),
  or right after the outer commit, before the deferred COMMIT (``request-after``: the check-back must publish it).
- the consumer is the example's ``manage.py bill_orders`` itself, with ``--handler tests.django.service.bill``: the
  example's invoice, and for order ``TXMQ_KILL_AT`` a kill after the inbox's commit, before the ack (the redelivery
  must be skipped).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from redis_txmq import ConsumedMessage, Settings

ORDERS = 12
SETTINGS = Settings(transaction_timeout=0.5, check_interval=0.5, heartbeat_interval=0.5, claim_idle=1)
SETTINGS_ENV = {
    "TXMQ_TRANSACTION_TIMEOUT": "0.5",
    "TXMQ_CHECK_INTERVAL": "0.5",
    "TXMQ_HEARTBEAT_INTERVAL": "0.5",
    "TXMQ_CLAIM_IDLE": "1",
}
"""``SETTINGS`` for the example's producer, which reads them from the environment (``Settings.from_env``)."""


def _die_after_commit() -> None:
    from django.db import transaction

    transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))  # committed in the database, nothing after


def bill(message: ConsumedMessage) -> None:
    """The example's invoice; order ``TXMQ_KILL_AT`` kills the consumer after the commit, before the ack."""
    import json

    from orders.billing import invoice

    invoice(message)
    if json.loads(message.body)["id"] == int(os.environ.get("TXMQ_KILL_AT", "-1")):
        _die_after_commit()


def produce(kill_at: int, request: str = "") -> None:
    from django.db import transaction
    from django.db.models.signals import post_save
    from orders import services
    from orders.models import Order

    def die_after_commit(sender: object, instance: Order, created: bool, **kwargs: object) -> None:
        if created and instance.order_id == kill_at:
            _die_after_commit()

    if not request:
        post_save.connect(die_after_commit, sender=Order)
    placed = set(Order.objects.values_list("order_id", flat=True))
    for order_id in range(1, ORDERS + 1):
        if order_id in placed:
            continue
        order = {"id": order_id, "customer": f"c{order_id}", "amount": 10.0 * order_id}
        if not request:
            services.place_order(order)
            continue
        with transaction.atomic():  # the request's transaction
            if request == "request-after" and order_id == kill_at:
                _die_after_commit()  # registered first: runs before the handle's deferred COMMIT
            services.place_order(order)
            if request == "request-before" and order_id == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # the handle's block ended, the request not committed
    print("placed", flush=True)
    threading.Event().wait()  # answer check-backs until killed


if __name__ == "__main__":
    import django

    django.setup()
    role, kill_at = sys.argv[1], int(sys.argv[2])
    assert role == "producer", role
    produce(kill_at, sys.argv[3] if len(sys.argv) > 3 else "")
