"""The example's invoice behind a handler that takes ``TXMQ_HANDLER_SECONDS`` (1 s by default), for
``manage.py bill_orders --handler tests.django.slow_billing.bill`` in ``tests/django/test_consumer_stop.py``: each
call appends the order id to the file ``TXMQ_STARTED_FILE`` as it starts (one ``write`` on an ``O_APPEND``
descriptor), so that the test knows when a message is in hand."""

from __future__ import annotations

import json
import os
import time

from redis_txmq import ConsumedMessage


def bill(message: ConsumedMessage) -> None:
    from orders.billing import invoice

    started = os.open(os.environ["TXMQ_STARTED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(started, f"{json.loads(message.body)['id']}\n".encode())
    finally:
        os.close(started)
    time.sleep(float(os.environ.get("TXMQ_HANDLER_SECONDS", "1")))
    invoice(message)
