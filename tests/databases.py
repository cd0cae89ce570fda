"""The databases the SQLAlchemy integration is tested on: SQLite (a file per test), the PostgreSQL cluster the test
session starts (a schema per test) and the MariaDB server it starts (a database per test, through the MySQL dialect
with PyMySQL and asyncmy). Each test gets a sync engine and an asyncio one on the same database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, event
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from redis_txmq.sqlalchemy import Inbox, TransactionLog


@dataclass
class Database:
    name: str
    engine: Any
    async_url: str
    async_kwargs: dict[str, Any]
    metadata: MetaData
    log: TransactionLog
    inbox: Inbox

    def async_engine(self) -> Any:
        return create_async_engine(self.async_url, **self.async_kwargs)

    def other_engine(self) -> Any:
        """Another sync engine on the same database, without a pool: a session setting made on it dies with it."""
        connect_args = {"timeout": 2} if self.name == "sqlite" else {}
        return create_engine(self.engine.url, poolclass=NullPool, connect_args=connect_args)

    def create_tables(self) -> None:
        self.metadata.create_all(self.engine)


DATABASES = ["sqlite", "postgresql", "mariadb"]


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Database]:
    metadata = MetaData()
    log = TransactionLog(metadata, local_transaction_max_seconds=30, lock_timeout_seconds=2)
    inbox = Inbox(metadata)
    if request.param == "sqlite":
        path = tmp_path / "service.db"
        engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 2})
        database = Database(
            "sqlite", engine, f"sqlite+aiosqlite:///{path}", {"connect_args": {"timeout": 2}}, metadata, log, inbox
        )
    elif request.param == "postgresql":
        engine = request.getfixturevalue("postgres_engine")  # its URL names the test's own schema
        url = engine.url.render_as_string(hide_password=False)
        database = Database("postgresql", engine, url, {}, metadata, log, inbox)
    else:
        engine = request.getfixturevalue("mariadb_engine")  # its URL names the test's own database
        database = Database("mariadb", engine, request.getfixturevalue("async_mariadb_url"), {}, metadata, log, inbox)
    database.create_tables()
    yield database
    engine.dispose()


def bound_lock_waits(connection: Any, seconds: int = 1) -> None:
    """Make ``connection``'s transaction fail a lock wait after ``seconds`` instead of waiting on (SQLite waits its
    busy timeout, 2 s here). On MySQL / MariaDB the setting lasts for the session: use :meth:`Database.other_engine`."""
    name = connection.dialect.name
    if name == "postgresql":
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{seconds}s'")
    elif name in ("mysql", "mariadb"):
        connection.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {seconds}")


@dataclass
class DeleteWatch:
    """The rows each DELETE statement and each committed transaction on an engine deleted; with ``hold``, the first
    commit after a DELETE waits until :attr:`release` is set (:attr:`holding` says it is waiting), so a test can act
    while a purge's batch holds its locks."""

    hold: bool = False
    per_statement: list[int] = field(default_factory=list)
    per_transaction: list[int] = field(default_factory=list)
    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    _open: int = 0

    def watch(self, engine: Any) -> DeleteWatch:
        event.listen(engine, "after_cursor_execute", self._executed)
        event.listen(engine, "commit", self._committing)
        return self

    def _executed(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            self.per_statement.append(cursor.rowcount)
            self._open += cursor.rowcount

    def _committing(self, conn: Any) -> None:
        deleted, self._open = self._open, 0
        if deleted:
            self.per_transaction.append(deleted)
            if self.hold and not self.holding.is_set():
                self.holding.set()
                self.release.wait(60)
