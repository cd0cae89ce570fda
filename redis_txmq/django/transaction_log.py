"""The transaction log on Django: one row per local transaction, written inside it, that answers check-backs.

The rules are those of ``redis_txmq.sqlalchemy.transaction_log`` (read its description for why they hold):

- a row saying COMMIT: **COMMIT**; a row saying ROLLBACK (a fence): **ROLLBACK**;
- no row, and the transaction may still be running (its handle is open in this process, or its half message is
  younger than ``local_transaction_max_seconds``): **UNKNOWN**, ask again later;
- no row otherwise: the check writes a **fence**, a ROLLBACK row under the same primary key, in a database transaction
  of its own (``INSERT ... ON CONFLICT DO NOTHING`` on PostgreSQL and SQLite, ``INSERT IGNORE`` on MySQL / MariaDB),
  and answers what the row then says. A local transaction that wrote its row and has not committed holds that key's
  lock: the fence waits for it at most ``lock_timeout_seconds`` (PostgreSQL's ``lock_timeout``, MySQL / MariaDB's
  ``innodb_lock_wait_timeout`` set for the fence and set back; SQLite, which has one writer at a time, waits its
  busy timeout, the database's ``OPTIONS["timeout"]``) and answers **UNKNOWN** when it runs out. A fence that took
  the key makes the local transaction's own insert fail (``django.db.IntegrityError``): it rolls back, as the check
  said.

A fence is an insert, not a ``SELECT ... FOR UPDATE``: a transaction that has not written its row yet holds no row to
lock, and only a row under its key stops it from committing later.

Connections: Django's are per thread. A check runs on the thread that calls it (the sync producer's check threads;
the asyncio producer's through ``sync_to_async`` on a thread of its pool), in autocommit, outside any atomic block;
it drops that thread's connection when it is unusable or older than ``CONN_MAX_AGE``, before and after, as Django
does around a request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.utils import timezone

from ..core.errors import ConfigurationError
from ..core.local_records import (
    PURGE_BATCH_SIZE,
    SESSION_LOCK_TIMEOUT_READ,
    StateOf,
    TransactionLogRules,
    run,
    session_lock_timeout,
    session_lock_timeout_restore,
    transaction_lock_timeout,
)
from ..core.log_rows import RowState, watch_row
from ..core.message import LocalTransactionState, Message
from ..core.sending import HandleState, ManyHandleState
from .rules import check_lengths, purge


def _model() -> Any:
    from .models import TransactionLogEntry  # the app registry must be ready: imported when first used

    return TransactionLogEntry


class TransactionLog(TransactionLogRules):
    """The ``txmq_transaction_log`` table of the database ``using`` (an alias of ``DATABASES``), and the check-back
    that reads it. ``local_transaction_max_seconds`` bounds how long a local transaction of yours may run: a check
    fences one only when it is older (set it above your slowest, and record early in the transaction).
    ``lock_timeout_seconds`` bounds a fence's wait on a row a running local transaction holds. What it decides without
    the database (the handles open in this process among them, one registry with the SQLAlchemy log's) is
    ``TransactionLogRules``."""

    _LOCK_ERRORS = (OperationalError,)
    _logger = logging.getLogger(__name__)

    def __init__(
        self,
        *,
        using: str = DEFAULT_DB_ALIAS,
        local_transaction_max_seconds: float = 60.0,
        lock_timeout_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(local_transaction_max_seconds, lock_timeout_seconds, clock)
        self.using = using

    def record(
        self, transaction_or_id: HandleState | ManyHandleState | Message | str, *, topic: str | None = None
    ) -> None:
        """Mark the local transaction committed: call it inside that transaction's ``transaction.atomic()`` (on
        ``using``), early. The row commits or rolls back with the service's own data.

        Committed means the outermost transaction committed: when the block is nested (``ATOMIC_REQUESTS``, a
        caller's ``atomic()``), the handle (or the listener's send) ends the transaction when that outer
        transaction commits (Django's ``on_commit``), not when the block is left; if it rolls back, the
        check-back rolls the message back. A bare transaction id is not followed so: pass the handle or message.

        ``transaction_or_id`` is a transaction handle (``tx``, of one message or of several), the message a listener
        received, or a transaction id. A handle is registered for this process while its block is open: a check-back
        meanwhile answers UNKNOWN instead of fencing a slow local transaction. Raises ``django.db.IntegrityError`` when
        a check already fenced the transaction (it was taken for rolled back): the atomic block then rolls back, and the
        handle with it. Raises [`ConfigurationError`][redis_txmq.core.errors.ConfigurationError] outside an atomic
        block: the row would commit on its own."""
        transaction_id, topic = self._identify(transaction_or_id, topic)
        connection = transaction.get_connection(self.using)
        if not connection.in_atomic_block:
            raise ConfigurationError(
                f"transaction log, topic {topic!r}, tx={transaction_id}: record() must run inside the local "
                f"transaction (`with transaction.atomic(using={self.using!r}):`), or the row commits without it"
            )
        values = self._committed_values(transaction_id, topic)
        _model().objects.using(self.using).create(recorded_at=timezone.now(), **values)
        if not isinstance(transaction_or_id, str):
            owner = transaction_or_id if isinstance(transaction_or_id, (HandleState, ManyHandleState)) else None
            watch_row(transaction_id, AtomicBlockWatch(connection, self.using), owner)

    def check(self, message: Message) -> LocalTransactionState:
        """Answer a check-back from the log; see the module's description of the rules."""
        transaction_id = self._transaction_id(message)
        connection = connections[self.using]
        if connection.in_atomic_block:
            raise ConfigurationError(
                f"topic {message.topic!r}, tx={transaction_id}: a check-back must run in its own database "
                "transaction, not inside an atomic block of this thread"
            )
        connection.close_if_unusable_or_obsolete()
        try:
            return run(self._check_steps(transaction_id, message), partial(self._perform, connection))
        finally:
            connection.close_if_unusable_or_obsolete()

    async def acheck(self, message: Message) -> LocalTransactionState:
        """[`check`][redis_txmq.django.transaction_log.TransactionLog.check] from async code: on a thread of its own (a
        fence may wait for a lock; the database work of one check stays on one thread)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.check, thread_sensitive=False)(message)

    def checker(self) -> Callable[[Message], LocalTransactionState]:
        """The sync producer's ``checker=`` (or a listener's ``check_local_transaction``)."""
        return self.check

    def async_checker(self) -> Callable[[Message], Awaitable[LocalTransactionState]]:
        """The asyncio producer's ``checker=``."""
        return self.acheck

    def purge(self, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete the rows recorded more than ``older_than`` ago; returns how many. Keep ``older_than`` above the
        checker's ``max_age`` (72 h by default; 7 days is a safe choice): a check-back of a transaction whose row
        is gone fences it. Rows go in batches of at most ``batch_size``, each in a transaction of its own."""
        return purge(_model(), "recorded_at", self.using, older_than, batch_size)

    def _perform(self, connection: Any, effect: Any) -> Any:
        """An effect of ``_check_steps`` on this thread's connection."""
        if isinstance(effect, StateOf):
            state = _model().objects.using(self.using).filter(pk=effect.transaction_id).values_list("state", flat=True)
            return None if (found := state.first()) is None else str(found)
        return self._fence(connection, {**effect.values, "recorded_at": timezone.now()})

    def _fence(self, connection: Any, fence: dict[str, Any]) -> str:
        """Write the ROLLBACK row unless the key is taken, in a transaction of its own; the row's state then."""
        model = _model()
        session_limit = session_lock_timeout(connection.vendor, self.lock_timeout_seconds)
        previous = None
        if session_limit is not None:
            with connection.cursor() as cursor:
                cursor.execute(SESSION_LOCK_TIMEOUT_READ)
                previous = cursor.fetchone()[0]
                cursor.execute(session_limit)
        try:
            with transaction.atomic(using=self.using):
                if (limit := transaction_lock_timeout(connection.vendor, self.lock_timeout_seconds)) is not None:
                    with connection.cursor() as cursor:
                        cursor.execute(limit)
                rows = model.objects.using(self.using)
                if connection.features.supports_ignore_conflicts:
                    rows.bulk_create([model(**fence)], ignore_conflicts=True)
                else:
                    try:
                        with transaction.atomic(using=self.using):
                            rows.create(**fence)
                    except IntegrityError:
                        pass
                return str(rows.filter(pk=fence["transaction_id"]).values_list("state", flat=True).get())
        finally:
            if previous is not None:
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(session_lock_timeout_restore(previous))
                except DatabaseError:
                    connection.close()  # never back to the thread's use with the fence's bound

    def _check_lengths(self, values: dict[str, Any], what: str) -> None:
        check_lengths(_model(), values, what)


class AtomicBlockWatch:
    """A log row written in a Django atomic block. Django runs an ``on_commit`` callback after the outermost
    transaction commits and drops it when the savepoint or transaction it was registered in rolls back: a callback
    that ran means committed, one still registered means pending. One gone is rolled back, unless a commit's hooks
    are running or were cut short (an earlier hook raised: Django's ``run_commit_hooks_on_set_autocommit_on`` stays
    set until they all ran) or the connection was closed (a failed commit may have been applied): in doubt then."""

    def __init__(self, connection: Any, using: str) -> None:
        self._connection = connection  # the recording thread's: read, never used, from the thread that ends
        self._committed = False
        self._then: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._callback = self._on_commit
        transaction.on_commit(self._callback, using=using, robust=True)

    def _on_commit(self) -> None:
        with self._lock:
            self._committed = True
            then, self._then = self._then, []
        for call in then:
            call()

    def state(self) -> RowState:
        with self._lock:
            if self._committed:
                return RowState.COMMITTED
        connection = self._connection
        if any(entry[1] is self._callback for entry in list(connection.run_on_commit)):
            return RowState.PENDING
        if connection.run_commit_hooks_on_set_autocommit_on or connection.connection is None:
            return RowState.IN_DOUBT
        with self._lock:  # its commit's hooks may have just finished on another thread
            if self._committed:
                return RowState.COMMITTED
        return RowState.ROLLED_BACK

    def when_committed(self, then: Callable[[], None]) -> bool:
        with self._lock:
            if not self._committed:
                self._then.append(then)
                return True
        then()
        return True
