"""Prometheus metrics of one checker instance (text format through prometheus-client), and the HTTP server that
serves them at ``/metrics`` with the probes ``/healthz`` and ``/readyz`` (``redis_txmq.checker.health``)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from redis_txmq.core.config import Settings
from redis_txmq.core.keys import TopicKeys
from redis_txmq.core.message import LocalTransactionState

from .health import LOOP_STALL_AFTER, TOPIC_FAILURES, CheckerHealth
from .observe import OBSERVE_INTERVAL, Observer

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class CheckerMetrics:
    """One registry per checker, so that several checkers (or tests) in one process do not collide. It also holds
    the checker's ``CheckerHealth``, which the loop feeds through the methods below."""

    def __init__(
        self,
        *,
        stall_after: float = LOOP_STALL_AFTER,
        topic_failures: int = TOPIC_FAILURES,
        observe_interval: float = OBSERVE_INTERVAL,
    ) -> None:
        self.registry = CollectorRegistry()
        self.health = CheckerHealth(stall_after=stall_after, topic_failures=topic_failures)
        self.observer = Observer(self, observe_interval)
        self.in_flight = Gauge(
            "txmq_in_flight",
            "Transactions waiting for their outcome (all partitions)",
            ["topic"],
            registry=self.registry,
        )
        self.checks_sent = Counter(
            "txmq_checks_sent", "Check requests sent to producer groups", ["group"], registry=self.registry
        )
        self.replies = Counter("txmq_check_replies", "Check answers received", ["state"], registry=self.registry)
        for state in LocalTransactionState:
            self.replies.labels(state.value)  # at 0 from the start: a checker nobody answers shows it (the alert)
        self.commits = Counter(
            "txmq_check_commits", "Transactions committed by a check answer", ["topic"], registry=self.registry
        )
        self.rollbacks = Counter(
            "txmq_check_rollbacks", "Transactions rolled back by a check answer", ["topic"], registry=self.registry
        )
        self.dead_letters = Counter(
            "txmq_dead_letters", "Transactions moved to the dead-letter stream", ["topic"], registry=self.registry
        )
        self.errors = Counter(
            "txmq_checker_errors",
            "Steps of the checker's loop that failed (start, heartbeat, scan, replies, check requests, write jobs, "
            "observe); each is retried",
            ["step"],
            registry=self.registry,
        )
        for step in ("start", "heartbeat", "scan", "replies", "check requests", "write jobs", "observe"):
            self.errors.labels(step)  # at 0 from the start, so that increase() and rate() see the first failure
        self.topic_errors = Counter(
            "txmq_checker_topic_errors",
            "Scans of a topic that failed and were skipped (damaged keys, its cluster master down)",
            ["topic"],
            registry=self.registry,
        )
        self.check_latency = Histogram(
            "txmq_check_latency_seconds",
            "From check request to applied answer",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.last_round = Gauge(
            "txmq_checker_last_round_timestamp_seconds",
            "Unix time at which the checker's loop last finished a round (or an attempt to start); it stops moving "
            "when the loop is stuck",
            registry=self.registry,
        )
        self.ready = Gauge("txmq_checker_ready", "1 while /readyz answers 200, else 0", registry=self.registry)
        self.ready.set_function(lambda: float(self.health.ready()[0]))
        self.topic_failures = Gauge(
            "txmq_checker_topic_consecutive_failures",
            "Scans in a row that failed for the topic (its worst partition); 0 once one passes",
            ["topic"],
            registry=self.registry,
        )
        self.in_flight_bound = Gauge(
            "txmq_in_flight_age_bound_seconds",
            "Age past which a transaction still in flight means its check-back is not working: transaction_timeout "
            "+ (check_max + 1) x check_interval, at most max_age (the checker's settings)",
            registry=self.registry,
        )
        self.oldest_in_flight = Gauge(
            "txmq_oldest_in_flight_age_seconds",
            "Age of the oldest half message of the topic (all partitions; 0 when none is in flight)",
            ["topic"],
            registry=self.registry,
        )
        self.dead_letters_waiting = Gauge(
            "txmq_dead_letters_waiting",
            "Transactions in the topic's dead-letter streams (all partitions), waiting for an operator",
            ["topic"],
            registry=self.registry,
        )
        self.consumer_lag = Gauge(
            "txmq_consumer_lag",
            "Entries of the topic (all partitions) not yet delivered to the consumer group; absent while Redis "
            "cannot tell",
            ["topic", "group"],
            registry=self.registry,
        )
        self.consumer_pending = Gauge(
            "txmq_consumer_pending",
            "Entries delivered to the consumer group and not acknowledged (all partitions)",
            ["topic", "group"],
            registry=self.registry,
        )
        self.consumer_oldest_pending = Gauge(
            "txmq_consumer_oldest_pending_idle_seconds",
            "The longest any entry pending in the consumer group has been held since its last delivery (all "
            "partitions; 0 when nothing is pending)",
            ["topic", "group"],
            registry=self.registry,
        )
        self.consumer_dead_letters = Gauge(
            "txmq_consumer_dead_letters",
            "Entries the consumer group gave up on (its dead-letter streams, all partitions)",
            ["topic", "group"],
            registry=self.registry,
        )
        self.master_up = Gauge(
            "txmq_redis_master_up",
            "1 if the Redis master (each master of a cluster) answered the checker's last PING, else 0",
            ["address"],
            registry=self.registry,
        )

    # ------------------------------------------------------------------------ fed by the checker's loop

    def watch(self, settings: Settings) -> None:
        """The settings of the checker these metrics belong to: the heartbeat's freshness limit of ``/readyz`` (three
        intervals, what ``txmq status`` counts as live) and the in-flight age bound the alerts compare with. A
        transaction is checked from ``transaction_timeout`` on, every ``check_interval``; one that is still in
        flight a check after ``check_max`` checks was never answered by a producer (a check nobody read is not
        counted), and ``max_age`` gives every transaction up."""
        self.health.heartbeat_window = 3 * settings.heartbeat_interval
        budget = settings.transaction_timeout + (settings.check_max + 1) * settings.check_interval
        self.in_flight_bound.set(min(budget, settings.max_age))

    def started(self) -> None:
        self.health.started()

    def beat(self) -> None:
        self.health.beat()

    def step_failed(self, step: str, exc: BaseException) -> None:
        self.health.step_failed(step, exc)

    def round_done(self) -> None:
        self.health.round_done()
        self.last_round.set_to_current_time()

    def topics_scanned(self, topics: list[TopicKeys], failed: dict[str, BaseException]) -> None:
        """A scan went over ``topics``; ``failed`` maps the streams whose scan failed to the error."""
        counts = self.health.topics_scanned([keys.topic_stream for keys in topics], failed)
        worst: dict[str, int] = {}
        for keys in topics:
            worst[keys.topic] = max(worst.get(keys.topic, 0), counts[keys.topic_stream])
        for topic, count in worst.items():
            self.topic_failures.labels(topic).set(count)

    def observe(self, client: Any, topics: list[TopicKeys]) -> None:
        """The gauges of topics, consumer groups and masters, when due
        (``redis_txmq.checker.observe.Observer``)."""
        self.observer.observe(client, topics)

    def observe_masters(self, client: Any) -> None:
        """``txmq_redis_master_up`` alone, when due: what the loop still measures while its scan cannot run."""
        self.observer.observe_masters(client)

    # ------------------------------------------------------------------------------------ served

    def app(self) -> WSGIApp:
        """A WSGI app: ``/healthz`` and ``/readyz`` (200 or 503, a JSON body saying what was checked and what
        failed), every other path the metrics (as prometheus-client serves them)."""
        metrics = make_wsgi_app(self.registry)
        probes = {"/healthz": self.health.live, "/readyz": self.health.ready}

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            probe = probes.get(environ.get("PATH_INFO", ""))
            if probe is None:
                return metrics(environ, start_response)
            ok, verdict = probe()
            body = json.dumps(verdict, sort_keys=True).encode() + b"\n"
            headers = [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ]
            start_response("200 OK" if ok else "503 Service Unavailable", headers)
            return [body]

        return app

    def serve(self, port: int, addr: str = "0.0.0.0") -> WSGIServer:
        """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` from a daemon thread; returns the server
        (``shutdown()`` and ``server_close()`` stop it). Raises ``OSError`` when the port is taken."""
        server = make_server(addr, port, self.app(), _server_class(addr), handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name=f"txmq-metrics-{port}", daemon=True).start()
        return server


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        """Probes come every few seconds: no access log."""


def _server_class(addr: str) -> type[WSGIServer]:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = family

    return Server
