"""The transaction log: one row per local transaction, written inside it, that answers check-backs.

A local transaction writes its row with ``session.execute(log.record(tx))``: the row commits or rolls back with
the service's own data, so "the row exists" means "the local transaction committed". A check-back reads it:

- a row saying COMMIT: **COMMIT**; a row saying ROLLBACK (a fence, below): **ROLLBACK**;
- no row, and the transaction may still be running (its handle is open in this process, or its half message is
  younger than ``local_transaction_max_seconds`` and this process did not see it end): **UNKNOWN**, ask again later;
- no row otherwise: the check writes a **fence**, a ROLLBACK row under the same primary key, in its own database
  transaction, and answers what the row then says.

Why this never publishes a rolled-back transaction nor drops a committed one, whatever the clocks do: the fence
and the local transaction's own row share a primary key, so at most one of them commits. If the local transaction
committed first, the fence's insert finds its row (the check answers COMMIT). If it is still running and has
written its row, the fence waits on that row's lock (at most ``lock_timeout_seconds``; UNKNOWN when it runs out),
then finds the row or takes the key. If it has not written its row yet, the fence takes the key and the local
transaction's own insert fails with a unique-constraint error, so it rolls back — and the check said ROLLBACK.
The age bound therefore only protects slow local transactions from being fenced (failed) while they run: set it
above the longest a local transaction of yours takes, and write the log row early in it. The age comes from the
half message's stream entry id (Redis's clock) against this process's clock; skew between them shortens or
lengthens the bound by as much, never more.

Retention: a row is needed while a check-back can still ask about its transaction, which is at most the checker's
``max_age`` (72 h by default; after it the transaction is dead-lettered). :meth:`TransactionLog.purge` deletes rows
older than a window you give; keep it above ``max_age`` (with the default, 7 days is a safe choice).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Column, Insert, MetaData, String, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError

from ..errors import ConfigurationError
from ..message import LocalTransactionState, Message
from ..sending import HandleState, ManyHandleState
from .statements import (
    PURGE_BATCH_SIZE,
    SESSION_LOCK_TIMEOUT_READ,
    Key,
    Purge,
    check_lengths,
    dialect_of,
    insert_if_absent,
    lock_timeout_statement,
    session_lock_timeout,
    session_lock_timeout_restore,
    table_in,
    timestamp,
    utc_now,
)

logger = logging.getLogger(__name__)

TRANSACTION_ID_LENGTH = 64

COMMIT = LocalTransactionState.COMMIT
ROLLBACK = LocalTransactionState.ROLLBACK
UNKNOWN = LocalTransactionState.UNKNOWN

_OPEN_HANDLES: weakref.WeakValueDictionary[str, HandleState | ManyHandleState] = weakref.WeakValueDictionary()
"""Transaction id -> the handle :meth:`TransactionLog.record` was given, while the handle lives: one registry for the
process, so that every log answers UNKNOWN for a transaction whose block is open here, whichever ``TransactionLog``
object recorded it (the producer's ``checker=`` is often built from another one than the request handlers use)."""
_OPEN_HANDLES_LOCK = threading.Lock()
"""Check-backs run on the producer's check threads while request handlers record."""


def _remember_open(transaction_id: str, handle: HandleState | ManyHandleState) -> None:
    with _OPEN_HANDLES_LOCK:
        _OPEN_HANDLES[transaction_id] = handle


def _open_handle(transaction_id: str) -> HandleState | ManyHandleState | None:
    with _OPEN_HANDLES_LOCK:
        return _OPEN_HANDLES.get(transaction_id)


class TransactionLog:
    """A table of committed local transactions in the service's own database, and the check-back that reads it.

    ``metadata`` is the service's SQLAlchemy ``MetaData`` (create the table with it, or with your migrations: the
    columns are ``transaction_id`` (primary key, compared exactly: ``VARBINARY(256)`` on MySQL / MariaDB),
    ``topic``, ``state`` and ``recorded_at``). ``lock_timeout_seconds`` bounds a fence's wait on a row a running
    local transaction holds (PostgreSQL's ``lock_timeout``, MySQL / MariaDB's ``innodb_lock_wait_timeout`` in whole
    seconds, set for the fence only; SQLite waits its own busy timeout)."""

    def __init__(
        self,
        metadata: MetaData,
        *,
        table_name: str = "txmq_transaction_log",
        local_transaction_max_seconds: float = 60.0,
        lock_timeout_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if local_transaction_max_seconds < 0 or lock_timeout_seconds <= 0:
            raise ConfigurationError(
                "transaction log: local_transaction_max_seconds must be >= 0 and lock_timeout_seconds > 0, got "
                f"{local_transaction_max_seconds} and {lock_timeout_seconds}"
            )
        self.local_transaction_max_seconds = local_transaction_max_seconds
        self.lock_timeout_seconds = lock_timeout_seconds
        self._clock = clock
        self.table = table_in(
            metadata,
            table_name,
            Column("transaction_id", Key(TRANSACTION_ID_LENGTH), primary_key=True),
            Column("topic", String(255), nullable=True),
            Column("state", String(8), nullable=False),
            Column("recorded_at", timestamp(), nullable=False, default=utc_now, index=True),
        )

    def record(self, transaction: HandleState | ManyHandleState | Message | str, *, topic: str | None = None) -> Insert:
        """The INSERT that marks the local transaction committed: execute it in that transaction, early
        (``session.execute(log.record(tx))``, ``await session.execute(...)`` on asyncio).

        ``transaction`` is a transaction handle (``tx``, of one message or of several), the message a listener
        received, or a transaction id. Besides building the statement, a handle is registered for this process (not
        for this log object: any ``TransactionLog`` here answers alike) while its block is open: a check-back
        meanwhile answers UNKNOWN instead of fencing a slow local transaction.
        Executing it raises the database's unique-constraint error when a check already fenced the transaction
        (it was taken for rolled back): the local transaction must then roll back, as the handle does."""
        if isinstance(transaction, HandleState):
            transaction_id, topic = transaction.transaction_id, topic or transaction.message.topic
            _remember_open(transaction_id, transaction)
        elif isinstance(transaction, ManyHandleState):
            transaction_id = transaction.transaction_id
            _remember_open(transaction_id, transaction)
        elif isinstance(transaction, Message):
            if not transaction.transaction_id:
                raise ConfigurationError(
                    f"topic {transaction.topic!r}: this message has no transaction id; record the message the "
                    "listener received (or the transaction handle), not the one passed to the send"
                )
            transaction_id, topic = transaction.transaction_id, topic or transaction.topic
        elif isinstance(transaction, str) and 0 < len(transaction) <= TRANSACTION_ID_LENGTH:
            transaction_id = transaction
        else:
            raise ConfigurationError(
                f"record() takes a transaction handle, a Message or a transaction id, got {transaction!r}"
            )
        values = {"transaction_id": transaction_id, "topic": topic, "state": COMMIT.value, "recorded_at": utc_now()}
        check_lengths(self.table, values, f"transaction log, topic {topic!r}")
        return insert(self.table).values(**values)

    def check(self, engine: Any, message: Message) -> LocalTransactionState:
        """Answer a check-back from the log (sync ``Engine``); see the module's description of the rules."""
        transaction_id = self._transaction_id(message)
        with engine.connect() as connection:
            state = connection.execute(self._state_of(transaction_id)).scalar_one_or_none()
        decided = self.decide(transaction_id, state, message)
        if decided is not None:
            return decided
        fence = self._fence_values(message)
        try:
            with engine.connect() as connection:
                dialect = dialect_of(connection)
                session_limit = session_lock_timeout(dialect, self.lock_timeout_seconds)
                previous = None
                if session_limit is not None:
                    previous = connection.exec_driver_sql(SESSION_LOCK_TIMEOUT_READ).scalar_one()
                    connection.exec_driver_sql(session_limit)
                    connection.commit()
                try:
                    with connection.begin():
                        if (limit := lock_timeout_statement(dialect, self.lock_timeout_seconds)) is not None:
                            connection.exec_driver_sql(limit)
                        statement = insert_if_absent(self.table, dialect, fence)
                        if statement is not None:
                            connection.execute(statement)
                        else:
                            try:
                                with connection.begin_nested():
                                    connection.execute(insert(self.table).values(**fence))
                            except IntegrityError:
                                pass
                        state = connection.execute(self._state_of(transaction_id)).scalar_one()
                finally:
                    if previous is not None and not connection.invalidated:
                        connection.exec_driver_sql(session_lock_timeout_restore(previous))
                        connection.commit()
        except OperationalError as exc:
            return self._still_locked(message, exc)
        return self._fenced(message, state)

    async def check_async(self, engine: Any, message: Message) -> LocalTransactionState:
        """:meth:`check` on an ``AsyncEngine``."""
        transaction_id = self._transaction_id(message)
        async with engine.connect() as connection:
            state = (await connection.execute(self._state_of(transaction_id))).scalar_one_or_none()
        decided = self.decide(transaction_id, state, message)
        if decided is not None:
            return decided
        fence = self._fence_values(message)
        try:
            async with engine.connect() as connection:
                dialect = dialect_of(connection)
                session_limit = session_lock_timeout(dialect, self.lock_timeout_seconds)
                previous = None
                if session_limit is not None:
                    previous = (await connection.exec_driver_sql(SESSION_LOCK_TIMEOUT_READ)).scalar_one()
                    await connection.exec_driver_sql(session_limit)
                    await connection.commit()
                try:
                    async with connection.begin():
                        if (limit := lock_timeout_statement(dialect, self.lock_timeout_seconds)) is not None:
                            await connection.exec_driver_sql(limit)
                        statement = insert_if_absent(self.table, dialect, fence)
                        if statement is not None:
                            await connection.execute(statement)
                        else:
                            try:
                                async with connection.begin_nested():
                                    await connection.execute(insert(self.table).values(**fence))
                            except IntegrityError:
                                pass
                        state = (await connection.execute(self._state_of(transaction_id))).scalar_one()
                finally:
                    if previous is not None and not connection.invalidated:
                        await connection.exec_driver_sql(session_lock_timeout_restore(previous))
                        await connection.commit()
        except OperationalError as exc:
            return self._still_locked(message, exc)
        return self._fenced(message, state)

    def checker(self, engine: Any) -> Callable[[Message], Any]:
        """The producer's ``checker=`` (or a listener's ``check_local_transaction``) on ``engine``: a plain
        function for a sync ``Engine``, an ``async def`` for an ``AsyncEngine``."""
        if _is_async_engine(engine):

            async def check_async(message: Message) -> LocalTransactionState:
                return await self.check_async(engine, message)

            return check_async

        def check(message: Message) -> LocalTransactionState:
            return self.check(engine, message)

        return check

    def decide(self, transaction_id: str, state: str | None, message: Message) -> LocalTransactionState | None:
        """The answer the log's row (``state``, None when absent) gives, or None when only a fence can tell."""
        if state is not None:
            return LocalTransactionState(state)
        handle = _open_handle(transaction_id)
        if handle is not None:
            return None if handle.ended else UNKNOWN  # open here: the local transaction is running
        if message.prepared_at is not None:
            age = self._clock() - message.prepared_at
            if age < self.local_transaction_max_seconds:
                logger.debug("tx=%s topic=%s no log row yet, %.1f s old: UNKNOWN", transaction_id, message.topic, age)
                return UNKNOWN
        return None

    def purge(self, engine: Any, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete the rows recorded more than ``older_than`` ago; returns how many. Keep ``older_than`` above the
        checker's ``max_age``: a check-back may ask about a transaction until then. Rows go in batches of at most
        ``batch_size``, each in a transaction of its own, so a concurrent ``record()`` waits for one batch at most."""
        purge = Purge(self.table, self.table.c.recorded_at, older_than, batch_size)
        deleted = 0
        while True:
            with engine.connect() as connection:
                keys = list(connection.execute(purge.batch).all())
            removed = 0
            if keys:
                with engine.begin() as connection:
                    removed = int(connection.execute(purge.delete(keys)).rowcount)
            deleted += removed
            if purge.done(len(keys), removed):
                return deleted

    async def purge_async(self, engine: Any, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """:meth:`purge` on an ``AsyncEngine``."""
        purge = Purge(self.table, self.table.c.recorded_at, older_than, batch_size)
        deleted = 0
        while True:
            async with engine.connect() as connection:
                keys = list((await connection.execute(purge.batch)).all())
            removed = 0
            if keys:
                async with engine.begin() as connection:
                    removed = int((await connection.execute(purge.delete(keys))).rowcount)
            deleted += removed
            if purge.done(len(keys), removed):
                return deleted

    def _state_of(self, transaction_id: str) -> Any:
        return select(self.table.c.state).where(self.table.c.transaction_id == transaction_id)

    def _transaction_id(self, message: Message) -> str:
        if not message.transaction_id:
            raise ConfigurationError(f"topic {message.topic!r}: a check-back message carries a transaction id")
        check_lengths(self.table, self._fence_values(message), f"transaction log, topic {message.topic!r}")
        return message.transaction_id

    @staticmethod
    def _fence_values(message: Message) -> dict[str, Any]:
        return {
            "transaction_id": message.transaction_id,
            "topic": message.topic,
            "state": ROLLBACK.value,
            "recorded_at": utc_now(),
        }

    @staticmethod
    def _fenced(message: Message, state: str) -> LocalTransactionState:
        answer = LocalTransactionState(state)
        if answer is ROLLBACK:
            logger.info("tx=%s topic=%s no log row: fenced, ROLLBACK", message.transaction_id, message.topic)
        return answer

    @staticmethod
    def _still_locked(message: Message, exc: Exception) -> LocalTransactionState:
        logger.warning(
            "tx=%s topic=%s the local transaction still holds its log row (%s): UNKNOWN, asked again later",
            message.transaction_id,
            message.topic,
            exc.__class__.__name__,
        )
        return UNKNOWN


def _is_async_engine(engine: Any) -> bool:
    """Without importing ``sqlalchemy.ext.asyncio`` (and greenlet) for a sync service."""
    return any(
        cls.__name__ == "AsyncEngine" and cls.__module__.startswith("sqlalchemy.") for cls in type(engine).__mro__
    )
