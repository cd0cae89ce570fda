"""Check-backs resolved per second by one checker, with N transactions in flight.

    python bench/checkback_rate.py [--redis-url URL] [--in-flight 10000] [--check-threads 4]

Leaves N transactions UNKNOWN (their producer "crashed"), then starts one producer instance that answers COMMIT
and one checker with transaction_timeout 0, and times from the checker's start until every transaction is
committed. Also checks that each was committed exactly once. Without ``--redis-url`` it starts its own redis-server.
"""

from __future__ import annotations

import argparse
import threading
import time

import redis
from common import run_and_print

from checker import Checker
from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer


class Answer(TransactionListener):
    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, message, arg):
        return self.state

    def check_local_transaction(self, message):
        return self.state


def measure(redis_url: str, in_flight: int, check_threads: int) -> dict[str, float]:
    client = redis.Redis.from_url(redis_url)
    topic = "bench-checkback"
    client.delete(topic)
    settings = Settings(
        transaction_timeout=0.0, check_interval=30.0, check_threads=check_threads, heartbeat_interval=1.0
    )
    with TransactionProducer(
        "bench_crashed", Answer(LocalTransactionState.UNKNOWN), client=client, settings=settings
    ) as crashed:
        for i in range(in_flight):
            crashed.send_message_in_transaction(Message(topic, b"x" * 64, keys=f"k{i}"))
    stop = threading.Event()
    with TransactionProducer("bench_crashed", Answer(LocalTransactionState.COMMIT), client=client, settings=settings):
        checker = Checker(client, settings, scan_interval=0.05)
        checker.start()
        started = time.perf_counter()
        worker = threading.Thread(target=checker.run, args=(stop,))
        worker.start()
        deadline = started + 600
        while client.xlen(topic) < in_flight and time.perf_counter() < deadline:
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        stop.set()
        worker.join()
    committed = client.xlen(topic)
    ids = {fields[b"transaction_id"] for _, fields in client.xrange(topic)}
    client.delete(topic)
    client.close()
    assert committed == in_flight == len(ids), f"{committed} committed, {len(ids)} distinct, {in_flight} expected"
    return {"in_flight": in_flight, "seconds": elapsed, "checkbacks_per_s": in_flight / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--check-threads", type=int, default=1)
    options = parser.parse_args()
    run_and_print(measure, options.redis_url, in_flight=options.in_flight, check_threads=options.check_threads)


if __name__ == "__main__":
    main()
