"""What the transaction log and the inbox send to the database, without I/O: the sync and asyncio methods of
:class:`~redis_txmq.sqlalchemy.TransactionLog` and :class:`~redis_txmq.sqlalchemy.Inbox` only execute these.

A row that must be written at most once ("insert if absent") is one statement where the dialect has one
(PostgreSQL and SQLite ``ON CONFLICT DO NOTHING``, MySQL / MariaDB ``INSERT IGNORE``); elsewhere a plain INSERT
inside a SAVEPOINT, whose unique-constraint error means "already there".
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Column, Insert, MetaData, Table, insert

from ..errors import ConfigurationError

ON_CONFLICT_DIALECTS = ("postgresql", "sqlite")
IGNORE_DIALECTS = ("mysql", "mariadb")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def insert_if_absent(table: Table, dialect_name: str, values: dict[str, Any]) -> Insert | None:
    """One statement that writes the row unless its key is taken (:func:`was_written` tells which); None for a
    dialect without one: the caller inserts in a SAVEPOINT instead. PostgreSQL and SQLite return the written key
    (RETURNING): psycopg 3 reports no row count for these statements."""
    key = list(table.primary_key.columns)[0]
    if dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).values(**values).on_conflict_do_nothing().returning(key)
    if dialect_name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).values(**values).on_conflict_do_nothing().returning(key)
    if dialect_name in IGNORE_DIALECTS:
        return insert(table).values(**values).prefix_with("IGNORE")
    return None


def was_written(result: Any) -> bool:
    """Whether an :func:`insert_if_absent` statement wrote its row."""
    if result.returns_rows:
        return result.first() is not None
    return bool(result.rowcount == 1)


def dialect_of(executor: Any) -> str:
    """The dialect name of a ``Session``, ``Connection``, ``AsyncSession`` or ``AsyncConnection``."""
    dialect = getattr(executor, "dialect", None)
    if dialect is None:
        dialect = executor.get_bind().dialect
    return str(dialect.name)


def lock_timeout_statement(dialect_name: str, seconds: float) -> str | None:
    """Bound how long a fence waits on a local transaction that holds the row's lock (PostgreSQL; SQLite waits its
    own busy timeout, MySQL its ``innodb_lock_wait_timeout``)."""
    if dialect_name == "postgresql":
        return f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'"
    return None


def table_in(metadata: MetaData, name: str, *columns: Column[Any]) -> Table:
    """The table in ``metadata``: made here, or the one already there under that name (a second log or inbox over
    the same metadata, a table reflected or declared by migrations) when it has the columns."""
    existing = metadata.tables.get(name)
    if existing is None:
        return Table(name, metadata, *columns)
    missing = [column.name for column in columns if column.name not in existing.c]
    if missing:
        raise ConfigurationError(f"table {name!r} exists in the metadata without the column(s) {', '.join(missing)}")
    return existing
