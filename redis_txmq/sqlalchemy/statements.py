"""What the transaction log and the inbox send to the database, and how each effect of their steps
(``redis_txmq.core.local_records``) is run: on a connection of its own from the engine, by one sync function for both
APIs — the asyncio methods hand it the sync face of their ``AsyncConnection`` / ``AsyncSession`` (``run_sync``), so the
sync and asyncio methods of [`TransactionLog`][redis_txmq.sqlalchemy.transaction_log.TransactionLog] and
[`Inbox`][redis_txmq.sqlalchemy.inbox.Inbox] are written once.

A row that must be written at most once ("insert if absent") is one statement where the dialect has one (PostgreSQL and
SQLite ``ON CONFLICT DO NOTHING``, MySQL / MariaDB ``INSERT IGNORE``); elsewhere a plain INSERT inside a SAVEPOINT,
whose unique-constraint error means "already there". ``INSERT IGNORE`` also turns a value too long for its column into a
truncated one, so every value is checked against its column's length first (``check_lengths``): two long names sharing a
prefix must not share a row.

Keys are compared byte for byte on every database (``Key``): MySQL and MariaDB compare ``VARCHAR`` in the server's
collation, usually case- and accent-insensitive and padding trailing spaces, so ``billing`` and ``Billing`` would be one
consumer group there.

Purging deletes in batches (``Purge``): the keys of at most ``batch_size`` old rows are read, then those rows deleted by
key in a short transaction of their own. One large ``DELETE ... WHERE recorded_at < ...`` at MySQL's REPEATABLE READ
locks the range it scans (the whole table when it scans it all), so a concurrent insert of a new row waited for the
purge to end; a delete by primary key locks only the rows it deletes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Column, DateTime, Delete, Insert, MetaData, Select, String, Table, delete, insert, select, tuple_
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import IntegrityError
from sqlalchemy.types import TypeDecorator

from ..core import local_records
from ..core.errors import ConfigurationError
from ..core.local_records import MYSQL_FAMILY, OldKeys, check_purge, purge_steps, run, run_async

ON_CONFLICT_DIALECTS = ("postgresql", "sqlite")
IGNORE_DIALECTS = MYSQL_FAMILY


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Key(TypeDecorator[str]):
    """A text key compared exactly (case, accents, trailing spaces) on every database: ``VARBINARY`` holding the
    UTF-8 bytes on MySQL / MariaDB (room for ``length`` characters of 4 bytes), ``VARCHAR(length)`` elsewhere,
    whose default collations already compare exactly."""

    impl = String
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name in IGNORE_DIALECTS:
            return dialect.type_descriptor(mysql.VARBINARY(4 * self.length))
        return dialect.type_descriptor(String(self.length))

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if isinstance(value, str) and dialect.name in IGNORE_DIALECTS:
            return value.encode("utf-8")
        return value

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("utf-8")
        return value


def timestamp() -> DateTime:
    """A UTC time column; on MySQL / MariaDB with microseconds (``DATETIME`` keeps whole seconds there, rounded on
    MySQL: a row written now could count as written in the future and escape a purge)."""
    return DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *IGNORE_DIALECTS)  # type: ignore[return-value]


def insert_if_absent(table: Table, dialect_name: str, values: dict[str, Any]) -> Insert | None:
    """One statement that writes the row unless its key is taken (``was_written`` tells which); None for a
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
    """Whether an ``insert_if_absent`` statement wrote its row."""
    if result.returns_rows:
        return result.first() is not None
    return bool(result.rowcount == 1)


def insert_once(executor: Any, table: Table, values: dict[str, Any]) -> bool:
    """Write the row unless its key is taken, on a sync ``Session`` or ``Connection`` (the asyncio ones run this
    through their ``run_sync``); whether it was written."""
    statement = insert_if_absent(table, dialect_of(executor), values)
    if statement is not None:
        return was_written(executor.execute(statement))
    try:
        with executor.begin_nested():
            executor.execute(insert(table).values(**values))
    except IntegrityError:
        return False
    return True


def check_lengths(table: Table, values: dict[str, Any], what: str) -> None:
    """``redis_txmq.core.local_records.check_lengths`` against ``table``'s columns."""
    local_records.check_lengths(values, lambda name: getattr(table.c[name].type, "length", None), table.name, what)


def dialect_of(executor: Any) -> str:
    """The dialect name of a ``Session``, ``Connection``, ``AsyncSession`` or ``AsyncConnection``."""
    dialect = getattr(executor, "dialect", None)
    if dialect is None:
        dialect = executor.get_bind().dialect
    return str(dialect.name)


def on_own_connection(engine: Any, perform: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """Each effect of steps performed by ``perform(connection, effect)`` on a connection of its own from a sync
    ``Engine``, given back to the pool after it."""

    def each(effect: Any) -> Any:
        with engine.connect() as connection:
            return perform(connection, effect)

    return each


def on_own_connection_async(engine: Any, perform: Callable[[Any, Any], Any]) -> Callable[[Any], Awaitable[Any]]:
    """``on_own_connection`` on an ``AsyncEngine``: ``perform`` gets the sync face of the ``AsyncConnection``
    (``run_sync``), so the statements of an effect are written once for both."""

    async def each(effect: Any) -> Any:
        async with engine.connect() as connection:
            return await connection.run_sync(perform, effect)

    return each


class Purge:
    """The statements of a purge in batches (``redis_txmq.core.local_records.purge_steps``): ``batch`` reads the
    keys of up to ``batch_size`` rows older than the cutoff (a plain read, no locks), ``delete`` deletes those rows by
    key (still older than the cutoff: a key written again since is kept)."""

    def __init__(self, table: Table, time_column: Column[Any], older_than: timedelta, batch_size: int) -> None:
        check_purge(older_than, batch_size)
        self.table, self.batch_size = table, batch_size
        self.cutoff = utc_now() - older_than
        self.keys = list(table.primary_key.columns)
        self.old = time_column < self.cutoff
        self.batch: Select[Any] = select(*self.keys).where(self.old).order_by(time_column).limit(batch_size)

    def delete(self, keys: list[Any]) -> Delete:
        if len(self.keys) == 1:
            return delete(self.table).where(self.keys[0].in_([key[0] for key in keys]), self.old)
        return delete(self.table).where(tuple_(*self.keys).in_([tuple(key) for key in keys]), self.old)

    def perform(self, connection: Any, effect: Any) -> Any:
        """An effect of ``redis_txmq.core.local_records.purge_steps`` on a sync ``Connection``."""
        if isinstance(effect, OldKeys):
            return list(connection.execute(self.batch).all())
        with connection.begin():
            return int(connection.execute(self.delete(effect.keys)).rowcount)


def purge_rows(engine: Any, table: Table, time_column: Column[Any], older_than: timedelta, batch_size: int) -> int:
    """Delete the rows of ``table`` whose ``time_column`` is more than ``older_than`` ago, in batches
    (``Purge``), on a sync ``Engine``; returns how many."""
    statements = Purge(table, time_column, older_than, batch_size)
    return run(purge_steps(batch_size), on_own_connection(engine, statements.perform))


async def purge_rows_async(
    engine: Any, table: Table, time_column: Column[Any], older_than: timedelta, batch_size: int
) -> int:
    """``purge_rows`` on an ``AsyncEngine``."""
    statements = Purge(table, time_column, older_than, batch_size)
    return await run_async(purge_steps(batch_size), on_own_connection_async(engine, statements.perform))


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
