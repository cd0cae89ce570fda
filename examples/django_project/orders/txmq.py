"""The service's producers and its transaction log, made once per process.

The producer is created at its first use, not in ``AppConfig.ready()``: ``manage.py migrate`` and the other commands
then never connect to Redis. It answers the check-backs of its group from the Django database (``checker=``) while it
runs. The asyncio producer (for the async view) belongs to the event loop it was started on: an ASGI server has one.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref

from django.conf import settings

from redis_txmq import TransactionProducer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.django import TransactionLog

TOPIC = "django-orders"
PRODUCER_GROUP = "django-order-service"
"""This service's names, its own: another service's producers on the same Redis (the FastAPI example's, ``txmq
demo``'s) never answer its check-backs from their database, nor its consumers read their orders."""

log = TransactionLog(local_transaction_max_seconds=30)
"""30 s: longer than any order's local transaction takes; a check-back waits this long before it gives one up."""

_lock = threading.Lock()
_producer: TransactionProducer | None = None
_async_producers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, txmq_asyncio.TransactionProducer] = (
    weakref.WeakKeyDictionary()
)


def producer() -> TransactionProducer:
    """The sync producer of this process (thread-safe: shared by the request threads), started at first use."""
    global _producer
    with _lock:
        if _producer is None:
            _producer = TransactionProducer(PRODUCER_GROUP, checker=log.checker(), redis_url=settings.TXMQ_REDIS_URL)
            _producer.start()
            atexit.register(_producer.shutdown)
        return _producer


async def async_producer() -> txmq_asyncio.TransactionProducer:
    """The asyncio producer of the running event loop, started at first use."""
    loop = asyncio.get_running_loop()
    found = _async_producers.get(loop)
    if found is None:
        found = txmq_asyncio.TransactionProducer(
            PRODUCER_GROUP, checker=log.async_checker(), redis_url=settings.TXMQ_REDIS_URL
        )
        _async_producers[loop] = found
        await found.start()
    return found


async def shutdown_async_producer() -> None:
    """Stop the running loop's asyncio producer (a server's shutdown, a test's end)."""
    found = _async_producers.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.shutdown()


def shutdown_producer() -> None:
    global _producer
    with _lock:
        if _producer is not None:
            _producer.shutdown()
            _producer = None
