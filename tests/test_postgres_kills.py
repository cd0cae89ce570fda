"""Processes on PostgreSQL and on MariaDB killed at the worst moments (``tests/pg_service.py``, whose database is
the URL it is given): a producer SIGKILLed between its database commit and its end call, a consumer SIGKILLed between
its database commit and its ack. The transaction log lets the check-back publish the first order; the inbox keeps the
redelivered one from being billed twice: the billing database ends with each committed order exactly once."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys

from .helpers import pending, wait_until
from .pg_service import ORDERS, SETTINGS, invoices, orders

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def service(role: str, redis_url: str, database_url: str, kill_at: int = -1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.pg_service", role, redis_url, database_url, str(kill_at)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def billed_rows(engine: Any) -> int:
    with engine.connect() as db:
        return len(db.execute(select(invoices.c.n)).all())


@pytest.fixture(params=["postgresql", "mariadb"])
def service_engine(request: pytest.FixtureRequest) -> Any:
    """A sync engine on a fresh schema (PostgreSQL) or database (MariaDB) of the session's own server."""
    return request.getfixturevalue("postgres_engine" if request.param == "postgresql" else "mariadb_engine")


def test_kills_between_database_commit_and_end_call_and_between_commit_and_ack(
    real_client: Any, redis_url: str, service_engine: Any
) -> None:
    database_url = service_engine.url.render_as_string(hide_password=False)
    assert service("setup", redis_url, database_url).wait(60) == 0
    running: list[subprocess.Popen[str]] = []
    try:
        dies = service("producer", redis_url, database_url, kill_at=4)
        assert dies.wait(60) == -9, dies.stdout.read() if dies.stdout else ""
        running.append(service("producer", redis_url, database_url))  # places the rest, answers the check-back
        assert running[0].stdout is not None and "placed" in running[0].stdout.readline()
        checker = Checker(real_client, SETTINGS)
        wait_until(
            lambda: (
                checker.run_round() is not None
                and real_client.xlen("orders") == ORDERS
                and real_client.hlen(TopicKeys("orders").inflight) == 0
            ),
            timeout=30,
        )

        dies = service("consumer", redis_url, database_url, kill_at=6)
        assert dies.wait(60) == -9, dies.stdout.read() if dies.stdout else ""
        running.append(service("consumer", redis_url, database_url))  # takes over the unacked ones
        wait_until(
            lambda: billed_rows(service_engine) >= ORDERS and pending(real_client, "orders", "billing") == 0,
            timeout=30,
        )
    finally:
        for process in running:
            process.kill()
            process.wait(10)
    with service_engine.connect() as db:
        placed = dict(db.execute(select(orders.c.id, orders.c.transaction_id)).all())
        billed = collections.Counter(db.execute(select(invoices.c.order_id)).scalars())
    published = collections.Counter(fields[b"transaction_id"].decode() for _, fields in real_client.xrange("orders"))
    assert sorted(placed) == list(range(ORDERS))
    assert published == {tx: 1 for tx in placed.values()}, "each committed order published once"
    assert billed == {order_id: 1 for order_id in range(ORDERS)}, "each order billed once, the redelivered one too"
