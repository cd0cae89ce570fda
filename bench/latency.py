"""Latency percentiles at a given load: a plain ``XADD``, a sync transactional send, and commit-to-consumer delivery,
open-loop at 50% and 90% of the sync producer's measured capacity.

First a short calibration: one thread sends sync transactions back to back, and its rate is the capacity. Then
each round runs one block per (mode, load), in an order that rotates every round (and is reversed every other
round), so the machine's drift hits all alike; the samples of a mode and load are pooled over the rounds. Each round
also sends back to back again for a quarter of a block (``capacity_in_rounds``): where that falls below 90% of the
calibration, the machine carried less during the rounds than at the start, and the 90% load was an overload there.

A block is open-loop: send ``i`` is scheduled at ``t0 + i / rate`` and its latency is measured from that scheduled
time, not from when the sender got round to it, so a stall shows in every send it delays (coordinated omission).
A sender that falls behind sends back to back until it catches up. The sender's thread sleeps between sends with
the kernel's timer slack set to 1 ns where it can (Linux ``prctl``) and spins the last 0.1 ms before each start (a
sleep wakes late); each block reports how late sends started (``start_lag``: the harness' own delay, included in the
latencies, and the sender's backlog when it falls behind).

- ``xadd``: one ``XADD`` request of the same body; latency until its reply.
- ``sync``: ``TransactionProducer.send_message_in_transaction`` with an empty local transaction answering COMMIT;
  latency until it returns (prepare, local transaction, end).
- ``delivery``: the same sync send to another topic, which a consumer of the library (``redis_txmq.Consumer``, in a
  process of its own, ``poll`` then ``ack`` each message) reads; latency from the send's scheduled start, carried in
  a message property, to the moment the consumer's code has the message. Both processes read ``time.monotonic_ns``
  (``CLOCK_MONOTONIC``, one clock for the whole machine on Linux).

All three at the same rates: the ``XADD`` figures are a floor at the same load, not at the ``XADD``'s own capacity.

``python -m bench.latency [--seconds S] [--rounds R] [--json FILE]`` runs only this part on a Redis of its own.
"""

from __future__ import annotations

import ctypes
import gc
import math
import multiprocessing
import os
import sys
import time
from array import array
from collections.abc import Callable
from typing import Any

from redis_txmq import Consumer, LocalTransactionState, Message, TransactionProducer

from .common import BODY, TOPIC_PREFIX, Answer, delete_topic, server_cpu_seconds, spread

PLAIN = f"{TOPIC_PREFIX}latency-plain"
SYNC_TOPIC = f"{TOPIC_PREFIX}latency-sync"
DELIVERY_TOPIC = f"{TOPIC_PREFIX}latency-delivery"
PRODUCER_GROUP = f"{TOPIC_PREFIX}latency"
CONSUMER_GROUP = f"{TOPIC_PREFIX}latency-consumer"
START_PROPERTY = "bench-start-ns"
"""The send's scheduled start (``time.monotonic_ns``), carried by every transactional message of this part."""
MODES = ("xadd", "sync", "delivery")
LOADS = (0.5, 0.9)
WARM_UP = 200
"""Unpaced sends of each mode before the calibration: scripts loaded, connections open, the consumer reading."""
PERCENTILES = {"p50": 0.50, "p99": 0.99, "p999": 0.999}
SPIN_NS = 100_000
"""The sender sleeps until this long before a send's scheduled start and spins the rest: a sleep here wakes
50-100 µs late, which would be in every latency (and at 90% load eat the gap between sends)."""


def _fine_timer_slack() -> bool:
    """Ask the kernel to wake this thread's sleeps on time (Linux: 50 µs of slack by default); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(29, 1, 0, 0, 0) == 0  # PR_SET_TIMERSLACK, 1 ns
    except (OSError, AttributeError):
        return False


def _consume(url: str, counter: Any, ready: Any, stop: Any, results: Any, parent: int) -> None:
    """The consumer process: reads the delivery topic, notes when each message arrives, acks it; sends the
    ``(scheduled start, arrival)`` pairs back through ``results`` when told to stop (or exits with its parent)."""
    starts, arrivals = array("q"), array("q")
    consumer = Consumer(DELIVERY_TOPIC, CONSUMER_GROUP, redis_url=url, start_id="$", min_idle_time=600)
    cpu = time.process_time()
    try:
        ready.set()
        while not stop.is_set() and os.getppid() == parent:
            for message in consumer.poll(0.2):
                arrived = time.monotonic_ns()
                starts.append(int(message.properties.get(START_PROPERTY, "0")))
                arrivals.append(arrived)
                consumer.ack(message)
                counter.value += 1
    finally:
        consumer.close()
        results.send((starts, arrivals, time.process_time() - cpu))
        results.close()


class _ConsumerProcess:
    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.counter = context.RawValue("q", 0)
        self._ready, self._stop = context.Event(), context.Event()
        self._results, child_end = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_consume,
            args=(url, self.counter, self._ready, self._stop, child_end, os.getpid()),
            daemon=True,
        )
        self._process.start()
        child_end.close()
        if not self._ready.wait(60):
            self.close()
            raise RuntimeError("the consumer process did not start within 60 s")

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether ``count`` messages in all have arrived before ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while self.counter.value < count:
            if time.monotonic() > deadline or not self._process.is_alive():
                return False
            time.sleep(0.002)
        return True

    def close(self) -> tuple[array[int], array[int], float]:
        """Stop the consumer; its ``(scheduled starts, arrivals, CPU seconds)``, empty if it died."""
        self._stop.set()
        outcome: tuple[array[int], array[int], float] = (array("q"), array("q"), 0.0)
        if self._results.poll(30):
            try:
                outcome = self._results.recv()
            except EOFError:
                pass
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
        return outcome


def _paced(send: Callable[[int], None], rate: float, count: int) -> tuple[array[int], array[int], int]:
    """``count`` calls of ``send(scheduled_ns)``, call ``i`` scheduled at ``t0 + i / rate``: the latencies from the
    schedule (ns), how late each call started (ns), and the block's wall time (ns) until the last call returned."""
    interval = 1e9 / rate
    latencies, lags = array("q"), array("q")
    t0 = time.monotonic_ns() + 1_000_000
    for i in range(count):
        scheduled = t0 + round(i * interval)
        now = time.monotonic_ns()
        if scheduled - now > SPIN_NS:
            time.sleep((scheduled - now - SPIN_NS) / 1e9)
        while now < scheduled:
            now = time.monotonic_ns()
        lags.append(now - scheduled)
        send(scheduled)
        latencies.append(time.monotonic_ns() - scheduled)
    return latencies, lags, time.monotonic_ns() - t0


def percentile(ordered: list[int] | array[int], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


def _summary(samples: list[int], count: int, wall_ns: int) -> dict[str, Any]:
    ordered = sorted(samples)
    row: dict[str, Any] = {"samples": len(ordered), "achieved_per_s": count / (wall_ns / 1e9) if wall_ns else 0.0}
    for name, q in PERCENTILES.items():
        row[f"{name}_ms"] = percentile(ordered, q) / 1e6 if ordered else None
    row["max_ms"] = ordered[-1] / 1e6 if ordered else None
    return row


def measure_latency(
    url: str,
    client: Any,
    seconds: float = 8.0,
    rounds: int = 8,
    calibration: float = 2.0,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Capacity, then p50 / p99 / p99.9 per mode and load; ``seconds`` of paced sending per mode and load, split
    over ``rounds``; ``tick`` is called after the calibration and after every block (``1 + 6 * rounds`` in all)."""
    for topic in (SYNC_TOPIC, DELIVERY_TOPIC):
        delete_topic(client, topic)
    client.delete(PLAIN)
    fine_slack = _fine_timer_slack()
    producer = TransactionProducer(PRODUCER_GROUP, Answer(LocalTransactionState.COMMIT), client=client).start()
    consumer: _ConsumerProcess | None = None
    consumed: tuple[array[int], array[int], float] = (array("q"), array("q"), 0.0)
    latencies: dict[tuple[str, float], list[int]] = {(m, load): [] for m in MODES for load in LOADS}
    lags: dict[tuple[str, float], list[int]] = {(m, load): [] for m in MODES for load in LOADS}
    sent: dict[tuple[str, float], int] = {key: 0 for key in latencies}
    client_cpu: dict[tuple[str, float], float] = {key: 0.0 for key in latencies}
    server_cpu: dict[tuple[str, float], float] = {key: 0.0 for key in latencies}
    wall: dict[tuple[str, float], int] = {key: 0 for key in latencies}
    delivery_windows: list[tuple[int, int, float]] = []
    capacity_in_rounds: list[float] = []
    undelivered_blocks = 0
    try:
        # a delivery topic with a consumer group before the consumer starts from "$": none of the sends is missed
        producer.send_message_in_transaction(Message(DELIVERY_TOPIC, BODY, properties={START_PROPERTY: "0"}))
        consumer = _ConsumerProcess(url)

        def xadd(scheduled: int) -> None:
            client.xadd(PLAIN, {"body": BODY})

        def sync(scheduled: int) -> None:
            producer.send_message_in_transaction(Message(SYNC_TOPIC, BODY, properties={START_PROPERTY: str(scheduled)}))

        def delivery(scheduled: int) -> None:
            producer.send_message_in_transaction(
                Message(DELIVERY_TOPIC, BODY, properties={START_PROPERTY: str(scheduled)})
            )

        sends = {"xadd": xadd, "sync": sync, "delivery": delivery}
        for send in sends.values():
            for _ in range(WARM_UP):
                send(time.monotonic_ns())
        expected = WARM_UP
        consumer.wait_for(expected, 30)

        def back_to_back(seconds: float) -> float:
            count = 0
            started = time.perf_counter()
            deadline = started + seconds
            while time.perf_counter() < deadline:
                for _ in range(20):
                    sync(time.monotonic_ns())
                count += 20
            return count / (time.perf_counter() - started)

        capacity = back_to_back(calibration)
        tick()

        cells = [(mode, load) for load in LOADS for mode in MODES] + [("capacity", 1.0)]
        block_seconds = seconds / rounds
        for i in range(rounds):
            order = cells[i % len(cells) :] + cells[: i % len(cells)]
            for mode, load in order if i % 2 else reversed(order):
                if mode == "capacity":
                    capacity_in_rounds.append(back_to_back(block_seconds / 4))
                    continue
                rate = load * capacity
                count = max(1, round(rate * block_seconds))
                gc.collect()
                server_before, client_before = server_cpu_seconds(client), time.process_time()
                first = time.monotonic_ns()
                block, block_lags, wall_ns = _paced(sends[mode], rate, count)
                key = (mode, load)
                sent[key] += count
                wall[key] += wall_ns
                lags[key].extend(block_lags)
                if mode == "delivery":
                    delivery_windows.append((first, time.monotonic_ns(), load))
                    expected += count
                    if not consumer.wait_for(expected, 10 + 5 * block_seconds):
                        undelivered_blocks += 1
                        expected = consumer.counter.value
                else:
                    latencies[key].extend(block)
                client_cpu[key] += time.process_time() - client_before
                server_cpu[key] += server_cpu_seconds(client) - server_before
                tick()
    finally:
        if consumer is not None:
            consumed = consumer.close()
        producer.shutdown()
        for topic in (SYNC_TOPIC, DELIVERY_TOPIC):
            delete_topic(client, topic)
        client.delete(PLAIN)

    starts, arrivals, consumer_cpu = consumed
    for start, arrived in zip(starts, arrivals, strict=True):
        for first, last, load in delivery_windows:
            if first <= start <= last:
                latencies[("delivery", load)].append(arrived - start)
                break
    rows = []
    for load in LOADS:
        for mode in MODES:
            key = (mode, load)
            row = {"mode": mode, "load": load, "target_per_s": load * capacity, "sent": sent[key]}
            row |= _summary(latencies[key], sent[key], wall[key])
            ordered_lags = sorted(lags[key])
            row["start_lag_p50_ms"] = percentile(ordered_lags, 0.5) / 1e6 if ordered_lags else None
            row["start_lag_p99_ms"] = percentile(ordered_lags, 0.99) / 1e6 if ordered_lags else None
            row["client_cpu_us_per_send"] = client_cpu[key] / sent[key] * 1e6 if sent[key] else None
            row["server_cpu_us_per_send"] = server_cpu[key] / sent[key] * 1e6 if sent[key] else None
            if mode == "delivery":
                row["delivered"] = len(latencies[key])
            rows.append(row)
    return {
        "capacity_per_s": capacity,
        "calibration_s": calibration,
        "capacity_in_rounds": spread(capacity_in_rounds),
        "seconds": seconds,
        "rounds": rounds,
        "fine_timer_slack": fine_slack,
        "undelivered_blocks": undelivered_blocks,
        "consumer_cpu_us_per_message": consumer_cpu / len(starts) * 1e6 if starts else None,
        "rows": rows,
    }


def main() -> None:
    """``python -m bench.latency [--seconds S] [--rounds R] [--json FILE]``: only this part, on a Redis of its own."""
    import argparse
    from pathlib import Path

    from rich.console import Console

    from redis_txmq.transport.connection import connect
    from redis_txmq.transport.embedded import EmbeddedRedis

    from .report import latency_table, write_json

    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="paced sending per mode and load (default 8)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds the seconds are split over (8)")
    parser.add_argument("--calibration", type=float, default=2.0, help="seconds of the capacity run (default 2)")
    parser.add_argument("--json", dest="json_path", help="write the results to this file")
    args = parser.parse_args()
    if args.seconds <= 0 or args.rounds < 1 or args.calibration <= 0:
        parser.error("--seconds and --calibration must be > 0, --rounds >= 1")
    console = Console()
    with EmbeddedRedis() as server:
        client = connect(server.url)
        try:
            results = {"latency": measure_latency(server.url, client, args.seconds, args.rounds, args.calibration)}
        finally:
            client.close()
    console.print(latency_table(results))
    if args.json_path:
        write_json(results, Path(args.json_path))


if __name__ == "__main__":
    main()
