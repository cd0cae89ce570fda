"""`txmq demo` on a Redis that is not its own: every run passes, leaves nothing in flight and touches only what it
wrote itself."""

from __future__ import annotations

import json
import threading

from click.testing import CliRunner
from rich.console import Console

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.cli import main
from redis_txmq.core.keys import GROUP_REGISTRY, TopicKeys
from redis_txmq.ops.demo import TOPIC, run_demo
from tests.helpers import ScriptedListener

UNKNOWN = LocalTransactionState.UNKNOWN


def _status(redis_url: str) -> dict:
    out = CliRunner().invoke(main, ["status", "--json", "--redis-url", redis_url])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_demo_passes_every_time_on_the_same_redis_and_leaves_nothing_in_flight(real_client, redis_url):
    for run in range(3):
        result = CliRunner().invoke(main, ["demo", "--no-spark", "--redis-url", redis_url])
        assert result.exit_code == 0, f"run {run + 1}:\n{result.output}"
        assert "orders [1, 3, 5, 6] committed and consumed once each" in result.output
        (orders,) = _status(redis_url)["topics"]
        assert (orders["topic"], orders["in_flight"], orders["dead_letters"]) == (TOPIC, 0, 0)
    entries = [fields for _, fields in real_client.xrange(TOPIC)]
    assert [f[b"keys"] for f in entries] == [b"order-1", b"order-3", b"order-5", b"order-6"] * 3
    runs = [json.loads(f[b"properties"])["demo_run"] for f in entries]
    assert len(set(runs)) == 3 and all(runs[i] == runs[i // 4 * 4] for i in range(12)), "one run id per run"
    assert real_client.xinfo_groups(TOPIC) == [], "each run removes the consumer group it made"
    assert real_client.smembers(GROUP_REGISTRY) == set(), "each run forgets the producer group it made"
    assert real_client.keys("txmq:group:*") == []


def test_demo_touches_no_one_elses_transactions_or_entries(real_client, redis_url):
    """Another service's in-flight transactions, due for a check at once (on `orders` itself, in a group named like
    the demo's service, and on another topic), its entries and its consumer group are left as they were: the demo
    answers checks for its own transactions only, and its checker looks at `orders` only."""
    real_client.xadd(TOPIC, {"body": b"not the demo's json"})
    real_client.xgroup_create(TOPIC, "their-billing", id="0")
    theirs = {}
    for topic, group in ((TOPIC, "order-service"), ("payments", "payment-service")):
        with TransactionProducer(group, ScriptedListener(), redis_url=redis_url) as producer:
            message = Message(topic, b"in their hands", check_immunity_seconds=0.001)
            theirs[topic] = producer.send_message_in_transaction(message, UNKNOWN)

    result = CliRunner().invoke(main, ["demo", "--no-spark", "--redis-url", redis_url])

    assert result.exit_code == 0, result.output
    for topic, sent in theirs.items():
        assert real_client.hexists(TopicKeys(topic).inflight, sent.transaction_id), f"{topic}: not in flight any more"
    assert not real_client.hexists(TopicKeys("payments").checks, theirs["payments"].transaction_id)
    assert real_client.xrange(TOPIC, count=1)[0][1] == {b"body": b"not the demo's json"}
    assert [g["name"] for g in real_client.xinfo_groups(TOPIC)] == [b"their-billing"]
    assert real_client.smembers(GROUP_REGISTRY) == {b"order-service", b"payment-service"}


def test_a_check_back_that_never_comes_leaves_nothing_in_flight(real_client, redis_url):
    """No checker answers within the recovery time: the run fails, and it ends its own transaction on its way out
    (as its order database says: the order was saved, so COMMIT)."""

    def idle_checker(url: str, settings: Settings, topic: str, stop: threading.Event) -> None:
        stop.wait()

    outcome = run_demo(redis_url, Console(quiet=True), run_checker=idle_checker, recovery_timeout=0.2)

    assert not outcome.ok and outcome.recovered_after_seconds is None
    assert real_client.hlen(TopicKeys(TOPIC).inflight) == 0
    assert [f[b"keys"] for _, f in real_client.xrange(TOPIC)] == [b"order-1", b"order-3", b"order-5", b"order-6"]
    assert real_client.smembers(GROUP_REGISTRY) == set() and real_client.xinfo_groups(TOPIC) == []


def test_the_demos_spark_step_prints_its_table_and_nothing_of_the_jvm(redis_url):
    """The Spark step starts a JVM of its own: its start-up lines (module warnings, Spark's log level notice) and
    the progress bar would land between the tables; they go to a log file instead."""
    import importlib.util
    import os
    import shutil
    import subprocess
    import sys

    import pytest

    if (shutil.which("java") is None or importlib.util.find_spec("pyspark") is None) and not os.environ.get(
        "TXMQ_REQUIRE_SPARK"
    ):
        pytest.skip("needs Java and the spark extra")
    run = subprocess.run(
        [sys.executable, "-c", "from redis_txmq.cli import main; main()", "demo", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "COLUMNS": "120"},
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "spark.read.format('redis-txmq')" in output, output
    for noise in ("Setting default log level", "WARNING: Using incubator", "[Stage ", "log4j"):
        assert noise not in output, f"{noise!r} printed by the demo's Spark step:\n{output}"
