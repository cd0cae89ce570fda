"""A producer process SIGKILLed between the decision of a transaction of several messages and the end of every
message (``tests/many_worker.py``): the checker ends the rest with the decision, so every message is in its topic
exactly once and nothing stays in flight."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest

from redis_txmq.checker import Checker
from redis_txmq.core.keys import decision_key, topic_keys_of_stream

from .helpers import wait_until
from .many_worker import MESSAGES, SETTINGS

ROOT = Path(__file__).resolve().parent.parent
STREAMS = ("orders", "audit#0", "audit#1")


@pytest.mark.parametrize("ends_before_kill", [0, 3])
def test_a_producer_killed_between_its_decision_and_its_ends(real_client, redis_url, ends_before_kill):
    worker = subprocess.run(
        [sys.executable, "-m", "tests.many_worker", redis_url, str(ends_before_kill)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == -9, worker.stderr
    transaction_id = worker.stdout.split()[0]
    assert real_client.hget(decision_key(transaction_id), "outcome") == b"COMMIT"
    visible = sum(real_client.xlen(stream) for stream in STREAMS)
    assert visible == ends_before_kill, "the process died part-way through its ends"

    checker = Checker(real_client, SETTINGS)

    def in_flight() -> int:
        return sum(int(real_client.hlen(topic_keys_of_stream(stream).inflight)) for stream in STREAMS)

    wait_until(lambda: checker.run_round() is not None and in_flight() == 0, timeout=30)
    seen = collections.Counter(f[b"body"] for stream in STREAMS for _, f in real_client.xrange(stream))
    assert seen == {message.body: 1 for message in MESSAGES}, "every message once"
    ids = {f[b"transaction_id"].decode() for stream in STREAMS for _, f in real_client.xrange(stream)}
    assert ids == {f"{transaction_id}.{i}" for i in range(len(MESSAGES))}
