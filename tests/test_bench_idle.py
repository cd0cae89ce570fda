"""``python -m bench.idle_checker`` keeps working: three topics, a one-second window, two check-backs. It asserts what
the run reports and that it leaves nothing behind, never a speed."""

from __future__ import annotations

import pytest

from bench.common import Answer
from bench.idle_checker import IDLE_PREFIX, idle_checker_cost
from redis_txmq import LocalTransactionState, Message, TransactionProducer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def test_idle_checker_bench_reports_every_figure_and_leaves_no_bench_keys(real_client):
    real_client.set("someone-elses-key", b"kept")
    (row,) = idle_checker_cost(real_client, [3], 1.0, samples=2)
    assert row["topics"] == 3 and row["setup_topics_added"] == 3 and row["setup_seconds"] > 0
    assert row["redis_cpu_pct"] > 0 and row["redis_cpu_pct_no_checker"] >= 0 and row["checker_cpu_pct"] > 0
    assert row["redis_cpu_pct_with_passes"] >= row["redis_cpu_pct"]
    assert row["first_round_seconds"] > 0 and row["loop_rounds"] >= 0  # a one-second window may hold no whole round
    checkback = row["checkback_ms"]
    assert len(checkback["samples"]) == 2 and all(ms >= 0 for ms in checkback["samples"])
    assert checkback["median"] <= checkback["max"] and row["checkback_vs_smallest"] == 1.0
    assert real_client.get("someone-elses-key") == b"kept"
    leftovers = [key for key in real_client.keys("*bench-*") if real_client.type(key) != b"none"]
    assert leftovers == [], leftovers


def test_idle_checker_bench_refuses_a_redis_with_topics_of_others(real_client, redis_url):
    commit = Answer(LocalTransactionState.COMMIT)
    with TransactionProducer("orders-service", commit, client=real_client) as producer:
        producer.send_message_in_transaction(Message("orders", b"{}"))
    with pytest.raises(RuntimeError, match="a Redis of its own"):
        idle_checker_cost(redis_url, [3], 1.0, samples=1)
    assert real_client.xlen("orders") == 1
    assert not real_client.keys(f"*{IDLE_PREFIX}*")
