"""What keeps the console light on Redis at thousands of topics (``redis_txmq/ops/console/queries.py``): its status
snapshot is read less often as topic streams grow and, once a read is slow, beside the requests rather than in
them; a transaction page left open asks only the stream its transaction was found in. And ``python -m
bench.console`` keeps working (a few topics, a few seconds: it asserts what it reports, never a speed)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from bench.console import console_cost
from redis_txmq import LocalTransactionState, Message, Settings
from redis_txmq.core.keys import TopicKeys
from redis_txmq.ops import admin
from redis_txmq.ops.console import queries
from redis_txmq.ops.console.queries import ConsoleOptions, ConsoleQueries, StatusCache
from redis_txmq.sync.broker import EndSource, RedisBroker

from .helpers import wait_until

pytestmark = pytest.mark.real


def register(client: redis.Redis, count: int) -> None:
    client.sadd("txmq:topics", *[f"topic-{i:04d}" for i in range(count)])


def test_the_snapshot_is_read_less_often_as_topic_streams_grow(real_client: redis.Redis) -> None:
    register(real_client, 40)
    cache = StatusCache(real_client, 15, refresh_seconds=2.0, streams_per_second=10)
    assert cache.period() == 2.0  # nothing read yet
    cache.get()
    assert cache.period() == 4.0  # 40 streams at 10 a second
    assert StatusCache(real_client, 15, refresh_seconds=2.0, streams_per_second=1000).period() == 2.0


class Gate:
    """``admin.status`` made slow on demand: it waits for the test to open the gate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self.fail: Exception | None = None
        real = admin.status

        def status(client: Any, live_seconds: float) -> dict[str, Any]:
            self.entered.set()
            assert self.open.wait(30)
            if self.fail is not None:
                raise self.fail
            return real(client, live_seconds)

        monkeypatch.setattr(queries.admin, "status", status)


def test_a_slow_read_is_made_beside_the_requests_and_its_error_reaches_the_next(
    real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    register(real_client, 1)
    cache = StatusCache(real_client, 15, refresh_seconds=0)
    monkeypatch.setattr(StatusCache, "SLOW_READ_SECONDS", 0.0)  # every read counts as slow
    first, first_ms = cache.get()  # no snapshot yet: read in the request
    assert [t["stream"] for t in first["topics"]] == ["topic-0000"]

    register(real_client, 2)
    gate.open.clear()
    gate.entered.clear()
    started = time.monotonic()
    assert cache.get() == (first, first_ms)  # the last snapshot at once, the next read under way
    assert gate.entered.wait(10) and time.monotonic() - started < 5
    assert cache.get() == (first, first_ms)  # one read at a time
    gate.open.set()
    wait_until(lambda: len(cache.get()[0]["topics"]) == 2)

    gate.fail = redis.ConnectionError("Redis went away")
    with pytest.raises(redis.ConnectionError, match="went away"):
        wait_until(lambda: cache.get() and False, timeout=10)
    gate.fail = None
    assert len(cache.get()[0]["topics"]) == 2  # no snapshot left: read in the request again


def test_after_an_action_the_next_page_waits_for_a_new_read(
    real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    Gate(monkeypatch)
    register(real_client, 1)
    cache = StatusCache(real_client, 15, refresh_seconds=60)
    monkeypatch.setattr(StatusCache, "SLOW_READ_SECONDS", 0.0)
    cache.get()
    register(real_client, 2)
    cache.invalidate()
    assert len(cache.get()[0]["topics"]) == 2


def test_at_thousands_of_streams_a_page_waits_for_a_read_at_most_its_budget(
    real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    register(real_client, 3)
    cache = StatusCache(real_client, 15, refresh_seconds=60, aside_from_streams=3, page_wait_seconds=0.05)
    gate.open.clear()
    cache.start()  # as the console starts: the first read begins beside the requests
    assert gate.entered.wait(10)
    with pytest.raises(queries.StatusPending, match="reading the figures of 3 topic streams"):
        cache.get()
    waited = threading.Thread(target=cache.wait_read)
    waited.start()
    gate.open.set()
    waited.join(10)
    assert not waited.is_alive()
    report, _ = cache.get()
    assert len(report["topics"]) == 3

    register(real_client, 4)
    gate.open.clear()
    gate.entered.clear()
    cache.invalidate()  # an action: the next page must see a read that began after it
    with pytest.raises(queries.StatusPending):
        cache.get()
    assert gate.entered.wait(10)
    gate.open.set()
    wait_until(lambda: _pending_or(cache) == 4)

    gate.fail = redis.ConnectionError("Redis went away")
    cache.invalidate()
    with pytest.raises(redis.ConnectionError, match="went away"):  # a failed read reaches the page that waits
        wait_until(lambda: _pending_or(cache) == -1, timeout=10)
    gate.fail = None
    wait_until(lambda: _pending_or(cache) == 4)


def _pending_or(cache: StatusCache) -> int:
    """The snapshot's stream count, or -1 while the page would be told the figures are being read."""
    try:
        return len(cache.get()[0]["topics"])
    except queries.StatusPending:
        return -1


def test_a_page_says_the_figures_are_being_read_and_the_json_endpoint_waits(
    real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starlette.testclient import TestClient

    from redis_txmq.ops.console.app import create_app

    gate = Gate(monkeypatch)
    register(real_client, 5)
    gate.open.clear()
    options = ConsoleOptions(refresh_seconds=60, aside_from_streams=5, page_wait_seconds=0.05)
    app = create_app(real_client, Settings(), operator_token=None, options=options)
    with TestClient(app, base_url="http://127.0.0.1") as web:  # its startup begins the first read
        assert gate.entered.wait(10)
        page = web.get("/topics")
        assert page.status_code == 200 and 'data-testid="reading"' in page.text
        assert "reading the figures of 5 topic streams" in page.text and 'hx-get="/topics"' in page.text
        poll = web.get("/topics", headers={"HX-Request": "true", "HX-Trigger": "reading"})
        assert 'data-testid="reading"' in poll.text and "HX-Refresh" not in poll.headers
        assert web.get("/topics/topic-0001").status_code == 200  # a topic's page reads its own streams
        assert web.get("/jobs").status_code == 200

        threading.Timer(0.3, gate.open.set).start()
        rows = web.get("/api/topics").json()["rows"]  # waits for the read rather than say it is under way
        assert [r["topic"] for r in rows] == [f"topic-{i:04d}" for i in range(5)]
        poll = web.get("/topics", headers={"HX-Request": "true", "HX-Trigger": "reading"})
        assert poll.headers["HX-Refresh"] == "true"  # read: the reading page reloads into the page itself
        assert 'data-testid="topic-row"' in web.get("/topics").text


def test_a_failing_rates_sample_never_keeps_the_figures_from_the_pages(
    real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    register(real_client, 3)
    console = ConsoleQueries(real_client, 15, ConsoleOptions(refresh_seconds=0))

    def broken(*args: Any) -> None:
        raise ValueError("a reply the rates did not expect")

    monkeypatch.setattr(console.rates, "sample", broken)
    assert [row["topic"] for row in console.topics("", "topic", "asc", 1, 50)["rows"]] == [
        "topic-0000",
        "topic-0001",
        "topic-0002",
    ]
    assert console.overview()["totals"]["streams"] == 3
    assert "what follows the status read failed" in caplog.text


def hmgets(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))


def test_a_transaction_page_left_open_asks_only_its_stream(real_client: redis.Redis) -> None:
    register(real_client, 50)  # topics with nothing in them
    broker = RedisBroker(real_client, Settings())
    broker.load_scripts()
    broker.prepare_half(TopicKeys("orders"), Message("orders", b"{}"), "tx-watched", "orders-service")
    console = ConsoleQueries(real_client, 15, ConsoleOptions(refresh_seconds=60))
    before = hmgets(real_client)
    first = console.transaction("tx-watched")
    assert [(m["stream"], m["state"]) for m in first["messages"]] == [("orders", "IN_FLIGHT")]
    assert hmgets(real_client) - before <= 51 + 2  # ended everywhere, in flight only where something is
    before = hmgets(real_client)
    assert console.transaction("tx-watched")["messages"] == first["messages"]
    assert hmgets(real_client) - before == 3  # where it was found: its three indexes there


def test_a_transaction_newer_than_the_snapshot_is_found(real_client: redis.Redis) -> None:
    console = ConsoleQueries(real_client, 15, ConsoleOptions(refresh_seconds=60))
    broker = RedisBroker(real_client, Settings())
    broker.load_scripts()
    orders = TopicKeys("orders")
    broker.prepare_half(orders, Message("orders", b"{}"), "tx-old", "orders-service")
    broker.end_transaction(orders, "tx-old", "orders-service", LocalTransactionState.COMMIT, source=EndSource.PRODUCER)
    assert [m["state"] for m in console.transaction("tx-old")["messages"]] == ["COMMITTED"]
    broker.prepare_half(orders, Message("orders", b"{}"), "tx-late", "orders-service")
    # the snapshot says nothing is in flight on orders: the transaction is looked for everywhere all the same
    assert [m["state"] for m in console.transaction("tx-late")["messages"]] == ["IN_FLIGHT"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_console_bench_reports_every_page(redis_url: str, real_client: redis.Redis) -> None:
    results = console_cost(redis_url, topics=30, in_flight=90, renders=2, seconds=2.5)
    pages = set(results["paths"])
    assert pages == {"overview", "topics", "topic", "transaction", "transaction_by_key", "dead", "jobs", "audit"}
    assert set(results["render_ms"]) == pages == set(results["open_page"]["pages"])
    for name in pages:
        render, cpu = results["render_ms"][name], results["open_page"]["pages"][name]
        assert 0 < render["median_ms"] <= render["max_ms"] and render["first_ms"] > 0, name
        assert cpu["polls"] >= 1 and cpu["poll_median_ms"] > 0, name
    assert results["render_ms"]["overview"]["first_commands"] > 30  # the snapshot: a few commands per stream
    assert results["data"]["dead_letters"] == 200
    in_flight = sum(real_client.hlen(TopicKeys(f"bench-console-{i:05d}").inflight) for i in range(30))
    assert in_flight == 90
