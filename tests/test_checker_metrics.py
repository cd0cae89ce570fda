"""The checker's metrics carry the names and labels the README lists, in its registry and on its HTTP endpoint:
dashboards and alerts are built on them."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from checker import Checker
from redis_txmq import Message, Settings, TransactionProducer
from redis_txmq.embedded import free_port

from .helpers import wait_until
from .test_checkback_resilience import GROUP, KEYS, TOPIC, UNKNOWN, ByBody
from .test_checker import running


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of a Prometheus text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_carry_the_names_and_labels_the_readme_lists(real_client):
    """Dashboards and alerts are built on the metric names: a check-back commit, a rollback and a dead letter each
    show under the README's name and label, in the registry and on the ``--metrics-port`` endpoint."""
    settings = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, check_max=1)
    checker = Checker(real_client, settings, scan_interval=0.05)
    with TransactionProducer(GROUP, ByBody(), client=real_client, settings=settings) as producer:
        for body in (b"paid", b"void", b"lost"):
            producer.send_message_in_transaction(Message(TOPIC, body), UNKNOWN)
        with running(checker):
            wait_until(lambda: real_client.hlen(KEYS.inflight) == 0 and real_client.xlen(KEYS.dead_stream), 30)
            wait_until(lambda: checker.metrics.in_flight.labels(TOPIC)._value.get() == 0, 30)
    text = generate_latest(checker.metrics.registry).decode()
    exposed = samples(text)
    topic, group = (("topic", TOPIC),), (("group", GROUP),)
    assert exposed[("txmq_in_flight", topic)] == 0
    assert exposed[("txmq_checks_sent_total", group)] >= 3
    assert exposed[("txmq_check_replies_total", (("state", "COMMIT"),))] == 1
    assert exposed[("txmq_check_replies_total", (("state", "ROLLBACK"),))] == 1
    assert exposed[("txmq_check_commits_total", topic)] == 1
    assert exposed[("txmq_check_rollbacks_total", topic)] == 1
    assert exposed[("txmq_dead_letters_total", topic)] == 1
    assert exposed[("txmq_check_latency_seconds_count", ())] >= 2
    assert exposed[("txmq_check_latency_seconds_sum", ())] > 0, "a check takes time: request to applied answer"
    families = {family.name for family in text_string_to_metric_families(text)}
    assert {"txmq_checker_errors", "txmq_checker_topic_errors"} <= families

    port = free_port()
    checker.metrics.serve(port, addr="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        served = samples(response.read().decode())
    assert served[("txmq_check_commits_total", topic)] == 1
