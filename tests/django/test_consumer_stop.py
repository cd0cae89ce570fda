"""``manage.py bill_orders`` (the example's ``txmq_consume``) stopped as an orchestrator stops a pod: SIGTERM, then
SIGKILL once the grace period has passed. With handlers of 1 s and a batch of 10, the process must exit by itself,
cleanly, once the message in hand is handled, long before the grace period ends; the rest of its batch is handed
back, and another consumer takes it at once, as first deliveries (its ``min_idle_time`` is an hour: only the
hand-back can explain it)."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from orders.billing import BILLING_GROUP
from orders.models import Invoice
from orders.txmq import TOPIC

from redis_txmq import Consumer, LocalTransactionState, Message, TransactionProducer
from redis_txmq.core.keys import TopicKeys

from ..helpers import ScriptedListener, wait_until
from .test_kills import ROOT, environment, output

pytestmark = pytest.mark.slow

ORDERS = 12
BATCH = 10
GRACE = 30.0
"""Kubernetes' default ``terminationGracePeriodSeconds``."""


def started(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize("django_database", ["sqlite"], indirect=True)
def test_sigterm_stops_after_the_message_in_hand_and_another_consumer_takes_the_rest_at_once(
    django_database: str, real_client: Any, redis_url: str, tmp_path: Path
) -> None:
    with TransactionProducer("orders-service", ScriptedListener(), client=real_client) as producer:
        for order_id in range(1, ORDERS + 1):
            order = {"id": order_id, "customer": f"c{order_id}", "amount": 10.0 * order_id}
            producer.send_message_in_transaction(
                Message(TOPIC, json.dumps(order).encode()), LocalTransactionState.COMMIT
            )
    log = tmp_path / "started"
    command = ["bill_orders", "--handler", "tests.django.slow_billing.bill", "--block", "0.1"]
    command += ["--batch-size", str(BATCH), "--min-idle-time", "3600"]
    process = subprocess.Popen(
        [sys.executable, "-m", "django", *command],
        cwd=ROOT,
        env={**environment(django_database, redis_url), "TXMQ_STARTED_FILE": str(log)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: started(log), timeout=60)
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            pytest.fail(
                f"still running {GRACE} s after SIGTERM: SIGKILLed, as the orchestrator would\n{output(process)}"
            )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    text = output(process)
    assert status == 0, text
    handled = started(log)
    assert len(handled) <= 2, f"only the message in hand after SIGTERM, not the whole batch: {handled}"
    billed = sorted(Invoice.objects.using(django_database).values_list("order_id", flat=True))
    assert billed == sorted(handled), "the message in hand was finished, not cut short"
    assert f"{len(handled)} message(s) handled" in text

    taken: list[Any] = []
    with Consumer(TOPIC, BILLING_GROUP, client=real_client, block=0.05, min_idle_time=3600, max_deliveries=1) as second:
        wait_until(lambda: taken.extend(second.poll(0.05)) or len(taken) >= ORDERS - len(handled), timeout=10)
        for message in taken:
            second.ack(message)
    ids = collections.Counter(json.loads(message.body)["id"] for message in taken)
    assert sorted(ids) == sorted(set(range(1, ORDERS + 1)) - set(handled)) and max(ids.values()) == 1
    assert {message.delivery_count for message in taken} == {1}, "handed back undelivered"
    assert real_client.xlen(TopicKeys(TOPIC).consumer_dead_stream(BILLING_GROUP)) == 0
