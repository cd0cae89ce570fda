"""The FastAPI example served by uvicorn in a process of its own, stopped as an orchestrator stops a pod: SIGTERM in
the middle of a stream of orders, then SIGKILL if it has not exited after the 30 s grace period. Uvicorn's graceful
shutdown lets the requests under way finish, then runs the app's lifespan shutdown (the producer stops). Every order
the database holds is published once, every order answered 201 is among them, nothing else is published, and the
process exits by itself."""

from __future__ import annotations

import collections
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

for extra in ("fastapi", "uvicorn", "httpx", "aiosqlite"):
    pytest.importorskip(extra, reason="the example service needs the `example` extra: pip install -e '.[example]'")

import httpx  # noqa: E402

from redis_txmq import Settings  # noqa: E402
from redis_txmq.checker import Checker  # noqa: E402
from redis_txmq.core.keys import TopicKeys  # noqa: E402
from redis_txmq.transport.embedded import free_port  # noqa: E402

from .helpers import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KEYS = TopicKeys("fastapi-orders")  # the example's topic (examples/fastapi_orders.py, TOPIC)
GRACE_SECONDS = 30.0
"""Kubernetes' default ``terminationGracePeriodSeconds``."""
pytestmark = pytest.mark.slow


def test_sigterm_mid_traffic_then_sigkill_after_the_grace_period(real_client: Any, redis_url: str, tmp_path: Path):
    port = free_port()
    database = tmp_path / "orders.db"
    service = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "fastapi_orders.py"), "--redis-url", redis_url, "--port", str(port)]
        + ["--database-url", f"sqlite+aiosqlite:///{database}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    answers: dict[int, int] = {}
    stop = threading.Event()

    def place_orders() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for order_id in range(1, 10_000):
                if stop.is_set():
                    return
                try:
                    response = http.post("/orders", json={"id": order_id, "customer": "ada", "amount": 1.0})
                except httpx.TransportError:
                    answers[order_id] = 0  # refused or cut: the server is going away
                    return
                answers[order_id] = response.status_code

    try:
        wait_until(lambda: _answers(port), timeout=60, interval=0.1)
        sender = threading.Thread(target=place_orders)
        sender.start()
        wait_until(lambda: sum(1 for status in answers.values() if status == 201) >= 20, timeout=60)
        service.send_signal(signal.SIGTERM)
        try:
            status = service.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            service.kill()
            status = service.wait(10)
        stop.set()
        sender.join(30)
        output = service.stdout.read() if service.stdout else ""
        # uvicorn re-raises the SIGTERM once its graceful shutdown is over: -15 is a clean exit, -9 our SIGKILL
        assert status in (0, -signal.SIGTERM), f"not stopped within the grace period ({status}):\n{output[-3000:]}"
        assert "Application shutdown complete" in output, output[-3000:]
    finally:
        stop.set()
        if service.poll() is None:
            service.kill()
            service.wait(10)
    with sqlite3.connect(database) as db:
        saved = dict(db.execute("SELECT order_id, transaction_id FROM orders").fetchall())
    Checker(real_client, Settings(transaction_timeout=0)).run_round()  # nothing should be left to it
    published = collections.Counter(
        fields[b"transaction_id"].decode() for _, fields in real_client.xrange(KEYS.topic_stream)
    )
    accepted = {order_id for order_id, status in answers.items() if status == 201}
    assert accepted <= set(saved), "an order answered 201 is in the database"
    assert published == dict.fromkeys(saved.values(), 1), "each saved order published once, nothing else"
    assert real_client.hlen(KEYS.inflight) == 0, "the shutdown left nothing in flight"


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/orders/1", timeout=2).status_code == 404
    except httpx.TransportError:
        return False
