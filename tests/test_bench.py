"""`txmq bench --quick`: the benchmark keeps working (a few hundred transactions per part). It asserts what the
run reports and that its checks of exactly-once hold, never a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from redis_txmq.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TXMQ = str(Path(sys.executable).parent / "txmq")


def test_quick_bench_reports_every_part_and_leaves_no_bench_keys(real_client, redis_url, tmp_path):
    real_client.set("someone-elses-key", b"kept")
    results_path, chart_path = tmp_path / "bench.json", tmp_path / "bench.png"
    run = subprocess.run(
        [TXMQ, "bench", "--quick", "--redis-url", redis_url, "--json", str(results_path), "--plot", str(chart_path)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "redis-txmq benchmark" in run.stdout and "ratio to XADD" in run.stdout
    results = json.loads(results_path.read_text())
    send = results["send"]
    assert send["exactly_once"] and send["rounds"] == 4 and send["per_round"] == 50
    assert 0 < send["sync_ratio"]["median"] and 0 < send["oneway_ratio"]["median"]
    assert 0 < send["direct_vs_redis_py"]["median"] and 0 < send["asyncio_vs_sync"]["median"]
    assert {(r["processes"], r["mode"]) for r in results["producers"]} == {
        (p, m) for p in (1, 2) for m in ("xadd", "sync", "oneway")
    }
    assert all(r["complete"] and r["per_s"] > 0 for r in results["producers"])
    cpu = results["server_cpu"]
    assert all(cpu["usec_per_op"][mode] > 0 for mode in ("xadd", "sync", "oneway"))
    assert cpu["script_usec_per_tx"]["sync"] > 0 and cpu["sync_vs_xadd"]["median"] > 0
    assert "master" in results["durability"]["per_s"]
    (checkback,) = results["checkback"]
    assert checkback["in_flight"] == 200 and checkback["exactly_once"] and checkback["checkbacks_per_s"] > 0
    latency = results["latency"]
    assert latency["capacity_per_s"] > 0 and "latency from the scheduled start" in run.stdout
    assert {(r["mode"], r["load"]) for r in latency["rows"]} == {
        (m, load) for m in ("xadd", "sync", "delivery") for load in (0.5, 0.9)
    }
    assert all(r["samples"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"] for r in latency["rows"])
    memory = results["memory"]
    assert memory["in_flight_bytes_per_tx"] > 0 and memory["finished_bytes_per_tx_after_window"] is None
    assert chart_path.read_bytes().startswith(b"\x89PNG")
    assert real_client.get("someone-elses-key") == b"kept"
    leftovers = [k for k in real_client.keys("*bench-*") if real_client.type(k) != b"none"]
    assert leftovers == [], leftovers


def test_bench_refuses_malformed_counts():
    run = subprocess.run([TXMQ, "bench", "--processes", "1,x"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "comma-separated" in run.stderr


def test_bench_without_the_benchmarks_says_to_use_a_source_checkout(monkeypatch):
    """The wheel does not ship `bench`: without it the command says where the benchmarks are, in one line."""
    monkeypatch.setitem(sys.modules, "bench", None)
    result = CliRunner().invoke(main, ["bench", "--quick"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "source checkout" in line and "pip install -e '.[bench]'" in line
