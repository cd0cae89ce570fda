"""Item 1 and 2: the sync and the one-way send against plain XADD, interleaved in one process on one Redis.

Each round times ``per_round`` plain XADDs, ``per_round`` sync sends and ``per_round`` one-way sends (the
one-way time includes its ``flush()``), in an order that rotates every round, so the machine's drift hits all
three alike; the result is the median of the per-round ratios. Afterwards every committed transaction must be
in its topic stream exactly once.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

import redis

from redis_txmq import LocalTransactionState, Message, TransactionProducer

from .common import BODY, TOPIC_PREFIX, Answer, delete_topic, spread

PLAIN = f"{TOPIC_PREFIX}plain"
SYNC_TOPIC = f"{TOPIC_PREFIX}sync"
ONEWAY_TOPIC = f"{TOPIC_PREFIX}oneway"


def compare_send(client: Any, rounds: int, per_round: int, tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Rates and ratios of sync and one-way sends to plain XADD; ``tick`` is called after every round."""
    for topic in (SYNC_TOPIC, ONEWAY_TOPIC):
        delete_topic(client, topic)
    client.delete(PLAIN)
    commit = Answer(LocalTransactionState.COMMIT)
    sync = TransactionProducer(f"{TOPIC_PREFIX}sync", commit, client=client).start()
    oneway = TransactionProducer(f"{TOPIC_PREFIX}oneway", commit, client=client, oneway_end=True).start()
    transaction_ids: dict[str, list[str]] = {SYNC_TOPIC: [], ONEWAY_TOPIC: []}

    def plain() -> None:
        for _ in range(per_round):
            client.xadd(PLAIN, {"body": BODY})

    def send_sync() -> None:
        ids = transaction_ids[SYNC_TOPIC]
        for _ in range(per_round):
            ids.append(sync.send_message_in_transaction(Message(SYNC_TOPIC, BODY)).transaction_id)

    def send_oneway() -> None:
        ids = transaction_ids[ONEWAY_TOPIC]
        for _ in range(per_round):
            ids.append(oneway.send_message_in_transaction(Message(ONEWAY_TOPIC, BODY)).transaction_id)
        oneway.flush()

    runs = [("xadd", plain), ("sync", send_sync), ("oneway", send_oneway)]
    seconds: dict[str, list[float]] = {name: [] for name, _ in runs}
    try:
        send_sync(), send_oneway(), plain()  # warm up: scripts loaded, connections open, registry written
        for topic_ids in transaction_ids.values():
            topic_ids.clear()
        for topic in (SYNC_TOPIC, ONEWAY_TOPIC):
            client.delete(topic)
        for i in range(rounds):
            order = runs[i % 3 :] + runs[: i % 3]
            for name, run in order if i % 2 else reversed(order):
                started = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - started)
            tick()
    finally:
        sync.shutdown()
        oneway.shutdown()
    exactly_once = all(_committed_once(client, topic, ids) for topic, ids in transaction_ids.items())
    for topic in (SYNC_TOPIC, ONEWAY_TOPIC):
        delete_topic(client, topic)
    client.delete(PLAIN)
    rate = {name: [per_round / s for s in values] for name, values in seconds.items()}
    return {
        "rounds": rounds,
        "per_round": per_round,
        "xadd_per_s": spread(rate["xadd"])["median"],
        "sync_per_s": spread(rate["sync"])["median"],
        "oneway_per_s": spread(rate["oneway"])["median"],
        "sync_ratio": spread([s / x for s, x in zip(rate["sync"], rate["xadd"], strict=True)]),
        "oneway_ratio": spread([o / x for o, x in zip(rate["oneway"], rate["xadd"], strict=True)]),
        "exactly_once": exactly_once,
    }


def _committed_once(client: redis.Redis, topic: str, transaction_ids: list[str]) -> bool:
    seen = collections.Counter(fields[b"transaction_id"].decode() for _, fields in client.xrange(topic))
    return seen == collections.Counter(transaction_ids) and all(n == 1 for n in seen.values())
