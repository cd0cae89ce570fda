"""Sync send rate against plain XADD, interleaved in one process on one Redis.

    python bench/send_rate.py [--redis-url URL] [--rounds 40] [--per-round 200]

Each round times ``per-round`` plain XADDs and ``per-round`` committed transactions back to back (in
alternating order), so the machine's drift hits both alike; the median of the per-round ratios is the result.
Without ``--redis-url`` it starts its own redis-server on a free port.
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis
from common import run_and_print

from redis_txmq import LocalTransactionState, Message, TransactionListener, TransactionProducer


class CommitAll(TransactionListener):
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message):
        return LocalTransactionState.COMMIT


def measure(redis_url: str, rounds: int, per_round: int) -> dict[str, float]:
    client = redis.Redis.from_url(redis_url)
    body = b'{"order_id": 123456, "amount": 42.5, "customer": "someone"}'
    ratios, xadd_rates, send_rates = [], [], []
    with TransactionProducer("bench_group", CommitAll(), client=client) as producer:
        producer.send_message_in_transaction(Message("bench-tx", body))  # warm up: scripts, registry

        def plain() -> float:
            start = time.perf_counter()
            for _ in range(per_round):
                client.xadd("bench-plain", {"body": body})
            return per_round / (time.perf_counter() - start)

        def transactional() -> float:
            start = time.perf_counter()
            for _ in range(per_round):
                producer.send_message_in_transaction(Message("bench-tx", body))
            return per_round / (time.perf_counter() - start)

        for i in range(rounds):
            if i % 2:
                send_rate, xadd_rate = transactional(), plain()
            else:
                xadd_rate, send_rate = plain(), transactional()
            xadd_rates.append(xadd_rate)
            send_rates.append(send_rate)
            ratios.append(send_rate / xadd_rate)
    committed = client.xlen("bench-tx")
    client.delete("bench-plain", "bench-tx")
    client.close()
    assert committed == rounds * per_round + 1, f"expected every send committed once, found {committed}"
    return {
        "xadd_per_s": statistics.median(xadd_rates),
        "send_per_s": statistics.median(send_rates),
        "ratio_median": statistics.median(ratios),
        "ratio_p10": statistics.quantiles(ratios, n=10)[0],
        "ratio_p90": statistics.quantiles(ratios, n=10)[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--per-round", type=int, default=200)
    options = parser.parse_args()
    run_and_print(measure, options.redis_url, rounds=options.rounds, per_round=options.per_round)


if __name__ == "__main__":
    main()
