"""``txmq bench``: every measurement of the performance goals in one run, with progress, against a Redis it
starts itself (or ``--redis-url``; it then writes and deletes only ``bench-*`` topics)."""

from __future__ import annotations

import os
import platform
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import redis_txmq
from redis_txmq.core.clients import redact_url
from redis_txmq.transport.connection import connect
from redis_txmq.transport.embedded import EmbeddedRedis, embedded_cluster

from .checkback import checkback_at_scale
from .common import delete_groups
from .durability import compare_durability
from .idle_checker import idle_checker_cost
from .latency import measure_latency
from .memory import MemoryProbe
from .processes import WorkerPool, producer_scaling
from .send import compare_send
from .server_cpu import compare_server_cpu


@dataclass
class BenchOptions:
    redis_url: str | None = None
    rounds: int = 60
    per_round: int = 200
    cpu_per_round: int = 500
    """Operations per block of the server-CPU rounds: enough for INFO cpu's resolution."""
    processes: list[int] = field(default_factory=lambda: [1, 2, 4])
    seconds: float = 2.0
    repeats: int = 3
    in_flight: list[int] = field(default_factory=lambda: [1_000, 100_000])
    memory_transactions: int = 10_000
    memory_wait: bool = True
    cluster: bool = False
    spark: bool = False
    spark_rows: int = 200_000
    spark_rounds: int = 3
    latency: bool = True
    idle_topics: list[int] = field(default_factory=lambda: [10, 1_000, 10_000])
    """Topic counts of the idle-checker part (on a redis-server of its own; skipped with ``redis_url``)."""
    idle_seconds: float = 20.0
    idle_samples: int = 8
    latency_seconds: float = 8.0
    """Seconds of open-loop sending per mode and load of the latency part, split over ``latency_rounds``."""
    latency_rounds: int = 8
    latency_calibration: float = 2.0

    @classmethod
    def quick(cls, **overrides: Any) -> BenchOptions:
        """A smoke run of a few hundred transactions per part (what CI runs): it proves the bench works."""
        values: dict[str, Any] = dict(
            rounds=4,
            per_round=50,
            cpu_per_round=50,
            processes=[1, 2],
            seconds=0.3,
            repeats=1,
            in_flight=[200],
            memory_transactions=200,
            memory_wait=False,
            spark_rows=5_000,
            spark_rounds=1,
            latency_seconds=0.4,
            latency_rounds=2,
            latency_calibration=0.3,
            idle_topics=[3],
            idle_seconds=1.0,
            idle_samples=1,
        )
        return cls(**(values | overrides))


def run_bench(options: BenchOptions, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        if options.redis_url:
            url = options.redis_url
        else:
            url = stack.enter_context(EmbeddedRedis()).url
        client = connect(url)
        stack.callback(client.close)
        info = client.info("server")
        results["machine"] = {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "redis_version": info.get("redis_version"),
            "redis_url": redact_url(url) if options.redis_url else "own redis-server",
            "redis_txmq": redis_txmq.__version__,
        }
        progress = stack.enter_context(
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
        )
        memory = MemoryProbe(client, options.memory_transactions)
        task = progress.add_task("memory: fill", total=1)
        memory.start()
        progress.advance(task)

        task = progress.add_task("send: sync / one-way / XADD rounds", total=options.rounds)
        results["send"] = compare_send(client, options.rounds, options.per_round, lambda: progress.advance(task))

        if options.latency:
            task = progress.add_task(
                "latency: capacity, then XADD / sync / delivery at 50% and 90%", total=1 + 6 * options.latency_rounds
            )
            results["latency"] = measure_latency(
                url,
                client,
                options.latency_seconds,
                options.latency_rounds,
                options.latency_calibration,
                lambda: progress.advance(task),
            )

        task = progress.add_task("server CPU: XADD / sync / one-way rounds", total=options.rounds)
        results["server_cpu"] = compare_server_cpu(
            client, options.rounds, options.cpu_per_round, lambda: progress.advance(task)
        )

        targets = {"standalone": (url, False)}
        if options.cluster:
            targets["cluster"] = (stack.enter_context(embedded_cluster()), True)
        loads = options.repeats * len(targets) * len(options.processes) * 3
        task = progress.add_task("producer processes", total=loads)
        pool = WorkerPool(max(options.processes))
        stack.callback(pool.close)
        results["producers"] = producer_scaling(
            pool, targets, options.processes, options.seconds, options.repeats, lambda: progress.advance(task)
        )

        results["checkback"] = []
        for count in options.in_flight:
            task = progress.add_task(f"check-back, {count:,} in flight (fill, resolve)", total=2 * count)
            results["checkback"].append(
                checkback_at_scale(client, url, count, lambda n, task=task: progress.advance(task, n))
            )

        if options.idle_topics and not options.redis_url:
            # thousands of topics of its own, on a server of its own: it refuses a server with other topics
            task = progress.add_task(f"idle checker at {options.idle_topics} topics", total=len(options.idle_topics))
            with EmbeddedRedis() as idle_redis:
                results["idle_checker"] = idle_checker_cost(
                    idle_redis.url,
                    options.idle_topics,
                    options.idle_seconds,
                    samples=options.idle_samples,
                    log=lambda line: progress.advance(task) if "check-backs" in line else None,
                )

        task = progress.add_task("send: durability levels rounds", total=options.rounds)
        results["durability"] = compare_durability(
            client,
            not options.redis_url,
            options.rounds,
            options.per_round,
            lambda: progress.advance(task),
        )

        if options.spark:
            from .spark_write import measure as measure_spark_write

            task = progress.add_task("spark: batch writer / pipelined XADD rounds", total=1)
            results["spark_write"] = measure_spark_write(url, options.spark_rows, options.spark_rounds)
            progress.advance(task)

        wait = options.memory_wait
        task = progress.add_task("memory: dedupe window", total=memory.settings.dedupe_window if wait else 1)
        results["memory"] = memory.finish(wait, lambda seconds: progress.advance(task, seconds))
        progress.advance(task, 0 if wait else 1)
        pool.close()
        delete_groups(client)
    return results
