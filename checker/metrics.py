"""Prometheus metrics of one checker instance (text format through prometheus-client)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class CheckerMetrics:
    """One registry per checker, so that several checkers (or tests) in one process do not collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
            "Steps of the checker's loop that failed (start, heartbeat, scan, replies, check requests, write jobs); "
            "each is retried",
            ["step"],
            registry=self.registry,
        )
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

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``port`` from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)
