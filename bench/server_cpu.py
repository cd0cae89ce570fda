"""What a transaction costs the server: Redis's own CPU time (``INFO cpu``, main thread) per sync send, per one-way
send, per asyncio send with ``ASYNC_IN_FLIGHT`` in flight, and per plain ``XADD`` of the same body (one request
each, and pipelined ``ASYNC_IN_FLIGHT`` deep), in interleaved blocks in one process on one Redis.

One core runs every script of a shard, so this is the ceiling of what a shard carries, whatever the number of
producers. Each round measures a block of ``per_round`` operations of every mode in an order that rotates every
round; the result is the median of the per-round ratios (to the one-request XADD, and the asyncio send's also to
the pipelined one and to the asyncio sends whose prepares, or ends, each go as their own script call), and, from
``INFO commandstats``, the microseconds the server spent in the scripts (EVALSHA) and the script calls it ran, per
transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis_txmq import LocalTransactionState, Message, TransactionProducer
from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer

from .common import BODY, TOPIC_PREFIX, Answer, AsyncAnswer, async_client_of, delete_topic, server_cpu_seconds, spread

PLAIN = f"{TOPIC_PREFIX}cpu-plain"
PIPELINED = f"{TOPIC_PREFIX}cpu-pipelined"
SYNC_TOPIC = f"{TOPIC_PREFIX}cpu-sync"
ONEWAY_TOPIC = f"{TOPIC_PREFIX}cpu-oneway"
ASYNC_TOPIC = f"{TOPIC_PREFIX}cpu-asyncio"
ASYNC_IN_FLIGHT = 64
"""Sends of the asyncio producer in flight together, and the depth of the pipelined XADDs."""
MODES = ("xadd", "xadd_pipelined", "sync", "oneway", "asyncio", "asyncio_single_prepares", "asyncio_single_ends")
"""Every mode; ``xadd`` (the one-request XADD every ratio is taken to) is always measured.
``asyncio_single_prepares`` is the asyncio producer with its lane sending every prepare as its own script call (its
ends batched), as it did before prepares in flight together went out as one ``prepare_halves`` call;
``asyncio_single_ends`` sends every end as its own script call (its prepares batched), as before ends in flight
together went out as one ``end_transactions`` call."""
ASYNC_MODES = {
    "asyncio": {},
    "asyncio_single_prepares": {"coalesce_prepares": False},
    "asyncio_single_ends": {"coalesce_ends": False},
}
"""The asyncio modes and the lane settings (``redis_txmq.asyncio.lane.ScriptLane``) each turns off."""
TRANSACTIONS = ("sync", "oneway", *ASYNC_MODES)


def _script_stats(client: Any) -> tuple[int, int]:
    """Microseconds the server spent in EVALSHA so far and the calls, from INFO commandstats."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("usec", 0)), int(stats.get("calls", 0))


def compare_server_cpu(
    client: Any,
    rounds: int,
    per_round: int,
    tick: Callable[[], None] = lambda: None,
    modes: Sequence[str] = MODES,
) -> dict[str, Any]:
    """Server CPU microseconds per operation and ratios to XADD; ``tick`` is called after every round."""
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    modes = [mode for mode in MODES if mode in modes or mode == "xadd"]
    topics = (SYNC_TOPIC, ONEWAY_TOPIC, ASYNC_TOPIC)
    for topic in topics:
        delete_topic(client, topic)
    client.delete(PLAIN, PIPELINED)
    commit = Answer(LocalTransactionState.COMMIT)
    sync = TransactionProducer(f"{TOPIC_PREFIX}cpu-sync", commit, client=client).start() if "sync" in modes else None
    oneway = (
        TransactionProducer(f"{TOPIC_PREFIX}cpu-oneway", commit, client=client, oneway_end=True).start()
        if "oneway" in modes
        else None
    )
    loop = asyncio.new_event_loop()
    async_client = async_client_of(client, ASYNC_IN_FLIGHT)
    asynchronous: dict[str, Any] = {}
    for mode, settings in ASYNC_MODES.items():
        if mode in modes:
            concurrent = AsyncTransactionProducer(
                f"{TOPIC_PREFIX}cpu-asyncio", AsyncAnswer(LocalTransactionState.COMMIT), client=async_client
            )
            loop.run_until_complete(concurrent.start())
            lane = getattr(concurrent.broker.runner, "_lane", None)
            for name, value in settings.items():
                if lane is not None:
                    setattr(lane, name, value)
            asynchronous[mode] = concurrent

    def plain() -> None:
        for _ in range(per_round):
            client.xadd(PLAIN, {"body": BODY})

    def pipelined() -> None:
        for start in range(0, per_round, ASYNC_IN_FLIGHT):
            with client.pipeline(transaction=False) as pipe:
                for _ in range(min(ASYNC_IN_FLIGHT, per_round - start)):
                    pipe.xadd(PIPELINED, {"body": BODY})
                pipe.execute()

    def send_sync() -> None:
        assert sync is not None
        for _ in range(per_round):
            sync.send_message_in_transaction(Message(SYNC_TOPIC, BODY))

    def send_oneway() -> None:
        assert oneway is not None
        for _ in range(per_round):
            oneway.send_message_in_transaction(Message(ONEWAY_TOPIC, BODY))
        oneway.flush()

    async def gather_sends(producer: Any) -> None:
        for start in range(0, per_round, ASYNC_IN_FLIGHT):
            batch = min(ASYNC_IN_FLIGHT, per_round - start)
            await asyncio.gather(
                *(producer.send_message_in_transaction(Message(ASYNC_TOPIC, BODY)) for _ in range(batch))
            )

    def send_async(mode: str) -> Callable[[], None]:
        return lambda: loop.run_until_complete(gather_sends(asynchronous[mode]))

    every = {
        "xadd": plain,
        "xadd_pipelined": pipelined,
        "sync": send_sync,
        "oneway": send_oneway,
        **{mode: send_async(mode) for mode in ASYNC_MODES},
    }
    runs = [(mode, every[mode]) for mode in modes]
    cpu: dict[str, list[float]] = {name: [] for name, _ in runs}
    script_usec: dict[str, list[float]] = {name: [] for name, _ in runs if name in TRANSACTIONS}
    script_calls: dict[str, list[float]] = {name: [] for name in script_usec}
    try:
        for _name, run in runs:
            run()  # warm up: scripts loaded, connections made, topics registered
        for i in range(rounds):
            order = runs[i % len(runs) :] + runs[: i % len(runs)]
            for name, run in order:
                usec_before, calls_before = _script_stats(client)
                before = server_cpu_seconds(client)
                run()
                cpu[name].append((server_cpu_seconds(client) - before) * 1e6 / per_round)
                if name in script_usec:
                    usec, calls = _script_stats(client)
                    script_usec[name].append((usec - usec_before) / per_round)
                    script_calls[name].append((calls - calls_before) / per_round)
            tick()
    finally:
        for producer in (sync, oneway):
            if producer is not None:
                producer.shutdown()
        for concurrent in asynchronous.values():
            loop.run_until_complete(concurrent.shutdown())
        loop.run_until_complete(async_client.aclose())
        loop.close()
        for topic in topics:
            delete_topic(client, topic)
        client.delete(PLAIN, PIPELINED)

    def ratios(mode: str, base: str) -> dict[str, float]:
        return spread([m / b for m, b in zip(cpu[mode], cpu[base], strict=True) if b > 0])

    result: dict[str, Any] = {
        "rounds": rounds,
        "per_round": per_round,
        "modes": modes,
        "usec_per_op": {name: spread(values)["median"] for name, values in cpu.items()},
        "usec_per_op_spread": {name: spread(values) for name, values in cpu.items()},
        "script_usec_per_tx": {name: spread(values)["median"] for name, values in script_usec.items()},
        "script_calls_per_tx": {name: spread(values)["median"] for name, values in script_calls.items()},
    }
    for mode in modes:
        if mode != "xadd":
            result[f"{mode}_vs_xadd"] = ratios(mode, "xadd")
    if asynchronous:
        result["asyncio_in_flight"] = ASYNC_IN_FLIGHT
    for mode in asynchronous:
        if "xadd_pipelined" in modes:
            result[f"{mode}_vs_xadd_pipelined"] = ratios(mode, "xadd_pipelined")
    if "asyncio" in asynchronous:
        for mode in asynchronous:
            if mode != "asyncio":
                result[f"asyncio_vs_{mode}"] = ratios("asyncio", mode)
    return result


def main() -> None:
    """``python -m bench.server_cpu [ROUNDS] [PER_ROUND] [--modes xadd,xadd_pipelined,asyncio]``: only this part,
    on a Redis of its own (every mode by default)."""
    import argparse
    import json

    from redis_txmq.transport.connection import connect
    from redis_txmq.transport.embedded import EmbeddedRedis

    parser = argparse.ArgumentParser(prog="python -m bench.server_cpu", description=__doc__)
    parser.add_argument("rounds", nargs="?", type=int, default=30)
    parser.add_argument("per_round", nargs="?", type=int, default=500)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    options = parser.parse_args()
    modes = [mode.strip() for mode in options.modes.split(",") if mode.strip()]
    with EmbeddedRedis() as server:
        client = connect(server.url)
        print(json.dumps(compare_server_cpu(client, options.rounds, options.per_round, modes=modes), indent=2))
        client.close()


if __name__ == "__main__":
    main()
