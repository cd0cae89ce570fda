"""Each alert of deploy/prometheus fires on what a real checker serves in the state the alert is about, and none
fires on what it serves while all is well.

A checker runs (in this process, on a real redis-server) in one state — no producer answering check requests, a
consumer group hung or falling behind, a step of the check-back failing, Redis down, its loop stopped,
transactions dead-lettered, or healthy — and its ``/metrics`` is scraped over HTTP twice, both times in that
state. The samples become promtool's ``input_series`` (with the ``instance`` and ``job`` labels a scrape adds), the
state held for six hours, each series going on as it went between the two scrapes:

- a clock (``*_timestamp_seconds``, rebased so that promtool's time 0 is the first scrape) that moved keeps its
  distance behind the time (the loop goes round); one that did not move stays (the loop stopped);
- an age (``*_age_seconds``, ``*_idle_seconds``) that grew grows a second per second (the same item still waits);
- a state (``txmq_checker_ready``, ``txmq_redis_master_up``, the in-flight age bound) stays what it was;
- every other series (counters, backlogs, failures in a row) that grew goes on at the pace it grew;
- a series that did not grow, or fell, stays where it was at the second scrape.

``promtool test rules`` then asserts which alerts fire at the end, with their labels and rendered annotations, and
that the others stay quiet. A series the checker does not serve in that state (a counter never created) is simply
not there, as for Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.checker import Checker, CheckerMetrics
from redis_txmq.core.keys import TOPIC_REGISTRY, GroupKeys, TopicKeys
from redis_txmq.transport.embedded import free_port

from .helpers import wait_until
from .test_alert_rules import RULES, promtool_path
from .test_checker_probes import OwnRedis

COMMIT, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.UNKNOWN
TOPIC = "orders"
GROUP = "order_group"
SETTINGS = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, claim_idle=1.0, check_max=3)
TARGET = {"instance": "checker-1:9108", "job": "txmq"}
"""The labels Prometheus adds to what it scrapes."""
HOURS = 6
MINUTES = HOURS * 60
STATES = {"txmq_checker_ready", "txmq_redis_master_up", "txmq_in_flight_age_bound_seconds"}
RULE_DOCUMENT = yaml.safe_load(RULES.read_text())
ALERTS = {rule["alert"]: rule for group in RULE_DOCUMENT["groups"] for rule in group["rules"] if "alert" in rule}

FIRING = {
    "healthy": set(),
    "unanswered": {"TxMQCheckRequestsUnanswered", "TxMQInFlightPastBound"},
    "consumers": {"TxMQConsumerStuck", "TxMQConsumerFallingBehind", "TxMQConsumerDeadLettersGrowing"},
    "check-back failing": {
        "TxMQCheckBackFailing",
        "TxMQTopicScanFailing",
        "TxMQCheckerNotReady",
        "TxMQInFlightPastBound",
    },
    "redis down": {"TxMQRedisMasterUnreachable", "TxMQCheckerNotReady", "TxMQCheckBackFailing"},
    "loop stopped": {"TxMQNoLiveChecker", "TxMQCheckerStalled", "TxMQCheckerNotReady"},
    "dead letters": {"TxMQDeadLettersGrowing"},
}
"""The alerts each state fires; every other alert must stay quiet in it."""

Key = tuple[str, tuple[tuple[str, str], ...]]


class Answers(TransactionListener):
    """Executes with ``arg``; answers every check with ``state``."""

    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, message: Message, arg: LocalTransactionState) -> LocalTransactionState:
        return arg

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return self.state


# ---------------------------------------------------------------------------------------------- scrapes


@dataclass(frozen=True)
class Scrape:
    at: float
    """Unix time just before the request (the checker's clocks are Unix times too)."""
    samples: dict[Key, float]

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for sample, labels in self.samples if sample == name]


def scrape(port: int) -> Scrape:
    """``/metrics`` over HTTP, as Prometheus reads it: the samples of counters and gauges (not a counter's
    ``_created``, nor the latency histogram, which no alert reads)."""
    at = time.time()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "histogram":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Scrape(at, samples)


def grew(first: Scrape, second: Scrape, name: str, **labels: str) -> bool:
    before, after = first.value(name, **labels), second.value(name, **labels)
    return after is not None and after > (before or 0.0)


def next_scrape(port: int, condition: Callable[[Scrape], bool], timeout: float = 30) -> Scrape:
    """The first scrape from now on that ``condition`` accepts."""

    def accepted() -> Scrape | None:
        taken = scrape(port)
        return taken if condition(taken) else None

    return wait_until(accepted, timeout=timeout, interval=0.05)


def loop_went_round(first: Scrape, second: Scrape) -> bool:
    return grew(first, second, "txmq_checker_last_round_timestamp_seconds")


# ------------------------------------------------------------------------------- scrapes to promtool


def series_values(name: str, key: Key, first: Scrape, second: Scrape) -> str:
    """promtool's expanding notation ``a+bxN`` (one value a minute from the first scrape on) of one series."""
    gap = max(second.at - first.at, 1e-3)
    after = second.samples[key]
    before = first.samples.get(key, 0.0 if name.endswith("_total") else after)
    start, per_minute = after, 0.0
    if name.endswith("_timestamp_seconds"):
        start = after - (second.at if after > before else first.at)
        per_minute = 60.0 if after > before else 0.0
    elif name.endswith(("_age_seconds", "_idle_seconds")):
        if after > before:
            start, per_minute = max(0.0, after - gap), 60.0
    elif name not in STATES and after > before:
        start, per_minute = before, (after - before) / gap * 60
    return f"{start:.6f}+{per_minute:.6f}x{MINUTES}"


def input_series(first: Scrape, second: Scrape) -> list[dict[str, str]]:
    found = []
    for key in sorted(second.samples):
        name, labels = key
        every = {**dict(labels), **TARGET}
        text = ",".join(f'{k}="{v}"' for k, v in sorted(every.items()))
        found.append({"series": f"{name}{{{text}}}", "values": series_values(name, key, first, second)})
    return found


def rendered(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations with its labels filled in (the templates use ``{{ $labels.<name> }}`` only)."""

    def fill(text: str) -> str:
        text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m[1]], text)
        assert "{{" not in text, f"{alert}: a template this test does not render: {text}"
        return text

    return {name: fill(str(text)) for name, text in ALERTS[alert].get("annotations", {}).items()}


def assert_alerts(
    promtool: str, tmp_path: Path, state: str, first: Scrape, second: Scrape, fire: dict[str, list[dict[str, str]]]
) -> None:
    """promtool's verdict on the two scrapes held for :data:`HOURS`: ``fire`` (alert -> each firing alert's own
    labels) fires, every other alert is quiet."""
    assert set(fire) == FIRING[state]
    tests = []
    for alert in sorted(ALERTS):
        severity = ALERTS[alert]["labels"]["severity"]
        expected = [
            {"exp_labels": {"severity": severity, **labels}, "exp_annotations": rendered(alert, labels)}
            for labels in fire.get(alert, [])
        ]
        tests.append({"eval_time": f"{MINUTES}m", "alertname": alert, "exp_alerts": expected})
    document = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series(first, second), "alert_rule_test": tests}],
    }
    path = tmp_path / f"{state.replace(' ', '-')}.test.json"  # JSON is YAML
    path.write_text(json.dumps(document, indent=1))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    series = "\n".join(f"{s['series']} {s['values']}" for s in document["tests"][0]["input_series"])
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\ninput series:\n{series}"


# ------------------------------------------------------------------------------------- a live checker


@pytest.fixture(scope="module")
def promtool() -> str:
    return promtool_path()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Live:
    checker: Checker
    port: int
    stop: threading.Event
    thread: threading.Thread

    def stop_loop(self) -> None:
        """The loop stops; its metrics stay served (a process whose loop is stuck)."""
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the checker did not stop"


@contextmanager
def live_checker(client: Any, settings: Settings = SETTINGS, **metrics_options: Any) -> Iterator[Live]:
    """A checker's loop in a thread, its metrics observed every 0.1 s and served on a free port."""
    metrics = CheckerMetrics(observe_interval=0.1, **metrics_options)
    checker = Checker(client, settings, scan_interval=0.05, metrics=metrics)
    port = free_port()
    server = metrics.serve(port, addr="127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=checker.run, args=(stop,), name="alerted-checker", daemon=True)
    thread.start()
    live = Live(checker, port, stop, thread)
    try:
        yield live
    finally:
        live.stop_loop()
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------- states


@pytest.mark.real
def test_a_healthy_checker_fires_no_alert(promtool: str, real_client: redis.Redis, tmp_path: Path) -> None:
    """Transactions committed at once and by check-back, a consumer group that reads and acks everything."""
    real_client.xgroup_create(TOPIC, "billing", id="0", mkstream=True)

    def traffic(producer: TransactionProducer) -> None:
        producer.send_message_in_transaction(Message(TOPIC, b"paid"), COMMIT)
        producer.send_message_in_transaction(Message(TOPIC, b"checked"), UNKNOWN)  # the check-back commits it
        wait_until(lambda: real_client.hlen(TopicKeys(TOPIC).inflight) == 0)
        wait_until(lambda: real_client.xlen(TOPIC) >= 2)
        for _, entries in real_client.xreadgroup("billing", "reader", {TOPIC: ">"}) or []:
            real_client.xack(TOPIC, "billing", *[entry_id for entry_id, _ in entries])

    def settled(s: Scrape) -> bool:
        return (
            s.value("txmq_in_flight", topic=TOPIC) == 0
            and s.value("txmq_oldest_in_flight_age_seconds", topic=TOPIC) == 0
            and s.value("txmq_consumer_pending", topic=TOPIC, group="billing") == 0
            and s.value("txmq_consumer_lag", topic=TOPIC, group="billing") == 0
        )

    with (
        TransactionProducer(GROUP, Answers(COMMIT), client=real_client, settings=SETTINGS) as producer,
        live_checker(real_client) as live,
    ):
        traffic(producer)
        first = next_scrape(live.port, settled)
        traffic(producer)
        second = next_scrape(
            live.port,
            lambda s: (
                settled(s)
                and grew(first, s, "txmq_check_replies_total", state="COMMIT")
                and grew(first, s, "txmq_check_commits_total", topic=TOPIC)
                and loop_went_round(first, s)
            ),
        )
    assert_alerts(promtool, tmp_path, "healthy", first, second, {})


@pytest.mark.real
def test_check_requests_nobody_answers(promtool: str, real_client: redis.Redis, tmp_path: Path) -> None:
    """The producer group's only instance is gone: the checker sends check requests and never gets an answer (the
    case a checker used to export no answer counter for), and the transactions stay in flight past their bound."""
    with TransactionProducer(GROUP, Answers(COMMIT), client=real_client, settings=SETTINGS) as producer:
        producer.send_message_in_transaction(Message(TOPIC, b"undecided"), UNKNOWN)
    with live_checker(real_client) as live:
        first = next_scrape(live.port, lambda s: bool(s.value("txmq_checks_sent_total", group=GROUP)))
        second = next_scrape(
            live.port,
            lambda s: (
                grew(first, s, "txmq_checks_sent_total", group=GROUP)
                and grew(first, s, "txmq_oldest_in_flight_age_seconds", topic=TOPIC)
                and loop_went_round(first, s)
            ),
        )
    fire = {"TxMQCheckRequestsUnanswered": [{}], "TxMQInFlightPastBound": [{"topic": TOPIC}]}
    assert_alerts(promtool, tmp_path, "unanswered", first, second, fire)
    assert second.value("txmq_check_replies_total", state="COMMIT") == 0


@pytest.mark.real
def test_consumer_groups_hung_behind_and_giving_up(promtool: str, real_client: redis.Redis, tmp_path: Path) -> None:
    """billing read a batch and never acks it (its handler hangs), audit reads nothing while messages keep coming,
    mail dead-letters a message; the checker itself is healthy."""
    with (
        TransactionProducer(GROUP, Answers(COMMIT), client=real_client, settings=SETTINGS) as producer,
        Consumer(TOPIC, "mail", client=real_client, settings=SETTINGS, block=0.05) as mail,
    ):

        def commit(count: int) -> None:
            for i in range(count):
                producer.send_message_in_transaction(Message(TOPIC, b"m%d" % i), COMMIT)

        commit(5)
        real_client.xgroup_create(TOPIC, "billing", id="0")
        real_client.xgroup_create(TOPIC, "audit", id="0")
        real_client.xreadgroup("billing", "hung", {TOPIC: ">"})
        for message in mail.poll():
            mail.ack(message)
        with live_checker(real_client) as live:
            first = next_scrape(
                live.port,
                lambda s: (
                    s.value("txmq_consumer_pending", topic=TOPIC, group="billing") == 5
                    and s.value("txmq_consumer_lag", topic=TOPIC, group="audit") == 5
                    and s.value("txmq_consumer_dead_letters", topic=TOPIC, group="mail") == 0
                    and s.value("txmq_consumer_lag", topic=TOPIC, group="mail") == 0
                ),
            )
            commit(5)
            delivered = mail.poll()
            assert delivered and mail.dead_letter(delivered[0], "refused by the test")
            for message in delivered[1:]:
                mail.ack(message)
            second = next_scrape(
                live.port,
                lambda s: (
                    grew(first, s, "txmq_consumer_oldest_pending_idle_seconds", topic=TOPIC, group="billing")
                    and grew(first, s, "txmq_consumer_lag", topic=TOPIC, group="billing")
                    and grew(first, s, "txmq_consumer_lag", topic=TOPIC, group="audit")
                    and grew(first, s, "txmq_consumer_dead_letters", topic=TOPIC, group="mail")
                    and s.value("txmq_consumer_lag", topic=TOPIC, group="mail") == 0
                    and loop_went_round(first, s)
                ),
            )
    fire = {
        "TxMQConsumerStuck": [{"topic": TOPIC, "group": "billing"}],
        "TxMQConsumerFallingBehind": [{"topic": TOPIC, "group": "audit"}, {"topic": TOPIC, "group": "billing"}],
        "TxMQConsumerDeadLettersGrowing": [{"topic": TOPIC, "group": "mail"}],
    }
    assert_alerts(promtool, tmp_path, "consumers", first, second, fire)


@pytest.mark.real
def test_a_failing_check_back_step_and_a_topic_failing_every_scan(
    promtool: str, real_client: redis.Redis, tmp_path: Path
) -> None:
    """The producer group's check-request stream holds another type (every request is refused), and another
    topic's keys are damaged (every look at it fails)."""
    with TransactionProducer(GROUP, Answers(COMMIT), client=real_client, settings=SETTINGS) as producer:
        producer.send_message_in_transaction(Message(TOPIC, b"undecided"), UNKNOWN)
    requests = GroupKeys(GROUP).check_requests
    real_client.delete(requests)
    real_client.set(requests, "not a stream")
    damaged = TopicKeys("damaged")
    real_client.sadd(TOPIC_REGISTRY, damaged.topic_stream)
    real_client.set(damaged.unchecked, "not a zset")
    with live_checker(real_client) as live:
        first = next_scrape(
            live.port,
            lambda s: (
                bool(s.value("txmq_checker_errors_total", step="check requests"))
                and (s.value("txmq_checker_topic_consecutive_failures", topic="damaged") or 0) >= 5
                and s.value("txmq_checker_ready") == 0
            ),
        )
        second = next_scrape(
            live.port,
            lambda s: (
                grew(first, s, "txmq_checker_errors_total", step="check requests")
                and grew(first, s, "txmq_checker_topic_consecutive_failures", topic="damaged")
                and grew(first, s, "txmq_oldest_in_flight_age_seconds", topic=TOPIC)
                and loop_went_round(first, s)
            ),
        )
    fire = {
        "TxMQCheckBackFailing": [{"step": "check requests"}],
        "TxMQTopicScanFailing": [{"topic": "damaged"}],
        "TxMQCheckerNotReady": [TARGET],
        "TxMQInFlightPastBound": [{"topic": TOPIC}],
    }
    assert_alerts(promtool, tmp_path, "check-back failing", first, second, fire)


def test_redis_down(promtool: str, own_redis: OwnRedis, tmp_path: Path) -> None:
    """The checker's only Redis is gone (connections refused): the loop goes round its backoff, its heartbeat and
    its reads of answers fail, and the PING of the master fails."""
    client = redis.Redis.from_url(own_redis.url, socket_timeout=2)
    with live_checker(client) as live:
        next_scrape(
            live.port, lambda s: s.value("txmq_checker_ready") == 1 and bool(s.labels_of("txmq_redis_master_up"))
        )
        own_redis.stop()
        first = next_scrape(
            live.port,
            lambda s: (
                s.value("txmq_checker_ready") == 0
                and {v for k, v in s.samples.items() if k[0] == "txmq_redis_master_up"} == {0.0}
                and bool(s.value("txmq_checker_errors_total", step="replies"))
                and bool(s.value("txmq_checker_errors_total", step="heartbeat"))
            ),
        )
        second = next_scrape(
            live.port,
            lambda s: (
                grew(first, s, "txmq_checker_errors_total", step="replies")
                and grew(first, s, "txmq_checker_errors_total", step="heartbeat")
                and loop_went_round(first, s)
            ),
        )
    client.close()
    (master,) = second.labels_of("txmq_redis_master_up")
    fire = {
        "TxMQRedisMasterUnreachable": [master],
        "TxMQCheckerNotReady": [TARGET],
        "TxMQCheckBackFailing": [{"step": "heartbeat"}, {"step": "replies"}],
    }
    assert_alerts(promtool, tmp_path, "redis down", first, second, fire)


@pytest.mark.real
def test_a_checker_whose_loop_stopped(promtool: str, real_client: redis.Redis, tmp_path: Path) -> None:
    """The loop stopped going round (stuck in a call that never returns), the process still serves its metrics."""
    with live_checker(real_client, stall_after=0.5) as live:
        next_scrape(live.port, lambda s: s.value("txmq_checker_ready") == 1)
        live.stop_loop()
        first = next_scrape(live.port, lambda s: s.value("txmq_checker_ready") == 0)
        second = next_scrape(live.port, lambda s: s.at > first.at + 0.2)
    fire = {"TxMQNoLiveChecker": [{}], "TxMQCheckerStalled": [TARGET], "TxMQCheckerNotReady": [TARGET]}
    assert_alerts(promtool, tmp_path, "loop stopped", first, second, fire)


@pytest.mark.real
def test_transactions_dead_lettered(promtool: str, real_client: redis.Redis, tmp_path: Path) -> None:
    """A producer answers UNKNOWN to every check: past ``check_max`` checks it read, the checker gives the
    transaction up to the dead-letter stream."""
    settings = replace(SETTINGS, check_max=2)
    with TransactionProducer(GROUP, Answers(UNKNOWN), client=real_client, settings=settings) as producer:
        producer.send_message_in_transaction(Message(TOPIC, b"undecided"), UNKNOWN)
    with live_checker(real_client, settings) as live:
        # no producer reads the requests yet: they do not count, nothing is given up
        first = next_scrape(
            live.port,
            lambda s: (
                s.value("txmq_dead_letters_total", topic=TOPIC) == 0
                and s.value("txmq_dead_letters_waiting", topic=TOPIC) == 0
                and bool(s.value("txmq_checks_sent_total", group=GROUP))
            ),
        )
        with TransactionProducer(GROUP, Answers(UNKNOWN), client=real_client, settings=settings):
            second = next_scrape(
                live.port,
                lambda s: (
                    grew(first, s, "txmq_dead_letters_total", topic=TOPIC)
                    and grew(first, s, "txmq_dead_letters_waiting", topic=TOPIC)
                    and s.value("txmq_oldest_in_flight_age_seconds", topic=TOPIC) == 0
                    and loop_went_round(first, s)
                ),
            )
    assert_alerts(promtool, tmp_path, "dead letters", first, second, {"TxMQDeadLettersGrowing": [{"topic": TOPIC}]})


def test_every_alert_fires_in_some_state_and_is_quiet_in_the_healthy_one() -> None:
    assert set().union(*FIRING.values()) == set(ALERTS)
    assert FIRING["healthy"] == set()
