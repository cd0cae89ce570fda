"""Item 4: the checker at scale. With N transactions in flight (their producer "crashed" before the end):

* the cost of a checker round while none is due yet (it must not grow with N: the due-time index answers
  "who is due" without walking the half stream), as the median time of one claim call;
* check-backs resolved per second by one checker, from its start until all N are committed by a live producer
  instance answering COMMIT (in its own process, as in production); every one must be in the topic stream
  exactly once.
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from redis_txmq import Message, Settings, TransactionProducer
from redis_txmq.core.keys import TopicKeys
from redis_txmq.sync.broker import RedisBroker

from .common import BODY, TOPIC_PREFIX, Answer, TopicChecker, answering_producer, delete_topic

TOPIC = f"{TOPIC_PREFIX}checkback"
GROUP = f"{TOPIC_PREFIX}checkback"
SETTINGS = Settings(transaction_timeout=0.0, check_interval=60.0, heartbeat_interval=1.0)


def fill_in_flight(client: Any, count: int, tick: Callable[[int], None] = lambda n: None) -> None:
    """``count`` transactions left UNKNOWN: a one-way producer whose listener never answers (no end call)."""
    with TransactionProducer(GROUP, Answer(None), client=client, oneway_end=True) as crashed:
        for i in range(count):
            crashed.send_message_in_transaction(Message(TOPIC, BODY, keys=f"order-{i}"))
            if i % 1000 == 999:
                tick(1000)
        tick(count % 1000)


def idle_claim_ms(client: Any, calls: int = 50) -> float:
    """Median time (ms) of one claim call when nothing is due (transaction_timeout of an hour)."""
    broker = RedisBroker(client, Settings(transaction_timeout=3600))
    broker.load_scripts()
    keys = TopicKeys(TOPIC)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        claimed = broker.claim_checks(keys, 100)
        times.append(time.perf_counter() - started)
        assert not claimed.to_check, "nothing should be due within the hour"
    broker.close()
    return statistics.median(times) * 1000


def resolve_all(
    client: Any, url: str, count: int, tick: Callable[[int], None] = lambda n: None, timeout: float = 900
) -> float:
    """Seconds one checker (batch 100, transaction_timeout 0) takes until all ``count`` are committed, with one
    producer instance answering from another process."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    producer = context.Process(target=answering_producer, args=(url, GROUP, SETTINGS, ready, stop), daemon=True)
    producer.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the answering producer process did not start within 60 s")
        checker = TopicChecker(client, SETTINGS, [TOPIC], scan_interval=0.05)
        checker.start()
        halt = threading.Event()
        worker = threading.Thread(target=checker.run, args=(halt,), daemon=True)
        started = time.perf_counter()
        worker.start()
        deadline = started + timeout
        done = 0
        while done < count and time.perf_counter() < deadline:
            time.sleep(0.01)
            now_done = client.xlen(TOPIC)
            tick(now_done - done)
            done = now_done
        elapsed = time.perf_counter() - started
        halt.set()
        worker.join(30)
    finally:
        stop.set()
        producer.join(30)
        if producer.is_alive():
            producer.kill()
    return elapsed


def checkback_at_scale(
    client: Any, url: str, in_flight: int, tick: Callable[[int], None] = lambda n: None
) -> dict[str, Any]:
    delete_topic(client, TOPIC)
    fill_in_flight(client, in_flight, tick)
    idle_ms = idle_claim_ms(client)
    elapsed = resolve_all(client, url, in_flight, tick)
    ids = [fields[b"transaction_id"] for _, fields in client.xrange(TOPIC)]
    exactly_once = len(ids) == in_flight == len(set(ids))
    delete_topic(client, TOPIC)
    return {
        "in_flight": in_flight,
        "idle_claim_ms": idle_ms,
        "seconds": elapsed,
        "checkbacks_per_s": in_flight / elapsed,
        "exactly_once": exactly_once,
    }
