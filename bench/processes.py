"""Item 3: the aggregate rate of several producer processes against one Redis (or a Redis Cluster).

A pool of worker processes (spawned once) runs one timed load per command: plain XADD, sync sends or one-way
sends (the time includes the final ``flush()``), each process on its own topic. For every process count the
three modes run back to back in a rotating order, ``repeats`` times, and the median rate of each is kept, with
the share of the load's time the busiest server's main thread was on the CPU: near 100% the server is the
limit, well below it the clients are.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable
from typing import Any

from redis_txmq import LocalTransactionState, Message, TransactionProducer
from redis_txmq.transport.connection import connect, server_nodes

from .common import BODY, TOPIC_PREFIX, Answer, delete_topic, server_cpu_seconds, spread

MODES = ("xadd", "sync", "oneway")


def _next_command(commands: Any, parent: int) -> Any:
    """The next command, or None when told to stop or when the parent died (no orphan keeps loading Redis)."""
    while True:
        try:
            return commands.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _worker(index: int, commands: Any, results: Any, parent: int) -> None:
    """Runs loads until it reads None; keeps one producer per (url, mode) for the life of the process."""
    producers: dict[tuple[str, bool, str], TransactionProducer] = {}
    clients: dict[tuple[str, bool], Any] = {}
    used: set[tuple[tuple[str, bool], str]] = set()
    try:
        while (command := _next_command(commands, parent)) is not None:
            url, cluster, mode, seconds, start_at = command
            client = clients.get((url, cluster))
            if client is None:
                client = clients[(url, cluster)] = connect(url, cluster=cluster)
            topic = f"{TOPIC_PREFIX}w{index}-{mode}"
            used.add(((url, cluster), topic))
            if mode != "xadd" and (url, cluster, mode) not in producers:
                producers[(url, cluster, mode)] = TransactionProducer(
                    f"{TOPIC_PREFIX}workers",
                    Answer(LocalTransactionState.COMMIT),
                    client=client,
                    oneway_end=mode == "oneway",
                ).start()
            results.put(_timed_load(client, producers.get((url, cluster, mode)), topic, seconds, start_at))
    finally:
        for producer in producers.values():
            producer.shutdown()
        for target, topic in used:
            delete_topic(clients[target], topic)


def _timed_load(client: Any, producer: TransactionProducer | None, topic: str, seconds: float, start_at: float):
    delete_topic(client, topic) if producer else client.delete(topic)
    while time.time() < start_at:
        time.sleep(0.0005)
    started = time.perf_counter()
    deadline = started + seconds
    sent = 0
    if producer is None:
        while time.perf_counter() < deadline:
            for _ in range(20):
                client.xadd(topic, {"body": BODY})
            sent += 20
    else:
        while time.perf_counter() < deadline:
            for _ in range(20):
                producer.send_message_in_transaction(Message(topic, BODY))
            sent += 20
        producer.flush()
    elapsed = time.perf_counter() - started
    stored = client.xlen(topic)
    return sent, elapsed, stored == sent


class WorkerPool:
    """``size`` spawned processes that run loads on command."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._results = context.Queue()
        self._commands = [context.Queue() for _ in range(size)]
        self._processes = [
            context.Process(target=_worker, args=(i, self._commands[i], self._results, os.getpid()), daemon=True)
            for i in range(size)
        ]
        for process in self._processes:
            process.start()

    def load(
        self, url: str, cluster: bool, mode: str, processes: int, seconds: float, servers: list[Any]
    ) -> tuple[float, float, bool]:
        """Aggregate transactions (or XADDs) per second of ``processes`` workers; the busiest of ``servers``' CPU
        share over the load; and whether each worker stored all it sent."""
        start_at = time.time() + 0.3
        cpu_before = [server_cpu_seconds(server) for server in servers]
        for commands in self._commands[:processes]:
            commands.put((url, cluster, mode, seconds, start_at))
        outcomes = [self._results.get(timeout=seconds + 120) for _ in range(processes)]
        cpu = [server_cpu_seconds(server) - before for server, before in zip(servers, cpu_before, strict=True)]
        total = sum(sent for sent, _, _ in outcomes)
        longest = max(elapsed for _, elapsed, _ in outcomes)
        return total / longest, max(cpu) / longest, all(ok for _, _, ok in outcomes)

    def close(self) -> None:
        """Stop the workers (they shut their producers down and delete their topics); safe to call twice."""
        commands_left, self._commands = self._commands, []
        for commands in commands_left:
            commands.put(None)
        for process in self._processes:
            process.join(30)
            if process.is_alive():
                process.kill()


def producer_scaling(
    pool: WorkerPool,
    targets: dict[str, tuple[str, bool]],
    process_counts: list[int],
    seconds: float,
    repeats: int,
    tick: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """One row per (target, processes, mode): median tx/s over ``repeats`` interleaved runs, and the median CPU
    share of the busiest server's main thread over the load's own time."""
    rates: dict[tuple[str, int, str], list[float]] = {}
    busy: dict[tuple[str, int, str], list[float]] = {}
    clients = {name: connect(url, cluster=cluster) for name, (url, cluster) in targets.items()}
    servers = {name: [node for _, node in server_nodes(client)] for name, client in clients.items()}
    complete = True
    try:
        for repeat in range(repeats):
            for name, (url, cluster) in targets.items():
                for processes in process_counts:
                    order = MODES[repeat % 3 :] + MODES[: repeat % 3]
                    for mode in order:
                        rate, cpu_share, stored_all = pool.load(url, cluster, mode, processes, seconds, servers[name])
                        complete = complete and stored_all
                        rates.setdefault((name, processes, mode), []).append(rate)
                        busy.setdefault((name, processes, mode), []).append(cpu_share)
                        tick()
    finally:
        for client in clients.values():
            client.close()
    return [
        {
            "target": name,
            "processes": processes,
            "mode": mode,
            "per_s": spread(values)["median"],
            "server_busy": spread(busy[(name, processes, mode)])["median"],
            "complete": complete,
        }
        for (name, processes, mode), values in rates.items()
    ]
