"""What the Django log and inbox decide without the database: the same rules as :mod:`redis_txmq.sqlalchemy`'s,
kept here so that the Django extra needs no SQLAlchemy.

- which transactions are open in this process (a check-back of one answers UNKNOWN instead of fencing it);
- a values' length against its column (refused, never truncated);
- the lock-wait bounds of a fence per database.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

from ..errors import ConfigurationError
from ..sending import HandleState, ManyHandleState

PURGE_BATCH_SIZE = 500
"""Rows a purge deletes per statement and per transaction: what a concurrent writer may wait for, at most."""

_OPEN_HANDLES: weakref.WeakValueDictionary[str, HandleState | ManyHandleState] = weakref.WeakValueDictionary()
"""Transaction id -> the handle ``TransactionLog.record`` was given, while the handle lives: one registry for the
process, whichever ``TransactionLog`` object recorded it (the producer's ``checker=`` is often another one)."""
_OPEN_HANDLES_LOCK = threading.Lock()
"""Check-backs run on the producer's check threads while request handlers record."""


def remember_open(transaction_id: str, handle: HandleState | ManyHandleState) -> None:
    with _OPEN_HANDLES_LOCK:
        _OPEN_HANDLES[transaction_id] = handle


def open_handle(transaction_id: str) -> HandleState | ManyHandleState | None:
    with _OPEN_HANDLES_LOCK:
        return _OPEN_HANDLES.get(transaction_id)


def check_lengths(model: Any, values: dict[str, Any], what: str) -> None:
    """Refuse a value longer than its field holds, on every database: PostgreSQL would raise, SQLite store it whole
    and MySQL's ``INSERT IGNORE`` (a fence) truncate it, so that two keys sharing a prefix would share a row."""
    for name, value in values.items():
        length = getattr(model._meta.get_field(name), "max_length", None)
        if isinstance(value, str) and length is not None and len(value) > length:
            raise ConfigurationError(
                f"{what}: {name} {value[:40]!r}... is {len(value)} characters, more than the {length} that "
                f"{model._meta.db_table}.{name} holds; refused rather than truncated: use a shorter {name}"
            )


def transaction_lock_timeout(vendor: str, seconds: float) -> str | None:
    """PostgreSQL: bound the fence's lock waits for its own transaction. SQLite waits its busy timeout (the
    database's ``OPTIONS["timeout"]``); MySQL / MariaDB have no such setting per transaction (below)."""
    if vendor == "postgresql":
        return f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'"
    return None


SESSION_LOCK_TIMEOUT_READ = "SELECT @@SESSION.innodb_lock_wait_timeout"


def session_lock_timeout(vendor: str, seconds: float) -> str | None:
    """MySQL / MariaDB: the statement bounding the connection's lock waits (whole seconds, at least 1; the server's
    default is 50). It lasts for the session: the fence reads it first and sets it back after."""
    if vendor == "mysql":
        return f"SET SESSION innodb_lock_wait_timeout = {max(1, math.ceil(seconds))}"
    return None


def session_lock_timeout_restore(previous: Any) -> str:
    return f"SET SESSION innodb_lock_wait_timeout = {int(previous)}"


def check_purge(older_than: Any, batch_size: int) -> None:
    if older_than.total_seconds() < 0:
        raise ConfigurationError(f"purge: older_than must not be negative, got {older_than}")
    if batch_size < 1:
        raise ConfigurationError(f"purge: batch_size must be at least 1, got {batch_size}")
