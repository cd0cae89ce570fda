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
``max_age`` (72 h by default; after it the transaction is dead-lettered).
[`TransactionLog.purge`][redis_txmq.sqlalchemy.transaction_log.TransactionLog.purge] deletes rows older than a window
you give; keep it above ``max_age`` (with the default, 7 days is a safe choice).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Column, Insert, MetaData, String, insert, select
from sqlalchemy.exc import OperationalError

from ..core.local_records import (
    PURGE_BATCH_SIZE,
    SESSION_LOCK_TIMEOUT_READ,
    STATE_LENGTH,
    TOPIC_LENGTH,
    TRANSACTION_ID_LENGTH,
    StateOf,
    TransactionLogRules,
    run,
    run_async,
    session_lock_timeout,
    session_lock_timeout_restore,
    transaction_lock_timeout,
)
from ..core.message import LocalTransactionState, Message
from ..core.sending import HandleState, ManyHandleState
from . import row_watch
from .statements import (
    Key,
    check_lengths,
    dialect_of,
    insert_once,
    on_own_connection,
    on_own_connection_async,
    purge_rows,
    purge_rows_async,
    table_in,
    timestamp,
    utc_now,
)


class TransactionLog(TransactionLogRules):
    """A table of committed local transactions in the service's own database, and the check-back that reads it.

    ``metadata`` is the service's SQLAlchemy ``MetaData`` (create the table with it, or with your migrations: the
    columns are ``transaction_id`` (primary key, compared exactly: ``VARBINARY(256)`` on MySQL / MariaDB), ``topic``,
    ``state`` and ``recorded_at``). ``lock_timeout_seconds`` bounds a fence's wait on a row a running local transaction
    holds (PostgreSQL's ``lock_timeout``, MySQL / MariaDB's ``innodb_lock_wait_timeout`` in whole seconds, set for the
    fence only; SQLite waits its own busy timeout). What it decides without the database (the rules above, the handles
    open in this process) is ``TransactionLogRules``, shared with the Django log."""

    _LOCK_ERRORS = (OperationalError,)
    _logger = logging.getLogger(__name__)

    def __init__(
        self,
        metadata: MetaData,
        *,
        table_name: str = "txmq_transaction_log",
        local_transaction_max_seconds: float = 60.0,
        lock_timeout_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(local_transaction_max_seconds, lock_timeout_seconds, clock)
        self.table = table_in(
            metadata,
            table_name,
            Column("transaction_id", Key(TRANSACTION_ID_LENGTH), primary_key=True),
            Column("topic", String(TOPIC_LENGTH), nullable=True),
            Column("state", String(STATE_LENGTH), nullable=False),
            Column("recorded_at", timestamp(), nullable=False, default=utc_now, index=True),
        )

    def record(self, transaction: HandleState | ManyHandleState | Message | str, *, topic: str | None = None) -> Insert:
        """The INSERT that marks the local transaction committed: execute it in that transaction, early
        (``session.execute(log.record(tx))``, ``await session.execute(...)`` on asyncio).

        ``transaction`` is a transaction handle (``tx``, of one message or of several), the message a listener
        received, or a transaction id. Besides building the statement, a handle is registered for this process (not
        for this log object: any log here, SQLAlchemy's or Django's, answers alike) while its block is open: a
        check-back meanwhile answers UNKNOWN instead of fencing a slow local transaction.
        Executing it raises the database's unique-constraint error when a check already fenced the transaction
        (it was taken for rolled back): the local transaction must then roll back, as the handle does.

        Committed means the outermost transaction committed: executed in a savepoint (``begin_nested()``) or in a
        transaction still open when the block ends, the handle's COMMIT waits for the session's outermost commit (on a
        Core ``Connection``, for the check-back); a rollback of the row rolls the message back
        (``redis_txmq.sqlalchemy.row_watch``). A bare transaction id is not followed so."""
        values = self._committed_values(*self._identify(transaction, topic))
        statement = insert(self.table).values(**values, recorded_at=utc_now())
        if isinstance(transaction, str):
            return statement
        row_watch.install()
        return statement.execution_options(**{row_watch.ROW_OPTION: values["transaction_id"]})

    def check(self, engine: Any, message: Message) -> LocalTransactionState:
        """Answer a check-back from the log (sync ``Engine``); see the module's description of the rules."""
        steps = self._check_steps(self._transaction_id(message), message)
        return run(steps, on_own_connection(engine, self._perform))

    async def check_async(self, engine: Any, message: Message) -> LocalTransactionState:
        """[`check`][redis_txmq.sqlalchemy.transaction_log.TransactionLog.check] on an ``AsyncEngine``."""
        steps = self._check_steps(self._transaction_id(message), message)
        return await run_async(steps, on_own_connection_async(engine, self._perform))

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

    def purge(self, engine: Any, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete the rows recorded more than ``older_than`` ago; returns how many. Keep ``older_than`` above the
        checker's ``max_age``: a check-back may ask about a transaction until then. Rows go in batches of at most
        ``batch_size``, each in a transaction of its own, so a concurrent ``record()`` waits for one batch at most."""
        return purge_rows(engine, self.table, self.table.c.recorded_at, older_than, batch_size)

    async def purge_async(self, engine: Any, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """[`purge`][redis_txmq.sqlalchemy.transaction_log.TransactionLog.purge] on an ``AsyncEngine``."""
        return await purge_rows_async(engine, self.table, self.table.c.recorded_at, older_than, batch_size)

    def _perform(self, connection: Any, effect: Any) -> Any:
        """An effect of ``_check_steps`` on a sync ``Connection``."""
        if isinstance(effect, StateOf):
            return connection.execute(self._state_of(effect.transaction_id)).scalar_one_or_none()
        return self._fence(connection, {**effect.values, "recorded_at": utc_now()})

    def _fence(self, connection: Any, fence: dict[str, Any]) -> str:
        """Write the ROLLBACK row unless the key is taken, in a transaction of its own; the row's state then."""
        dialect = dialect_of(connection)
        session_limit = session_lock_timeout(dialect, self.lock_timeout_seconds)
        previous = None
        if session_limit is not None:
            previous = connection.exec_driver_sql(SESSION_LOCK_TIMEOUT_READ).scalar_one()
            connection.exec_driver_sql(session_limit)
            connection.commit()
        try:
            with connection.begin():
                if (limit := transaction_lock_timeout(dialect, self.lock_timeout_seconds)) is not None:
                    connection.exec_driver_sql(limit)
                insert_once(connection, self.table, fence)
                return str(connection.execute(self._state_of(fence["transaction_id"])).scalar_one())
        finally:
            if previous is not None and not connection.invalidated:
                connection.exec_driver_sql(session_lock_timeout_restore(previous))
                connection.commit()

    def _state_of(self, transaction_id: str) -> Any:
        return select(self.table.c.state).where(self.table.c.transaction_id == transaction_id)

    def _check_lengths(self, values: dict[str, Any], what: str) -> None:
        check_lengths(self.table, values, what)


def _is_async_engine(engine: Any) -> bool:
    """Without importing ``sqlalchemy.ext.asyncio`` (and greenlet) for a sync service."""
    return any(
        cls.__name__ == "AsyncEngine" and cls.__module__.startswith("sqlalchemy.") for cls in type(engine).__mro__
    )
