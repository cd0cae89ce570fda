"""Consumer processes stopped and killed as an orchestrator does, sync and asyncio (``tests/consumer_process.py``):

- SIGTERM, then SIGKILL once the grace period has passed: with handlers of 1 s and a batch of 10, the process exits
  by itself, cleanly, once the message in hand is handled; the rest of its batch is handed back and another
  consumer, whose ``min_idle_time`` is an hour, takes it at once (only the hand-back can explain that), as first
  deliveries (with ``max_deliveries=1`` none is dead-lettered).
- SIGKILL mid-batch: nothing is handed back and its heartbeat stops; once its lease ran out and ``min_idle_time``
  passed, a live consumer takes over its messages, each handled once there.

``manage.py txmq_consume`` gets the same SIGTERM in ``tests/django/test_consumer_stop.py``.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from redis_txmq import Consumer, Settings
from redis_txmq.core.keys import TopicKeys

from .helpers import wait_until
from .test_consumer import COMMIT, send

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
GRACE = 30.0
"""Kubernetes' default ``terminationGracePeriodSeconds``."""
HEARTBEAT_INTERVAL = 0.2
"""The processes' heartbeat interval (``TXMQ_HEARTBEAT_INTERVAL``): a lease of 0.6 s."""


def consumer_process(api: str, redis_url: str, batch: int, seconds: float, started: Path) -> subprocess.Popen[str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "tests.consumer_process", api, redis_url, str(batch), str(seconds), str(started)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path, "TXMQ_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def started_ids(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def stopped(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


def take_all(client: redis.Redis, count: int, **options: Any) -> list[Any]:
    """What a new consumer gets within 10 s, until ``count`` messages came; each acked."""
    taken: list[Any] = []
    with Consumer("orders", "billing", "taker", client=client, block=0.05, **options) as taker:
        wait_until(lambda: taken.extend(taker.poll(0.05)) or len(taken) >= count, timeout=10)
        for message in taken:
            taker.ack(message)
    return taken


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_sigterm_stops_after_the_message_in_hand_and_hands_the_rest_back(
    api: str, real_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    send(real_client, [COMMIT] * 12)
    log = tmp_path / "started"
    process = consumer_process(api, redis_url, 10, 1.0, log)
    try:
        wait_until(lambda: started_ids(log), timeout=30)
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(GRACE)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {GRACE} s after SIGTERM: the orchestrator SIGKILLs it")
    finally:
        stopped(process)
    text = process.stdout.read() if process.stdout else ""
    handled = started_ids(log)
    assert status == 0 and f"handled {len(handled)}" in text, text
    assert len(handled) <= 2, f"only the message in hand after SIGTERM, not the whole batch: {handled}"

    taken = take_all(real_client, 12 - len(handled), min_idle_time=3600, max_deliveries=1)
    ids = [entry_id.decode() for entry_id, _ in real_client.xrange("orders")]
    assert sorted(m.id for m in taken) == sorted(set(ids) - set(handled))
    assert {m.delivery_count for m in taken} == {1}, "handed back undelivered"
    assert real_client.xlen(TopicKeys("orders").consumer_dead_stream("billing")) == 0


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_a_sigkilled_consumers_messages_are_taken_over_once_its_lease_ran_out(
    api: str, real_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    send(real_client, [COMMIT] * 3)
    log = tmp_path / "started"
    process = consumer_process(api, redis_url, 3, 600.0, log)
    try:
        wait_until(lambda: started_ids(log), timeout=30)
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    finally:
        stopped(process)
    settings = Settings(heartbeat_interval=HEARTBEAT_INTERVAL)
    taken = take_all(real_client, 3, min_idle_time=0.5, settings=settings)
    counts = collections.Counter(m.id for m in taken)
    assert len(counts) == 3 and max(counts.values()) == 1, "each taken over once"
    assert {m.delivery_count for m in taken} == {2}
    assert real_client.xpending("orders", "billing")["pending"] == 0
