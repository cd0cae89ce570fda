"""The transaction log on Django: one row per local transaction, written inside it, that answers check-backs.

The rules are those of :mod:`redis_txmq.sqlalchemy.transaction_log` (read its description for why they hold):

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
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.utils import timezone

from ..errors import ConfigurationError
from ..message import LocalTransactionState, Message
from ..sending import HandleState, ManyHandleState
from .rules import (
    PURGE_BATCH_SIZE,
    SESSION_LOCK_TIMEOUT_READ,
    check_lengths,
    check_purge,
    open_handle,
    remember_open,
    session_lock_timeout,
    session_lock_timeout_restore,
    transaction_lock_timeout,
)

logger = logging.getLogger(__name__)

COMMIT = LocalTransactionState.COMMIT
ROLLBACK = LocalTransactionState.ROLLBACK
UNKNOWN = LocalTransactionState.UNKNOWN


def _model() -> Any:
    from .models import TransactionLogEntry  # the app registry must be ready: imported when first used

    return TransactionLogEntry


class TransactionLog:
    """The ``txmq_transaction_log`` table of the database ``using`` (an alias of ``DATABASES``), and the check-back
    that reads it. ``local_transaction_max_seconds`` bounds how long a local transaction of yours may run: a check
    fences one only when it is older (set it above your slowest, and record early in the transaction).
    ``lock_timeout_seconds`` bounds a fence's wait on a row a running local transaction holds."""

    def __init__(
        self,
        *,
        using: str = DEFAULT_DB_ALIAS,
        local_transaction_max_seconds: float = 60.0,
        lock_timeout_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if local_transaction_max_seconds < 0 or lock_timeout_seconds <= 0:
            raise ConfigurationError(
                "transaction log: local_transaction_max_seconds must be >= 0 and lock_timeout_seconds > 0, got "
                f"{local_transaction_max_seconds} and {lock_timeout_seconds}"
            )
        self.using = using
        self.local_transaction_max_seconds = local_transaction_max_seconds
        self.lock_timeout_seconds = lock_timeout_seconds
        self._clock = clock

    def record(
        self, transaction_or_id: HandleState | ManyHandleState | Message | str, *, topic: str | None = None
    ) -> None:
        """Mark the local transaction committed: call it inside that transaction's ``transaction.atomic()`` (on
        ``using``), early. The row commits or rolls back with the service's own data.

        ``transaction_or_id`` is a transaction handle (``tx``, of one message or of several), the message a listener
        received, or a transaction id. A handle is registered for this process while its block is open: a
        check-back meanwhile answers UNKNOWN instead of fencing a slow local transaction. Raises
        ``django.db.IntegrityError`` when a check already fenced the transaction (it was taken for rolled back):
        the atomic block then rolls back, and the handle with it. Raises :class:`ConfigurationError` outside an
        atomic block: the row would commit on its own."""
        transaction_id, topic = self._identify(transaction_or_id, topic)
        if not transaction.get_connection(self.using).in_atomic_block:
            raise ConfigurationError(
                f"transaction log, topic {topic!r}, tx={transaction_id}: record() must run inside the local "
                f"transaction (`with transaction.atomic(using={self.using!r}):`), or the row commits without it"
            )
        values = {"transaction_id": transaction_id, "topic": topic, "state": COMMIT.value}
        check_lengths(_model(), values, f"transaction log, topic {topic!r}")
        _model().objects.using(self.using).create(recorded_at=timezone.now(), **values)

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
            state = self._state_of(transaction_id)
            decided = self.decide(transaction_id, state, message)
            if decided is not None:
                return decided
            try:
                state = self._fence(connection, message)
            except OperationalError as exc:
                return self._still_locked(message, exc)
            return self._fenced(message, state)
        finally:
            connection.close_if_unusable_or_obsolete()

    async def acheck(self, message: Message) -> LocalTransactionState:
        """:meth:`check` from async code: on a thread of its own (a fence may wait for a lock; the database work of
        one check stays on one thread)."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.check, thread_sensitive=False)(message)

    def checker(self) -> Callable[[Message], LocalTransactionState]:
        """The sync producer's ``checker=`` (or a listener's ``check_local_transaction``)."""
        return self.check

    def async_checker(self) -> Callable[[Message], Awaitable[LocalTransactionState]]:
        """The asyncio producer's ``checker=``."""
        return self.acheck

    def decide(self, transaction_id: str, state: str | None, message: Message) -> LocalTransactionState | None:
        """The answer the log's row (``state``, None when absent) gives, or None when only a fence can tell."""
        if state is not None:
            return LocalTransactionState(state)
        handle = open_handle(transaction_id)
        if handle is not None:
            return None if handle.ended else UNKNOWN  # open here: the local transaction is running
        if message.prepared_at is not None:
            age = self._clock() - message.prepared_at
            if age < self.local_transaction_max_seconds:
                logger.debug("tx=%s topic=%s no log row yet, %.1f s old: UNKNOWN", transaction_id, message.topic, age)
                return UNKNOWN
        return None

    def purge(self, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete the rows recorded more than ``older_than`` ago; returns how many. Keep ``older_than`` above the
        checker's ``max_age`` (72 h by default; 7 days is a safe choice): a check-back of a transaction whose row
        is gone fences it. Rows go in batches of at most ``batch_size``, each in a transaction of its own."""
        check_purge(older_than, batch_size)
        return _purge(_model(), "recorded_at", self.using, timezone.now() - older_than, batch_size)

    def _fence(self, connection: Any, message: Message) -> str:
        """Write the ROLLBACK row unless the key is taken, in a transaction of its own; the row's state then."""
        model, fence = _model(), self._fence_values(message)
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
                return str(rows.filter(pk=message.transaction_id).values_list("state", flat=True).get())
        finally:
            if previous is not None:
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(session_lock_timeout_restore(previous))
                except DatabaseError:
                    connection.close()  # never back to the thread's use with the fence's bound

    def _state_of(self, transaction_id: str) -> str | None:
        rows = _model().objects.using(self.using).filter(pk=transaction_id)
        state = rows.values_list("state", flat=True).first()
        return None if state is None else str(state)

    @staticmethod
    def _identify(
        transaction_or_id: HandleState | ManyHandleState | Message | str, topic: str | None
    ) -> tuple[str, str | None]:
        if isinstance(transaction_or_id, HandleState):
            remember_open(transaction_or_id.transaction_id, transaction_or_id)
            return transaction_or_id.transaction_id, topic or transaction_or_id.message.topic
        if isinstance(transaction_or_id, ManyHandleState):
            remember_open(transaction_or_id.transaction_id, transaction_or_id)
            return transaction_or_id.transaction_id, topic
        if isinstance(transaction_or_id, Message):
            if not transaction_or_id.transaction_id:
                raise ConfigurationError(
                    f"topic {transaction_or_id.topic!r}: this message has no transaction id; record the message the "
                    "listener received (or the transaction handle), not the one passed to the send"
                )
            return transaction_or_id.transaction_id, topic or transaction_or_id.topic
        if isinstance(transaction_or_id, str) and transaction_or_id:
            return transaction_or_id, topic
        raise ConfigurationError(
            f"record() takes a transaction handle, a Message or a transaction id, got {transaction_or_id!r}"
        )

    def _transaction_id(self, message: Message) -> str:
        if not message.transaction_id:
            raise ConfigurationError(f"topic {message.topic!r}: a check-back message carries a transaction id")
        values = self._fence_values(message)
        del values["recorded_at"]
        check_lengths(_model(), values, f"transaction log, topic {message.topic!r}")
        return message.transaction_id

    @staticmethod
    def _fence_values(message: Message) -> dict[str, Any]:
        return {
            "transaction_id": message.transaction_id,
            "topic": message.topic,
            "state": ROLLBACK.value,
            "recorded_at": timezone.now(),
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


def _purge(model: Any, time_field: str, using: str, cutoff: Any, batch_size: int) -> int:
    """Delete the rows of ``model`` whose ``time_field`` is before ``cutoff``, in batches: the keys of at most
    ``batch_size`` old rows read (no locks), then those rows deleted by key (still old: a key written again since is
    kept) in a short transaction of their own, until a batch comes back short or deletes nothing."""
    old = {f"{time_field}__lt": cutoff}
    deleted = 0
    while True:
        rows = model.objects.using(using)
        keys = list(rows.filter(**old).order_by(time_field).values_list("pk", flat=True)[:batch_size])
        removed = 0
        if keys:
            with transaction.atomic(using=using):
                removed, _ = rows.filter(pk__in=keys, **old).delete()
        deleted += removed
        if len(keys) < batch_size or removed == 0:
            return deleted
