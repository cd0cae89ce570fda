"""The example Django service killed at the worst moments (``tests/django/service.py``), on SQLite, PostgreSQL and
MariaDB: the producer SIGKILLed between its database commit and its end call, the billing command SIGKILLed between
its database commit and its ack. The transaction log lets the check-back publish the first order; the inbox keeps the
redelivered one from being billed twice: each committed order is published once and billed once."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from orders.billing import BILLING_GROUP
from orders.models import Invoice, Order
from orders.txmq import TOPIC

from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys

from ..helpers import pending, wait_until
from .service import ORDERS, SETTINGS, SETTINGS_ENV

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DATABASE_KEYS = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")


def environment(alias: str, redis_url: str, kill_at: int = -1) -> dict[str, str]:
    """A service process's environment: the test settings, this test's database as its ``default``, the Redis."""
    database = {key: connections[alias].settings_dict[key] for key in DATABASE_KEYS}
    path = os.pathsep.join([str(ROOT / "examples" / "django_project"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        **SETTINGS_ENV,
        "DJANGO_SETTINGS_MODULE": "tests.django.settings",
        "TXMQ_DJANGO_DATABASE": json.dumps(database, default=str),
        "TXMQ_REDIS_URL": redis_url,
        "TXMQ_KILL_AT": str(kill_at),
        "PYTHONPATH": path,
    }


def producer(alias: str, redis_url: str, kill_at: int = -1, request: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.django.service", "producer", str(kill_at), *([request] if request else [])],
        cwd=ROOT,
        env=environment(alias, redis_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def billing(alias: str, redis_url: str, kill_at: int = -1) -> subprocess.Popen[str]:
    """The example's ``manage.py bill_orders``, its handler the example's invoice with a kill point."""
    command = ["bill_orders", "--handler", "tests.django.service.bill", "--block", "0.1", "--min-idle-time", "1"]
    return subprocess.Popen(
        [sys.executable, "-m", "django", *command],
        cwd=ROOT,
        env=environment(alias, redis_url, kill_at),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def output(process: subprocess.Popen[str]) -> str:
    return process.stdout.read() if process.stdout else ""


def check_until_all_published(client: Any) -> None:
    """Check rounds until every order is on the topic and nothing is in flight."""
    checker = Checker(client, SETTINGS)
    wait_until(
        lambda: (
            checker.run_round() is not None
            and client.xlen(TOPIC) == ORDERS
            and client.hlen(TopicKeys(TOPIC).inflight) == 0
        ),
        timeout=30,
    )


def test_kills_between_database_commit_and_end_call_and_between_commit_and_ack(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    alias = django_database
    running: list[subprocess.Popen[str]] = []
    try:
        dies = producer(alias, redis_url, kill_at=4)
        assert dies.wait(60) == -9, output(dies)
        assert Order.objects.using(alias).count() == 4, "order 4 committed in the database before the kill"
        running.append(producer(alias, redis_url))  # places the rest, answers the check-back
        assert running[0].stdout is not None and "placed" in running[0].stdout.readline()
        check_until_all_published(real_client)

        dies = billing(alias, redis_url, kill_at=6)
        assert dies.wait(60) == -9, output(dies)
        running.append(billing(alias, redis_url))  # takes over the unacked one
        wait_until(
            lambda: Invoice.objects.using(alias).count() >= ORDERS and pending(real_client, TOPIC, BILLING_GROUP) == 0,
            timeout=30,
        )
    finally:
        for process in running:
            process.kill()
            process.wait(10)
    placed = dict(Order.objects.using(alias).values_list("order_id", "transaction_id"))
    billed = collections.Counter(Invoice.objects.using(alias).values_list("order_id", flat=True))
    published = collections.Counter(fields[b"transaction_id"].decode() for _, fields in real_client.xrange(TOPIC))
    assert sorted(placed) == list(range(1, ORDERS + 1))
    assert published == {tx: 1 for tx in placed.values()}, "each committed order published once"
    assert billed == {order_id: 1 for order_id in range(1, ORDERS + 1)}, "each order billed once, the redelivered too"


def test_kills_around_the_commit_of_the_request_that_holds_the_log_row(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    """Each order placed inside a request's transaction (``ATOMIC_REQUESTS``): the handle's COMMIT waits for the
    outer commit. Killed after the outer commit, before that COMMIT: the check-back publishes the order. Killed
    after the handle's block, before the outer commit: the order rolls back with the process, the check-back fences
    and rolls back its message, and the order placed again by the next process is published once."""
    alias = django_database
    running: list[subprocess.Popen[str]] = []
    try:
        dies = producer(alias, redis_url, kill_at=3, request="request-after")
        assert dies.wait(60) == -9, output(dies)
        assert Order.objects.using(alias).count() == 3, "order 3 committed in the database before the kill"
        dies = producer(alias, redis_url, kill_at=6, request="request-before")
        assert dies.wait(60) == -9, output(dies)
        assert Order.objects.using(alias).count() == 5, "order 6 rolled back with its process"
        running.append(producer(alias, redis_url, request="request-before"))  # places the rest, answers
        assert running[0].stdout is not None and "placed" in running[0].stdout.readline()
        check_until_all_published(real_client)
    finally:
        for process in running:
            process.kill()
            process.wait(10)
    placed = dict(Order.objects.using(alias).values_list("order_id", "transaction_id"))
    published = collections.Counter(fields[b"transaction_id"].decode() for _, fields in real_client.xrange(TOPIC))
    assert sorted(placed) == list(range(1, ORDERS + 1))
    assert published == {tx: 1 for tx in placed.values()}, "each committed order published once, nothing else"
