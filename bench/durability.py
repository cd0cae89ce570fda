"""What a durability level costs: sync sends at ``replica`` and ``aof`` against ``master``, interleaved in one
process on one Redis, as the other send rounds (:mod:`bench.send`).

The bench attaches a replica of its own (a second server on a free port) to the Redis it started, and turns its
append-only file on for the ``aof`` rounds where the server has ``WAITAOF`` (Redis >= 7.2, Valkey); against a
``--redis-url`` it measures what that server can give (``replica`` only with a replica connected) and changes no
configuration. The result is the median of the per-round ratios of each level's rate to ``master``'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.core.durability import has_waitaof
from redis_txmq.ops.admin import available_levels
from redis_txmq.transport.connection import server_info
from redis_txmq.transport.embedded import EmbeddedRedis

from .common import BODY, TOPIC_PREFIX, Answer, delete_topic, spread

TOPIC = f"{TOPIC_PREFIX}durability"
ONLINE_SECONDS = 20.0


def _attach_replica(stack: ExitStack, client: Any) -> None:
    """A replica of the bench's own server, in sync before the rounds start."""
    kwargs = client.connection_pool.connection_kwargs
    host, port = kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379)
    stack.enter_context(EmbeddedRedis(extra_args=["--replicaof", str(host), str(port)]))
    deadline = time.monotonic() + ONLINE_SECONDS
    client.set(f"{TOPIC_PREFIX}replicated", 1)
    while client.wait(1, 1000) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the bench's replica did not get in sync")
    client.delete(f"{TOPIC_PREFIX}replicated")


def compare_durability(
    client: Any, own_server: bool, rounds: int, per_round: int, tick: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """Rates of sync sends per level and their ratios to ``master``; levels the server cannot give are left out."""
    with ExitStack() as stack:
        if own_server:
            _attach_replica(stack, client)
            if has_waitaof(server_info(client, "server")):  # turn its append-only file on for the `aof` rounds
                client.config_set("appendonly", "yes")
                stack.callback(client.config_set, "appendonly", "no")
                deadline = time.monotonic() + ONLINE_SECONDS
                while str(client.info("persistence").get("aof_rewrite_in_progress")) == "1":
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        levels = available_levels(server_info(client, "server", "replication", "persistence"))
        delete_topic(client, TOPIC)
        commit = Answer(LocalTransactionState.COMMIT)
        producers = {
            level: stack.enter_context(
                TransactionProducer(
                    f"{TOPIC_PREFIX}durability-{level}",
                    commit,
                    client=client,
                    settings=replace(Settings(), durability=level),
                )
            )
            for level in levels
        }

        def sends(producer: TransactionProducer) -> Callable[[], None]:
            def run() -> None:
                for _ in range(per_round):
                    producer.send_message_in_transaction(Message(TOPIC, BODY))

            return run

        runs = [(level, sends(producer)) for level, producer in producers.items()]
        for _level, run in runs:
            run()  # warm up
        seconds: dict[str, list[float]] = {level: [] for level in producers}
        for i in range(rounds):
            order = runs[i % len(runs) :] + runs[: i % len(runs)]
            for level, run in order:
                started = time.perf_counter()
                run()
                seconds[level].append(time.perf_counter() - started)
            tick()
        delete_topic(client, TOPIC)
    rate = {level: [per_round / s for s in values] for level, values in seconds.items()}
    return {
        "rounds": rounds,
        "per_round": per_round,
        "per_s": {level: spread(values)["median"] for level, values in rate.items()},
        "vs_master": {
            level: spread([r / m for r, m in zip(values, rate["master"], strict=True)])
            for level, values in rate.items()
            if level != "master"
        },
    }


def main() -> None:
    """``python -m bench.durability [ROUNDS] [PER_ROUND]``: only this part, on a Redis (and replica) of its own."""
    import json
    import sys

    from redis_txmq.transport.connection import connect

    rounds, per_round = (int(arg) for arg in (sys.argv[1:3] + ["30", "200"][len(sys.argv[1:3]) :]))
    with EmbeddedRedis() as server:
        client = connect(server.url)
        print(json.dumps(compare_durability(client, True, rounds, per_round), indent=2))
        client.close()


if __name__ == "__main__":
    main()
