"""Release 0.1.0 beside this checkout: its code extracted from git (the tag ``v0.1.0``, or the commit it names when
a clone carries no tags), and a fleet of processes of either release (producers of ``roles.py``, ``txmq checker``)
against the session's real Redis.

Without that commit (a shallow clone, a source archive) the upgrade tests are skipped, except in CI (``CI=true``),
where they fail and say how to fetch it.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from redis_txmq.core.keys import TopicKeys
from redis_txmq.ops import admin

from ..helpers import server_ms, wait_until

ROOT = Path(__file__).resolve().parents[2]
RELEASE_TAG = "v0.1.0"
RELEASE_COMMIT = "710c162d89f5201653539ba921b5a3a15d9b59cd"
"""The commit ``v0.1.0`` names: a clone of the branch alone has it in its history but not the tag."""
ROLES = Path(__file__).with_name("roles.py")
CRASH_STATUS = 17  # roles.CRASH_STATUS (roles.py runs on either release: it is not imported here)

FAST = {
    "TXMQ_TRANSACTION_TIMEOUT": "1",
    "TXMQ_CHECK_INTERVAL": "1",
    "TXMQ_HEARTBEAT_INTERVAL": "0.5",
    "TXMQ_CLAIM_IDLE": "1",
}
"""Short timeouts for every process of both releases: a transaction is first checked 1 s after its prepare."""


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def _release_commit() -> str | None:
    """The tag when the clone has it, else the commit it names when the history holds it; ``None`` without either."""
    for name in (RELEASE_TAG, RELEASE_COMMIT):
        try:
            if _git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}").returncode == 0:
                return name
        except FileNotFoundError:  # no git
            return None
    return None


@pytest.fixture(scope="session")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding release 0.1.0's ``redis_txmq``, ``checker`` and ``lua`` (its scripts.py finds ``lua/``
    beside the package, as in a checkout): put first on ``PYTHONPATH``, it is what a process imports."""
    release = _release_commit()
    if release is None:
        why = (
            f"release 0.1.0 (tag {RELEASE_TAG}, commit {RELEASE_COMMIT[:12]}), the old side of the upgrade tests, "
            f"is not in {ROOT}"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}: fetch the history (git fetch --unshallow --tags origin: a shallow checkout lacks it)")
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("release-0.1.0")
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", release, "redis_txmq", "checker", "lua"], stdout=subprocess.PIPE
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], stdin=archive.stdout, check=True)
    assert archive.wait() == 0
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import checker, redis_txmq, redis_txmq.scripts as s; print(redis_txmq.__version__); "
            "print(redis_txmq.__file__); print(checker.__file__); print(s._read.__wrapped__('heartbeat.lua'))",
        ],
        env=release_env(folder, {}),
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    version, package, checker, heartbeat = probe.stdout.split("\n", 3)
    assert version == "0.1.0"
    inside = folder.resolve()
    assert Path(package).resolve().is_relative_to(inside) and Path(checker).resolve().is_relative_to(inside)
    assert heartbeat.rstrip("\n") == (folder / "lua" / "heartbeat.lua").read_text().rstrip("\n")  # its own scripts
    return folder


def release_env(code: Path, settings: dict[str, str]) -> dict[str, str]:
    """The environment of a process running the code in ``code``: first on ``PYTHONPATH``; no ``TXMQ_*`` variable
    but ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(settings)
    return env


@dataclass
class Fleet:
    """Processes of either release: started with their output in files, stopped with SIGTERM, killed (by their own
    pid) at the end of the test if still running."""

    redis_url: str
    old_code: Path
    folder: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    topics: dict[str, str] = field(default_factory=dict)
    """Producer name -> the topic it sends to."""

    def code(self, release: str) -> Path:
        return {"old": self.old_code, "new": ROOT}[release]

    def start(self, name: str, release: str, args: list[str]) -> subprocess.Popen[bytes]:
        settings = {**FAST, "TXMQ_REDIS_URL": self.redis_url}
        out = (self.folder / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, *args],
            env=release_env(self.code(release), settings),
            cwd=self.folder,  # not the checkout: python -c puts its working directory first on sys.path
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        self.processes[name] = process
        return process

    def producer(self, name: str, release: str, *options: str, group: str = "shop", topic: str = "orders") -> None:
        """A producer of ``roles.py`` named ``name`` (its bodies begin with it; its ledger is ``<name>.ledger``)."""
        ledger = self.folder / f"{name}.ledger"
        self.topics[name] = topic
        self.start(name, release, [str(ROLES), group, topic, name, str(ledger), *options])

    def checker(self, name: str, release: str) -> None:
        """``txmq checker`` of ``release`` (its console entry point, run from the release's code)."""
        entry = "from redis_txmq.cli import main; main(prog_name='txmq')"
        self.start(name, release, ["-c", entry, "checker"])

    def ledger(self, name: str) -> list[str]:
        path = self.folder / f"{name}.ledger"
        return path.read_text().splitlines() if path.exists() else []

    def count(self, name: str) -> int:
        """How many transactions producer ``name`` prepared so far; fails if it died."""
        self.alive(name)
        return sum(line.startswith("prepared ") for line in self.ledger(name))

    def sent(self, name: str) -> bool:
        """Whether producer ``name`` is done with its sends; fails if it died instead."""
        self.alive(name)
        return "sent" in self.ledger(name)

    def prepared(self, topic: str) -> list[str]:
        """The bodies of every transaction the producers of this test prepared in ``topic``."""
        return [
            line.split(" ", 1)[1]
            for name, sent_to in self.topics.items()
            if sent_to == topic
            for line in self.ledger(name)
            if line.startswith("prepared ")
        ]

    def alive(self, name: str) -> None:
        status = self.processes[name].poll()
        assert status is None, f"{name} exited with status {status}:\n{self.output(name)}"

    def output(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-4000:]

    def crashed(self, name: str, timeout: float = 30) -> None:
        """Wait for producer ``name`` to die in its local transactions, as ``--crash`` makes it."""
        status = self.processes[name].wait(timeout)
        assert status == CRASH_STATUS, f"{name} exited with status {status}, not its crash:\n{self.output(name)}"

    def stop(self, name: str, timeout: float = 30) -> None:
        """SIGTERM, and wait for a clean exit."""
        process = self.processes[name]
        self.alive(name)
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout)
        assert status == 0, f"{name} exited with status {status} on SIGTERM:\n{self.output(name)}"

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture
def fleet(old_release: Path, redis_url: str, real_client: redis.Redis, tmp_path: Path) -> Iterator[Fleet]:
    running = Fleet(redis_url, old_release, tmp_path)
    try:
        yield running
    finally:
        running.close()


def topic_figures(client: redis.Redis, topic: str) -> dict[str, Any]:
    """Committed entries, transactions in flight, dead letters of an unpartitioned topic, as ``txmq status`` reads
    them (this checkout's reading)."""
    return admin.stream_figures(client, TopicKeys(topic), server_ms(client))


def committed_bodies(client: redis.Redis, topic: str) -> collections.Counter[str]:
    return collections.Counter(fields[b"body"].decode() for _, fields in client.xrange(topic))


def settled(fleet: Fleet, client: redis.Redis, topic: str) -> bool:
    """Every prepared transaction ended: nothing in flight, nothing dead-lettered, and every one that commits is in
    the topic stream."""
    from .roles import commits

    figures = topic_figures(client, topic)
    assert figures["dead_letters"] == 0, f"dead-lettered: {figures}"
    if figures["in_flight"]:
        return False
    committed = committed_bodies(client, topic)
    return all(body in committed for body in fleet.prepared(topic) if commits(body))


def assert_exactly_once(fleet: Fleet, client: redis.Redis, topic: str, timeout: float = 30) -> int:
    """Wait until every transaction any producer prepared has ended, then: each one that commits is in the topic
    stream exactly once, none that rolls back is, and nothing else is. Returns how many transactions there were."""
    from .roles import commits

    wait_until(lambda: settled(fleet, client, topic), timeout=timeout, interval=0.1)
    prepared = fleet.prepared(topic)
    assert len(prepared) == len(set(prepared)), "a body was prepared twice"
    committed = committed_bodies(client, topic)
    expected = {body for body in prepared if commits(body)}
    duplicated = {body: n for body, n in committed.items() if n > 1}
    assert not duplicated, f"committed more than once: {duplicated}"
    assert set(committed) == expected, (
        f"missing: {sorted(expected - set(committed))}, unexpected: {sorted(set(committed) - expected)}"
    )
    return len(prepared)
