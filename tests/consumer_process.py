"""A consumer process for the tests of stopping and killing one (``tests/test_consumer_processes.py``).

``python -m tests.consumer_process API REDIS_URL BATCH SECONDS STARTED_FILE``: reads ``orders`` through group
``billing`` with :class:`redis_txmq.Consumer` (``API`` ``sync``) or :class:`redis_txmq.asyncio.Consumer`
(``asyncio``, its handler awaiting), ``BATCH`` messages at a time; the handler appends the message id to
``STARTED_FILE`` as it starts (one ``write`` on an ``O_APPEND`` descriptor), then takes ``SECONDS`` and acks. SIGTERM
stops it as the documentation says a service should: ``consumer.stop()``. It prints how many it handled and exits 0.
Settings (the heartbeat interval) come from the ``TXMQ_*`` environment variables."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

from redis_txmq import ConsumedMessage, Consumer
from redis_txmq.asyncio import Consumer as AsyncConsumer


def note(path: str, message: ConsumedMessage) -> None:
    started = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(started, f"{message.id}\n".encode())
    finally:
        os.close(started)


def main(api: str, url: str, batch: int, seconds: float, path: str) -> int:
    options: dict[str, Any] = {"redis_url": url, "batch_size": batch, "block": 0.1, "min_idle_time": 3600}
    if api == "sync":
        with Consumer("orders", "billing", **options) as consumer:
            signal.signal(signal.SIGTERM, lambda *_: consumer.stop())

            def handle(message: ConsumedMessage) -> None:
                note(path, message)
                time.sleep(seconds)

            return consumer.run(handle)

    async def consume() -> int:
        async with AsyncConsumer("orders", "billing", **options) as consumer:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)

            async def handle(message: ConsumedMessage) -> None:
                note(path, message)
                await asyncio.sleep(seconds)

            return await consumer.run(handle)

    return asyncio.run(consume())


if __name__ == "__main__":
    api, url, batch, seconds, path = sys.argv[1:6]
    print(f"handled {main(api, url, int(batch), float(seconds), path)}", flush=True)
