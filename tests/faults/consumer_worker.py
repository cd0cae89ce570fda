"""A consumer instance of the fault suite: reads every topic through the consumer group, appends each delivery to
its own record file, works a moment, then acks.

``python -m tests.faults.consumer_worker CONFIG INDEX``. Instance ``i`` reads as ``consumer_loops[i % 3]`` of
the config says: ``poll_and_ack`` polls and acks in a loop of its own that rides out Redis errors; ``run`` uses
``Consumer.run``; ``asyncio`` uses :class:`redis_txmq.asyncio.Consumer` on one event loop, iterating (``async for``,
then ``await consumer.ack``) over the first topic and ``await consumer.run`` with an async handler over the others.
Iteration and ``run`` must ride out Redis errors themselves: if one returns or raises before SIGTERM, the process
exits with status 3 and the suite reports it.

A record line is ``topic stream entry-id transaction-id delivery-count``, written with one ``write`` on an
``O_APPEND`` descriptor before the ack: a SIGKILL loses no recorded delivery, and a delivery killed before its ack
comes again (counted as a redelivery).

When the config has a ``database_url`` (the PostgreSQL variant), each delivery is then applied to the consumer
group's database through the inbox (an invoice, committed before the ack; :mod:`.pg_databases`): a redelivery must
find its inbox row and add no second invoice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis

from redis_txmq import ConsumedMessage, Consumer, TxMQError
from redis_txmq.asyncio import Consumer as AsyncConsumer

logger = logging.getLogger("faults.consumer")

WORK = 0.05
"""Seconds of processing between recording a delivery and acking it: a kill or a reset often falls in between."""
RUN_ENDED = 3
"""Exit status when ``Consumer.run`` ended before it was stopped."""


def billing_database(config: dict[str, Any]) -> Any:
    """The consumer group's PostgreSQL database, or None in the SQLite variant."""
    if not config.get("database_url"):
        return None
    from .pg_databases import BillingDatabase

    return BillingDatabase(config["database_url"], config["consumer_group"])


class Reader:
    """One topic of one consumer instance."""

    def __init__(
        self,
        topic: str,
        config: dict[str, Any],
        record: int,
        stop: threading.Event,
        apply: Callable[[ConsumedMessage], None] | None = None,
    ) -> None:
        self.topic = topic
        self.config = config
        self.record = record
        self.stop = stop
        self.apply = apply
        self.consumer: Consumer | None = None

    def handle(self, message: ConsumedMessage) -> None:
        os.write(self.record, record_line(self.topic, message))
        if self.apply is not None:
            self.apply(message)
        time.sleep(WORK)

    def open(self) -> Consumer | None:
        """The consumer, made once Redis answers; None if stopped first."""
        group, url = self.config["consumer_group"], self.config["redis_url"]
        while self.consumer is None and not self.stop.is_set():
            try:
                self.consumer = Consumer(self.topic, group, redis_url=url, block=0.5, **self.config["consumer"])
            except (TxMQError, redis.RedisError) as exc:
                logger.warning("topic %s: consumer not made: %s; trying again", self.topic, exc)
                self.stop.wait(0.2)
        return self.consumer

    def poll_and_ack(self) -> None:
        consumer = self.open()
        while consumer is not None and not self.stop.is_set():
            try:
                for message in consumer.poll():
                    self.handle(message)
                    consumer.ack(message)
            except (TxMQError, redis.RedisError) as exc:
                logger.warning("topic %s: %s: %s; polling again", self.topic, type(exc).__name__, exc)
                self.stop.wait(0.2)

    def run(self) -> None:
        consumer = self.open()
        if consumer is None:
            return
        try:
            consumer.run(self.handle)
        except Exception:  # noqa: BLE001 - whatever escapes Consumer.run is the finding
            logger.exception("topic %s: Consumer.run raised", self.topic)
            os._exit(RUN_ENDED)
        if not self.stop.is_set():
            logger.error("topic %s: Consumer.run returned before it was stopped", self.topic)
            os._exit(RUN_ENDED)


def record_line(topic: str, message: ConsumedMessage) -> bytes:
    return f"{topic} {message.stream} {message.id} {message.transaction_id} {message.delivery_count}\n".encode()


class AsyncReader:
    """One topic of the asyncio consumer instance."""

    def __init__(
        self,
        topic: str,
        config: dict[str, Any],
        record: int,
        stop: asyncio.Event,
        apply: Callable[[ConsumedMessage], Awaitable[None]] | None = None,
    ) -> None:
        self.topic = topic
        self.record = record
        self.stop = stop
        self.apply = apply
        group, url = config["consumer_group"], config["redis_url"]
        self.consumer = AsyncConsumer(topic, group, redis_url=url, block=0.5, **config["consumer"])

    async def handle(self, message: ConsumedMessage) -> None:
        os.write(self.record, record_line(self.topic, message))
        if self.apply is not None:
            await self.apply(message)
        await asyncio.sleep(WORK)

    async def open(self) -> bool:
        """Start the consumer once Redis answers; False if stopped first."""
        while not self.stop.is_set():
            try:
                await self.consumer.start()
                return True
            except (TxMQError, redis.RedisError) as exc:
                logger.warning("topic %s: consumer not started: %s; trying again", self.topic, exc)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.2)
        return False

    async def iterate(self) -> None:
        async for message in self.consumer:
            await self.handle(message)
            try:
                await self.consumer.ack(message)
            except (TxMQError, redis.RedisError) as exc:
                logger.warning("topic %s: ack failed: %s: %s; redelivered later", self.topic, type(exc).__name__, exc)

    async def read(self, loop: str) -> None:
        if not await self.open():
            return
        try:
            await (self.iterate() if loop == "iterate" else self.consumer.run(self.handle))
        except Exception:  # noqa: BLE001 - whatever escapes iteration or run is the finding
            logger.exception("topic %s: asyncio Consumer %s raised", self.topic, loop)
            os._exit(RUN_ENDED)
        if not self.stop.is_set():
            logger.error("topic %s: asyncio Consumer %s ended before it was stopped", self.topic, loop)
            os._exit(RUN_ENDED)


async def consume_async(config: dict[str, Any], record: int) -> None:
    stop = asyncio.Event()
    billing = billing_database(config)
    apply = None if billing is None else billing.async_handler()
    readers = [AsyncReader(topic, config, record, stop, apply) for topic in config["topics"]]

    def terminate() -> None:
        stop.set()
        for reader in readers:
            reader.consumer.stop()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
    await asyncio.gather(*(r.read("run" if i else "iterate") for i, r in enumerate(readers)))
    for reader in readers:
        await reader.consumer.close()
    if billing is not None:
        await billing.aclose()


def main(config_path: str, index: str) -> None:
    config = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = Path(config["deliveries"]) / f"consumer-{index}.log"
    record = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    loops = config["consumer_loops"]
    loop = loops[int(index) % len(loops)]
    logger.info("consumer %s reading %s with %s", index, ", ".join(config["topics"]), loop)
    if loop == "asyncio":
        asyncio.run(consume_async(config, record))
        os.close(record)
        return
    stop = threading.Event()
    billing = billing_database(config)
    apply = None if billing is None else billing.handler()
    readers = [Reader(topic, config, record, stop, apply) for topic in config["topics"]]

    def terminate(*_: Any) -> None:
        stop.set()
        for reader in readers:
            if reader.consumer is not None:
                reader.consumer.stop()

    signal.signal(signal.SIGTERM, terminate)
    threads = [threading.Thread(target=getattr(reader, loop)) for reader in readers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for reader in readers:
        if reader.consumer is not None:
            reader.consumer.close()
    if billing is not None:
        billing.close()
    os.close(record)


if __name__ == "__main__":
    main(*sys.argv[1:3])
