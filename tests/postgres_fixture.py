"""A PostgreSQL cluster that the test session starts itself, and a fresh schema per test.

``postgres_url`` (session) comes from testcontainers' PostgreSQL module when a Docker engine answers, else from
Debian's binaries (``initdb``/``pg_ctl`` on PATH or under ``/usr/lib/postgresql/*/bin``): a throw-away cluster in a
temporary directory, trust auth, listening on a free port on 127.0.0.1 with its socket in that directory, fsync off.
PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres`` system user (else ``nobody``).
Tests never use a server they did not start.

``postgres_engine`` (per test) is a sync engine whose connections see only a new empty schema (``search_path`` and
``application_name`` ride in the URL's ``options``, so an engine made from ``engine.url`` sees the same schema);
``async_postgres_url`` is that URL as a string for ``create_async_engine`` (psycopg 3 does asyncio on the same URL).
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_txmq.transport.embedded import free_port

DATABASE = "txmq_test"
SUPERUSER = "postgres"
START_DEADLINE_SECONDS = 30.0


def _docker_answers() -> bool:
    from .conftest import _docker_answers as answers

    return answers()


def _postgres_binaries() -> tuple[Path, Path] | None:
    """``initdb`` and ``pg_ctl``: from PATH when both are there, else from Debian's newest version."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(initdb), Path(pg_ctl)

    def version(bindir: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name))

    bindirs = [Path(path) for path in glob.glob("/usr/lib/postgresql/*/bin")]
    for bindir in sorted(bindirs, key=version, reverse=True):
        if os.access(bindir / "initdb", os.X_OK) and os.access(bindir / "pg_ctl", os.X_OK):
            return bindir / "initdb", bindir / "pg_ctl"
    return None


def _unprivileged_prefix() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that runs a program as a user PostgreSQL accepts, and that user (None: ourselves)."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        if shutil.which("runuser"):
            return ["runuser", "-u", name, "--"], user
        if shutil.which("setpriv"):
            return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"], user
        break
    raise RuntimeError("running as root with neither runuser nor setpriv (or no postgres/nobody user)")


def _temp_parent(user: pwd.struct_passwd | None) -> str | None:
    """Where the cluster's directory goes: the usual temp dir, unless the cluster's user could not reach it."""
    if user is None:
        return None
    path = Path(tempfile.gettempdir()).resolve()
    if all(os.stat(part).st_mode & 0o001 for part in [path, *path.parents]):
        return str(path)
    return "/tmp"


class LocalPostgres:
    """A throw-away cluster from the local binaries; :meth:`start` returns its URL, :meth:`stop` removes it all."""

    def __init__(self, initdb: Path, pg_ctl: Path) -> None:
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.prefix, self.user = _unprivileged_prefix()
        self.root = Path(tempfile.mkdtemp(prefix="txmq-pg-", dir=_temp_parent(self.user)))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = 0
        self.started = False
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
        for name in ("PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGOPTIONS"):
            env.pop(name, None)
        return subprocess.run(
            [*self.prefix, *args],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def start(self) -> str:
        initdb = self._run(
            str(self.initdb),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            SUPERUSER,
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({initdb.returncode}): {initdb.stderr or initdb.stdout}")
        last_error = ""
        for _attempt in range(3):  # the free port may be taken between free_port() and the bind
            self.port = free_port()
            options = " ".join(
                [
                    "-c listen_addresses=127.0.0.1",
                    f"-c port={self.port}",
                    f"-c unix_socket_directories={shlex.quote(str(self.root))}",
                    "-c fsync=off",
                    "-c synchronous_commit=off",
                    "-c full_page_writes=off",
                ]
            )
            started = self._run(
                str(self.pg_ctl),
                "start",
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                options,
                "-w",
                "-t",
                str(int(START_DEADLINE_SECONDS)),
                timeout=START_DEADLINE_SECONDS + 10,
            )
            self.started = True
            if started.returncode == 0 and self._wait_until_accepting():
                return self.url(DATABASE)
            last_error = f"pg_ctl start ({started.returncode}): {started.stderr or started.stdout}\n{self._log_tail()}"
            self._stop_server()
        raise RuntimeError(f"PostgreSQL did not start: {last_error}")

    def _wait_until_accepting(self) -> bool:
        """Poll until the server takes a TCP connection, then create the test database; False at the deadline."""
        import psycopg

        deadline = time.monotonic() + START_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(
                    host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", connect_timeout=2
                ) as connection:
                    connection.autocommit = True
                    connection.execute(f'CREATE DATABASE "{DATABASE}"')
                    return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def _stop_server(self) -> None:
        if not self.started:
            return
        pid = self._postmaster_pid()
        try:
            stopped = self._run(str(self.pg_ctl), "stop", "-D", str(self.data), "-m", "immediate", "-w")
            ok = stopped.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        if not ok and pid is not None:  # our own postmaster, read from our own data directory
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.started = False

    def stop(self) -> None:
        try:
            self._stop_server()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _no_postgres(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{message}: install postgresql (bash .ci/run does)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL (``postgresql+psycopg://...``) of an empty database ``txmq_test`` owned by this test session."""
    if _docker_answers():
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:  # testcontainers before the community split
            from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", dbname=DATABASE, driver="psycopg") as container:
            yield container.get_connection_url()
        return
    binaries = _postgres_binaries()
    if binaries is None:
        _no_postgres("no Docker engine and no PostgreSQL binaries (initdb, pg_ctl)")
        return
    server = LocalPostgres(*binaries)
    try:
        url = server.start()
    except BaseException:
        server.stop()
        raise
    try:
        yield url
    finally:
        server.stop()


def _admin_engine(url: str) -> Any:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")


@pytest.fixture
def postgres_engine(postgres_url: str) -> Iterator[Any]:
    """A sync SQLAlchemy engine whose connections see only a fresh empty schema, dropped (CASCADE) after the test."""
    from sqlalchemy import create_engine, make_url, text

    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = _admin_engine(postgres_url)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}", "application_name": schema})
    engine = create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as connection:
            # A connection the test left open (an undisposed async engine, a leaked session) would block the DROP.
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = :name AND pid <> pg_backend_pid()"
                ),
                {"name": schema},
            )
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def async_postgres_url(postgres_engine: Any) -> str:
    """The URL of ``postgres_engine``'s database and schema, for ``create_async_engine`` (psycopg 3 is async too)."""
    return postgres_engine.url.render_as_string(hide_password=False)
