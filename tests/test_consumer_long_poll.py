"""A poll that waits longer than the client's socket timeout, on a healthy and idle server: it waits the whole time
in several blocking reads, each shorter than the timeout, and returns what arrived (redis-py 6+ gives a client a
5 s socket timeout by default; a consumer's ``block`` or ``poll(timeout)`` at or above it made every idle poll fail
with a connection error). The socket timeout still bounds how long a hung server goes unnoticed."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis
import redis.asyncio

from redis_txmq import Consumer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.core.clients import blocking_slice

SOCKET_TIMEOUT = 0.5


def test_blocking_slices_stay_under_the_socket_timeout() -> None:
    assert blocking_slice(10, 5.0) == 4.0
    assert blocking_slice(1, 5.0) == 1
    assert blocking_slice(10, 0.5) == 0.25
    assert blocking_slice(10, None) == 10


def test_a_poll_longer_than_the_socket_timeout_waits_and_returns_what_came(real_client: Any, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=SOCKET_TIMEOUT)
    try:
        with Consumer("long-poll", "g", client=client, block=0) as consumer:
            assert consumer.poll(timeout=0) == []
            started = time.monotonic()
            assert consumer.poll(timeout=1.5) == [], "an idle, healthy server is no error"
            assert time.monotonic() - started >= 1.4, "it waited the whole time"
            later = threading.Timer(0.8, lambda: real_client.xadd("long-poll", {"body": b"late"}))
            later.start()
            messages = consumer.poll(timeout=5)
            later.join()
            assert [m.body for m in messages] == [b"late"]
    finally:
        client.close()


def test_asyncio_poll_longer_than_the_socket_timeout(real_client: Any, redis_url: str) -> None:
    async def scenario() -> list[bytes]:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=SOCKET_TIMEOUT)
        try:
            async with txmq_asyncio.Consumer("long-poll-a", "g", client=client, block=0) as consumer:
                assert await consumer.poll(timeout=0) == []
                assert await consumer.poll(timeout=1.5) == []
                loop = asyncio.get_running_loop()
                loop.call_later(0.8, lambda: real_client.xadd("long-poll-a", {"body": b"late"}))
                return [m.body for m in await consumer.poll(timeout=5)]
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [b"late"]
