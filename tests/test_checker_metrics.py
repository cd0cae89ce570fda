"""The checker's metrics carry the names and labels the README lists, in its registry and on its HTTP endpoint:
dashboards and alerts are built on them."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_txmq import Message, Settings, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.ops.admin import registered_topics
from redis_txmq.transport.embedded import free_port

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


def test_a_checker_that_never_got_an_answer_exports_its_answer_counters_at_zero(real_client):
    """``rate()`` and ``increase()`` see nothing of a series that does not exist: a checker whose check requests
    nobody answers must still export ``txmq_check_replies_total`` (at 0, per state) beside its requests sent, and
    the requests' counter of a known producer group from 0 before its first request."""
    settings = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, check_max=100)
    with TransactionProducer(GROUP, ByBody(), client=real_client, settings=settings) as producer:
        producer.send_message_in_transaction(Message(TOPIC, b"lost"), UNKNOWN)
    checker = Checker(real_client, settings, scan_interval=0.05)
    exposed = samples(generate_latest(checker.metrics.registry).decode())
    for state in ("COMMIT", "ROLLBACK", "UNKNOWN"):
        assert exposed[("txmq_check_replies_total", (("state", state),))] == 0
    checker.metrics.observer.observe(real_client, registered_topics(real_client), force=True)  # what a round does
    assert (
        samples(generate_latest(checker.metrics.registry).decode())[("txmq_checks_sent_total", (("group", GROUP),))]
        == 0
    )
    with running(checker):
        wait_until(lambda: checker.metrics.checks_sent.labels(GROUP)._value.get() >= 2, 30)
    port = free_port()
    server = checker.metrics.serve(port, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            served = samples(response.read().decode())
    finally:
        server.shutdown()
        server.server_close()
    assert served[("txmq_checks_sent_total", (("group", GROUP),))] >= 2
    assert {served[("txmq_check_replies_total", (("state", s),))] for s in ("COMMIT", "ROLLBACK", "UNKNOWN")} == {0}
