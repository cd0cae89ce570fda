"""Aggregate transaction rate of several producer processes: one standalone Redis against a 3-master cluster.

    python bench/producers_rate.py [--processes 4] [--seconds 5]

Starts its own redis-server and its own 3-master cluster (ports on 127.0.0.1), then runs the same load on each:
N processes, each a TransactionProducer committing transactions to its own topic for ``seconds``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import subprocess
import tempfile
import time

import redis

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.embedded import EmbeddedRedis, free_port, wait_for_ping


class CommitAll(TransactionListener):
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message):
        return LocalTransactionState.COMMIT


def producer_process(url: str, cluster: bool, topic: str, seconds: float, start_at: float, out) -> None:
    settings = Settings(redis_url=url, cluster=cluster)
    body = b'{"order_id": 123456, "amount": 42.5}'
    with TransactionProducer("bench_group", CommitAll(), settings=settings) as producer:
        while time.time() < start_at:
            time.sleep(0.001)
        sent, deadline = 0, start_at + seconds
        while time.time() < deadline:
            producer.send_message_in_transaction(Message(topic, body))
            sent += 1
    out.put(sent)


def run_load(url: str, cluster: bool, processes: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3
    workers = [
        ctx.Process(target=producer_process, args=(url, cluster, f"bench-topic-{i}", seconds, start_at, out))
        for i in range(processes)
    ]
    for w in workers:
        w.start()
    total = sum(out.get(timeout=seconds + 60) for _ in workers)
    for w in workers:
        w.join()
    return total / seconds


def start_cluster(workdir: str) -> tuple[str, list[subprocess.Popen]]:
    ports = []
    while len(ports) < 3:
        port = free_port()
        if port + 10000 <= 65535:
            ports.append(port)
    procs = [
        subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(p),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{p}.conf",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
            ],
            stdout=subprocess.DEVNULL,
        )
        for p in ports
    ]
    for p in ports:
        wait_for_ping(f"redis://127.0.0.1:{p}/0")
    subprocess.run(
        ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-yes"],
        check=True,
        capture_output=True,
    )
    node = redis.Redis(port=ports[0])
    while b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
        time.sleep(0.1)
    return f"redis://127.0.0.1:{ports[0]}/0", procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    options = parser.parse_args()
    assert shutil.which("redis-server") and shutil.which("redis-cli"), "needs redis-server and redis-cli"
    with EmbeddedRedis() as server:
        standalone = run_load(server.url, False, options.processes, options.seconds)
    with tempfile.TemporaryDirectory() as workdir:
        url, procs = start_cluster(workdir)
        try:
            clustered = run_load(url, True, options.processes, options.seconds)
        finally:
            for p in procs:
                p.terminate()
                p.wait()
    print(f"{options.processes} producer processes, {options.seconds:.0f} s each")
    print(f"  standalone redis-server: {standalone:,.0f} tx/s")
    print(f"  3-master cluster:        {clustered:,.0f} tx/s  (ratio {clustered / standalone:.2f})")


if __name__ == "__main__":
    main()
