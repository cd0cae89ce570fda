"""The command line: version, and the demo on its embedded default and on a given Redis."""

from __future__ import annotations

import redis
from click.testing import CliRunner
from rich.console import Console

from redis_txmq import Consumer, __version__
from redis_txmq.cli import _run_checker, main
from redis_txmq.demo import run_demo
from redis_txmq.embedded import EmbeddedRedis


def test_version():
    result = CliRunner().invoke(main, ["version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_demo_on_embedded_default():
    result = CliRunner().invoke(main, ["demo"], env={"TXMQ_REDIS_URL": None})
    assert result.exit_code == 0, result.output
    assert "Embedded Redis (redis-server)" in result.output
    assert "orders [1, 3, 5, 6] committed and consumed once each" in result.output
    assert "check-back: order 6 committed" in result.output
    assert "spark.read.format('redis-txmq') of" in result.output and "order-6" in result.output


def test_demo_on_given_redis_leaves_committed_orders(real_client, redis_url):
    result = CliRunner().invoke(main, ["demo", "--no-spark", "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    keys = [fields[b"keys"] for _, fields in real_client.xrange("orders")]
    assert keys == [b"order-1", b"order-3", b"order-5", b"order-6"]
    assert real_client.xinfo_groups("orders") == [], "the demo removes the consumer group it made"


def test_fakeredis_fallback_runs_the_scripts():
    """Without a redis-server binary the demo runs on fakeredis' TCP server."""
    with EmbeddedRedis(prefer_binary=False) as server:
        assert server.kind == "fakeredis"
        outcome = run_demo(server.url, Console(quiet=True), run_checker=_run_checker)
        assert outcome.ok and outcome.committed == [1, 3, 5, 6] and outcome.recovered_after_seconds
        client = redis.Redis.from_url(server.url)
        assert client.xlen("orders") == 4
        client.close()


def test_consumer_from_url_reads_demo_data(real_client, redis_url):
    assert CliRunner().invoke(main, ["demo", "--no-spark", "--redis-url", redis_url]).exit_code == 0
    with Consumer("orders", "analytics", redis_url=redis_url, block=0.05) as consumer:
        assert len(consumer.poll()) == 4
