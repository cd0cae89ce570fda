"""Item 1 and 2: the sync and the one-way send against plain XADD, interleaved in one process on one Redis; and the
asyncio producer with ``ASYNC_IN_FLIGHT`` sends in flight together (``asyncio.gather``) against the sync one.

Each round times ``per_round`` plain XADDs, ``per_round`` sync sends, ``per_round`` sync sends through redis-py's
own ``Script`` path (what :mod:`redis_txmq.transport.direct` is measured against), ``per_round`` one-way sends (the
one-way time includes its ``flush()``) and ``per_round`` asyncio sends, in an order that rotates every round, so the
machine's drift hits all alike; the result is the median of the per-round ratios. Afterwards every committed transaction
must be in its topic stream exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from redis_txmq import LocalTransactionState, Message, TransactionProducer
from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer
from redis_txmq.sync.wire import run_scripts
from redis_txmq.transport.direct import ScriptRunner

from .common import BODY, TOPIC_PREFIX, Answer, AsyncAnswer, async_client_of, delete_topic, spread

PLAIN = f"{TOPIC_PREFIX}plain"
SYNC_TOPIC = f"{TOPIC_PREFIX}sync"
PLAIN_PATH_TOPIC = f"{TOPIC_PREFIX}sync-redis-py"
ONEWAY_TOPIC = f"{TOPIC_PREFIX}oneway"
ASYNC_TOPIC = f"{TOPIC_PREFIX}asyncio"
ASYNC_IN_FLIGHT = 64
"""Sends of the asyncio producer in flight together."""


def compare_send(client: Any, rounds: int, per_round: int, tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Rates and ratios of sync and one-way sends to plain XADD; ``tick`` is called after every round."""
    topics = (SYNC_TOPIC, PLAIN_PATH_TOPIC, ONEWAY_TOPIC, ASYNC_TOPIC)
    for topic in topics:
        delete_topic(client, topic)
    client.delete(PLAIN)
    commit = Answer(LocalTransactionState.COMMIT)
    sync = TransactionProducer(f"{TOPIC_PREFIX}sync", commit, client=client).start()
    plain_path = TransactionProducer(f"{TOPIC_PREFIX}sync-redis-py", commit, client=client).start()
    plain_path.broker.runner = ScriptRunner(
        client, run_scripts, direct=False
    )  # redis-py's Script objects, pool and callbacks
    oneway = TransactionProducer(f"{TOPIC_PREFIX}oneway", commit, client=client, oneway_end=True).start()
    loop = asyncio.new_event_loop()
    async_client = async_client_of(client, ASYNC_IN_FLIGHT)
    asynchronous = AsyncTransactionProducer(
        f"{TOPIC_PREFIX}asyncio", AsyncAnswer(LocalTransactionState.COMMIT), client=async_client
    )
    loop.run_until_complete(asynchronous.start())
    transaction_ids: dict[str, list[str]] = {topic: [] for topic in topics}

    def plain() -> None:
        for _ in range(per_round):
            client.xadd(PLAIN, {"body": BODY})

    def send_sync() -> None:
        ids = transaction_ids[SYNC_TOPIC]
        for _ in range(per_round):
            ids.append(sync.send_message_in_transaction(Message(SYNC_TOPIC, BODY)).transaction_id)

    def send_plain_path() -> None:
        ids = transaction_ids[PLAIN_PATH_TOPIC]
        for _ in range(per_round):
            ids.append(plain_path.send_message_in_transaction(Message(PLAIN_PATH_TOPIC, BODY)).transaction_id)

    def send_oneway() -> None:
        ids = transaction_ids[ONEWAY_TOPIC]
        for _ in range(per_round):
            ids.append(oneway.send_message_in_transaction(Message(ONEWAY_TOPIC, BODY)).transaction_id)
        oneway.flush()

    async def gather_sends() -> None:
        ids = transaction_ids[ASYNC_TOPIC]
        for start in range(0, per_round, ASYNC_IN_FLIGHT):
            batch = min(ASYNC_IN_FLIGHT, per_round - start)
            results = await asyncio.gather(
                *(asynchronous.send_message_in_transaction(Message(ASYNC_TOPIC, BODY)) for _ in range(batch))
            )
            ids.extend(result.transaction_id for result in results)

    def send_async() -> None:
        loop.run_until_complete(gather_sends())

    runs = [
        ("xadd", plain),
        ("sync", send_sync),
        ("sync_redis_py", send_plain_path),
        ("oneway", send_oneway),
        ("asyncio", send_async),
    ]
    seconds: dict[str, list[float]] = {name: [] for name, _ in runs}
    try:
        send_sync(), send_plain_path(), send_oneway(), send_async(), plain()  # warm up: scripts, connections, registry
        for topic_ids in transaction_ids.values():
            topic_ids.clear()
        for topic in topics:
            client.delete(topic)
        for i in range(rounds):
            order = runs[i % len(runs) :] + runs[: i % len(runs)]
            for name, run in order if i % 2 else reversed(order):
                started = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - started)
            tick()
    finally:
        sync.shutdown()
        plain_path.shutdown()
        oneway.shutdown()
        loop.run_until_complete(asynchronous.shutdown())
        loop.run_until_complete(async_client.aclose())
        loop.close()
    exactly_once = all(_committed_once(client, topic, ids) for topic, ids in transaction_ids.items())
    for topic in topics:
        delete_topic(client, topic)
    client.delete(PLAIN)
    rate = {name: [per_round / s for s in values] for name, values in seconds.items()}
    return {
        "rounds": rounds,
        "per_round": per_round,
        "xadd_per_s": spread(rate["xadd"])["median"],
        "sync_per_s": spread(rate["sync"])["median"],
        "oneway_per_s": spread(rate["oneway"])["median"],
        "direct_vs_redis_py": spread([d / p for d, p in zip(rate["sync"], rate["sync_redis_py"], strict=True)]),
        "sync_ratio": spread([s / x for s, x in zip(rate["sync"], rate["xadd"], strict=True)]),
        "oneway_ratio": spread([o / x for o, x in zip(rate["oneway"], rate["xadd"], strict=True)]),
        "asyncio_per_s": spread(rate["asyncio"])["median"],
        "asyncio_in_flight": ASYNC_IN_FLIGHT,
        "asyncio_vs_sync": spread([a / s for a, s in zip(rate["asyncio"], rate["sync"], strict=True)]),
        "exactly_once": exactly_once,
    }


def _committed_once(client: redis.Redis, topic: str, transaction_ids: list[str]) -> bool:
    seen = collections.Counter(fields[b"transaction_id"].decode() for _, fields in client.xrange(topic))
    return seen == collections.Counter(transaction_ids) and all(n == 1 for n in seen.values())
