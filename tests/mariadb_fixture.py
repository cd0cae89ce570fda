"""A MariaDB server that the test session starts itself, and a fresh database per test.

``mariadb_url`` (session) comes from Debian's binaries (``mariadbd`` or ``mysqld`` and ``mariadb-install-db`` or
``mysql_install_db``, on PATH or in ``/usr/sbin``): a throw-away server whose data directory is a temporary
directory, root without a password, listening on a free port on 127.0.0.1 with its socket in that directory, no
binary log, no fsync at commit. Its character set and collation are Debian's (``utf8mb4``,
``utf8mb4_general_ci``: case- and accent-insensitive) and its lock wait timeout is the server's default (50 s),
so the tests meet what a service meets. The server refuses to run as root without being told which user to be:
as root it runs as ``mysql`` (else ``nobody``), which owns the temporary directory. Tests never use a server they
did not start. Missing binaries skip the tests, and fail them in CI.

``mariadb_engine`` (per test) is a sync engine (PyMySQL) on a new empty database, dropped after the test;
``async_mariadb_url`` is the URL of that database for ``create_async_engine`` (asyncmy).
"""

from __future__ import annotations

import os
import pwd
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

from .postgres_fixture import _temp_parent

START_DEADLINE_SECONDS = 60.0
SEARCH_PATH = f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin{os.pathsep}/usr/local/sbin"


def _mariadb_binaries() -> tuple[Path, Path] | None:
    """The server and the data directory's installer, from PATH or the sbin directories."""
    server = shutil.which("mariadbd", path=SEARCH_PATH) or shutil.which("mysqld", path=SEARCH_PATH)
    install = shutil.which("mariadb-install-db", path=SEARCH_PATH) or shutil.which("mysql_install_db", path=SEARCH_PATH)
    if server and install:
        return Path(server), Path(install)
    return None


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as when we are root (None: ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("mysql", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root without a mysql or nobody user for the MariaDB server")


class LocalMariaDB:
    """A throw-away server from the local binaries; :meth:`start` returns its port, :meth:`stop` removes it all."""

    def __init__(self, server: Path, install: Path) -> None:
        self.server, self.install = server, install
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="txmq-mariadb-", dir=_temp_parent(self.user)))
        self.data = self.root / "data"
        self.log = self.root / "error.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)

    def _user_option(self) -> list[str]:
        return [] if self.user is None else [f"--user={self.user.pw_name}"]

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def start(self) -> int:
        installed = subprocess.run(
            [
                str(self.install),
                "--no-defaults",
                f"--datadir={self.data}",
                *self._user_option(),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if installed.returncode != 0:
            raise RuntimeError(f"{self.install.name} failed ({installed.returncode}): {installed.stderr}")
        last_error = ""
        for _attempt in range(3):  # the free port may be taken between free_port() and the bind
            self.port = free_port()
            self.process = subprocess.Popen(
                [
                    str(self.server),
                    "--no-defaults",
                    f"--datadir={self.data}",
                    *self._user_option(),
                    "--bind-address=127.0.0.1",
                    f"--port={self.port}",
                    f"--socket={self.root / 'mysqld.sock'}",
                    f"--pid-file={self.root / 'mysqld.pid'}",
                    f"--log-error={self.log}",
                    "--skip-name-resolve",
                    "--skip-log-bin",
                    "--character-set-server=utf8mb4",
                    "--collation-server=utf8mb4_general_ci",
                    "--innodb-flush-log-at-trx-commit=0",
                    "--innodb-doublewrite=0",
                    "--innodb-buffer-pool-size=64M",
                    "--max-connections=500",
                ],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_until_accepting():
                return self.port
            last_error = self._log_tail()
            self._stop_server()
        raise RuntimeError(f"MariaDB did not start: {last_error}")

    def _wait_until_accepting(self) -> bool:
        """Poll until the server takes a TCP connection; False when it exited or at the deadline."""
        import pymysql

        deadline = time.monotonic() + START_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2).close()
                return True
            except pymysql.err.OperationalError:
                time.sleep(0.1)
        return False

    def _stop_server(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # our own server: the process we started
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def stop(self) -> None:
        try:
            self._stop_server()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _no_mariadb(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{message}: install mariadb-server and the mysql extra (bash .ci/run does)")
    pytest.skip(message)


def url(port: int, database: str, driver: str = "pymysql") -> str:
    return f"mysql+{driver}://root@127.0.0.1:{port}/{database}?charset=utf8mb4"


@pytest.fixture(scope="session")
def mariadb_port() -> Iterator[int]:
    """Port on 127.0.0.1 of a MariaDB server owned by this test session (user root, no password)."""
    binaries = _mariadb_binaries()
    if binaries is None:
        _no_mariadb("no MariaDB binaries (mariadbd and mariadb-install-db)")
        return
    try:
        import asyncmy  # noqa: F401
        import pymysql  # noqa: F401
    except ImportError:
        _no_mariadb("no MySQL drivers (pymysql, asyncmy)")
        return
    server = LocalMariaDB(*binaries)
    try:
        port = server.start()
    except BaseException:
        server.stop()
        raise
    try:
        yield port
    finally:
        server.stop()


@pytest.fixture
def mariadb_engine(mariadb_port: int) -> Iterator[Any]:
    """A sync SQLAlchemy engine on a fresh empty database (the server's default character set and collation),
    dropped after the test."""
    import pymysql
    from sqlalchemy import create_engine

    database = f"t_{uuid.uuid4().hex[:16]}"
    admin = pymysql.connect(host="127.0.0.1", port=mariadb_port, user="root", autocommit=True)
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{database}`")
        engine = create_engine(url(mariadb_port, database))
        try:
            yield engine
        finally:
            engine.dispose()
            with admin.cursor() as cursor:
                # A connection the test left open (an undisposed async engine, a leaked session) would block the DROP.
                cursor.execute(
                    "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
                    (database,),
                )
                for (connection_id,) in cursor.fetchall():
                    try:
                        cursor.execute(f"KILL {int(connection_id)}")
                    except Exception as exc:  # noqa: BLE001 - (1094, 'Unknown thread id'): gone meanwhile
                        if getattr(exc, "args", (None,))[0] != 1094:
                            raise
                cursor.execute(f"DROP DATABASE `{database}`")
    finally:
        admin.close()


@pytest.fixture
def async_mariadb_url(mariadb_engine: Any, mariadb_port: int) -> str:
    """The URL of ``mariadb_engine``'s database for ``create_async_engine`` (asyncmy)."""
    return url(mariadb_port, mariadb_engine.url.database, driver="asyncmy")
