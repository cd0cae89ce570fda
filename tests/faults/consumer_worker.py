"""A consumer instance of the fault suite: reads every topic through the consumer group, appends each delivery to
its own record file, works a moment, then acks.

``python -m tests.faults.consumer_worker CONFIG INDEX``. Even-numbered instances poll and ack in a loop of their
own that rides out Redis errors; odd-numbered ones use ``Consumer.run``, which must ride them out itself: if it
returns or raises before SIGTERM, the process exits with status 3 and the suite reports it.

A record line is ``topic stream entry-id transaction-id delivery-count``, written with one ``write`` on an
``O_APPEND`` descriptor before the ack: a SIGKILL loses no recorded delivery, and a delivery killed before its ack
comes again (counted as a redelivery)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

from redis_txmq import ConsumedMessage, Consumer, TxMQError

logger = logging.getLogger("faults.consumer")

WORK = 0.05
"""Seconds of processing between recording a delivery and acking it: a kill or a reset often falls in between."""
RUN_ENDED = 3
"""Exit status when ``Consumer.run`` ended before it was stopped."""


class Reader:
    """One topic of one consumer instance."""

    def __init__(self, topic: str, config: dict[str, Any], record: int, stop: threading.Event) -> None:
        self.topic = topic
        self.config = config
        self.record = record
        self.stop = stop
        self.consumer: Consumer | None = None

    def handle(self, message: ConsumedMessage) -> None:
        line = f"{self.topic} {message.stream} {message.id} {message.transaction_id} {message.delivery_count}\n"
        os.write(self.record, line.encode())
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


def main(config_path: str, index: str) -> None:
    config = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = Path(config["deliveries"]) / f"consumer-{index}.log"
    record = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stop = threading.Event()
    readers = [Reader(topic, config, record, stop) for topic in config["topics"]]

    def terminate(*_: Any) -> None:
        stop.set()
        for reader in readers:
            if reader.consumer is not None:
                reader.consumer.stop()

    signal.signal(signal.SIGTERM, terminate)
    loop = "run" if int(index) % 2 else "poll_and_ack"
    threads = [threading.Thread(target=getattr(reader, loop)) for reader in readers]
    for thread in threads:
        thread.start()
    logger.info("consumer %s reading %s with %s", index, ", ".join(config["topics"]), loop)
    for thread in threads:
        thread.join()
    for reader in readers:
        if reader.consumer is not None:
            reader.consumer.close()
    os.close(record)


if __name__ == "__main__":
    main(*sys.argv[1:3])
