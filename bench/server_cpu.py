"""What a transaction costs the server: Redis's own CPU time (``INFO cpu``, main thread) per sync send, per one-way
send and per plain ``XADD`` of the same body, in interleaved blocks in one process on one Redis.

One core runs every script of a shard, so this is the ceiling of what a shard carries, whatever the number of
producers. Each round measures a block of ``per_round`` plain XADDs, sync sends and one-way sends (the one-way block
includes its ``flush()``) in an order that rotates every round; the result is the median of the per-round ratios to
XADD, and, from ``INFO commandstats``, the microseconds the server spent in the scripts (EVALSHA) per transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis_txmq import LocalTransactionState, Message, TransactionProducer

from .common import BODY, TOPIC_PREFIX, Answer, delete_topic, server_cpu_seconds, spread

PLAIN = f"{TOPIC_PREFIX}cpu-plain"
SYNC_TOPIC = f"{TOPIC_PREFIX}cpu-sync"
ONEWAY_TOPIC = f"{TOPIC_PREFIX}cpu-oneway"


def _script_usec(client: Any) -> int:
    """Microseconds the server spent in EVALSHA so far, from INFO commandstats."""
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def compare_server_cpu(
    client: Any, rounds: int, per_round: int, tick: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """Server CPU microseconds per operation and ratios to XADD; ``tick`` is called after every round."""
    for topic in (SYNC_TOPIC, ONEWAY_TOPIC):
        delete_topic(client, topic)
    client.delete(PLAIN)
    commit = Answer(LocalTransactionState.COMMIT)
    sync = TransactionProducer(f"{TOPIC_PREFIX}cpu-sync", commit, client=client).start()
    oneway = TransactionProducer(f"{TOPIC_PREFIX}cpu-oneway", commit, client=client, oneway_end=True).start()

    def plain() -> None:
        for _ in range(per_round):
            client.xadd(PLAIN, {"body": BODY})

    def send_sync() -> None:
        for _ in range(per_round):
            sync.send_message_in_transaction(Message(SYNC_TOPIC, BODY))

    def send_oneway() -> None:
        for _ in range(per_round):
            oneway.send_message_in_transaction(Message(ONEWAY_TOPIC, BODY))
        oneway.flush()

    runs = [("xadd", plain), ("sync", send_sync), ("oneway", send_oneway)]
    cpu: dict[str, list[float]] = {name: [] for name, _ in runs}
    script_usec: dict[str, list[float]] = {"sync": [], "oneway": []}
    try:
        for _name, run in runs:
            run()  # warm up: scripts loaded, connections made, topics registered
        for i in range(rounds):
            order = runs[i % len(runs) :] + runs[: i % len(runs)]
            for name, run in order:
                usec_before = _script_usec(client)
                before = server_cpu_seconds(client)
                run()
                cpu[name].append((server_cpu_seconds(client) - before) * 1e6 / per_round)
                if name in script_usec:
                    script_usec[name].append((_script_usec(client) - usec_before) / per_round)
            tick()
    finally:
        sync.shutdown()
        oneway.shutdown()
        for topic in (SYNC_TOPIC, ONEWAY_TOPIC):
            delete_topic(client, topic)
        client.delete(PLAIN)
    return {
        "rounds": rounds,
        "per_round": per_round,
        "usec_per_op": {name: spread(values)["median"] for name, values in cpu.items()},
        "script_usec_per_tx": {name: spread(values)["median"] for name, values in script_usec.items()},
        "sync_vs_xadd": spread([s / x for s, x in zip(cpu["sync"], cpu["xadd"], strict=True) if x > 0]),
        "oneway_vs_xadd": spread([o / x for o, x in zip(cpu["oneway"], cpu["xadd"], strict=True) if x > 0]),
    }


def main() -> None:
    """``python -m bench.server_cpu [ROUNDS] [PER_ROUND]``: only this part, on a Redis of its own."""
    import json
    import sys

    from redis_txmq.connection import connect
    from redis_txmq.embedded import EmbeddedRedis

    rounds, per_round = (int(arg) for arg in (sys.argv[1:3] + ["30", "500"][len(sys.argv[1:3]) :]))
    with EmbeddedRedis() as server:
        client = connect(server.url)
        print(json.dumps(compare_server_cpu(client, rounds, per_round), indent=2))
        client.close()


if __name__ == "__main__":
    main()
