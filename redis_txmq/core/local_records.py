"""The transaction log and the inbox without a database: what the SQLAlchemy ones
([`redis_txmq.sqlalchemy`][redis_txmq.sqlalchemy]) and the Django ones ([`redis_txmq.django`][redis_txmq.django]) decide
alike, written once and importing neither library.

- which transactions are open in this process: **one registry for the process**, whichever log (SQLAlchemy's or
  Django's, whichever object) recorded the handle, so that a service recording with one log and answering
  check-backs with another still answers UNKNOWN for a block that is open here;
- a check-back as steps (``TransactionLogRules._check_steps``): the effects ``StateOf`` (read the log's row)
  and ``Fence`` (write the ROLLBACK row unless the key is taken, then read the row), which each side performs on its
  database, sync or asyncio, and the answer from what they return;
- a purge in batches as steps (``purge_steps``): ``OldKeys`` (read the keys of a batch of old rows) and
  ``DeleteOld`` (delete those rows in a transaction of their own), until a batch comes back short;
- the inbox's row for a message (``InboxRules._values``), the column lengths and the refusal of a longer value,
  and the statements bounding a fence's lock waits per database.

Steps are generators run by ``redis_txmq.core.consuming.Driver`` (``run``, ``run_async``): a failure of an effect is
thrown back into them, and they decide what it means (a fence that waited too long is UNKNOWN).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

from .consuming import Driver
from .entries import ConsumedMessage
from .errors import ConfigurationError
from .message import LocalTransactionState, Message
from .sending import HandleState, ManyHandleState

T = TypeVar("T")
Steps = Generator[Any, Any, T]
"""Steps yielding the effects of this module (``StateOf``, ``Fence``, ``OldKeys``,
``DeleteOld``) and returning a ``T``."""

COMMIT = LocalTransactionState.COMMIT
ROLLBACK = LocalTransactionState.ROLLBACK
UNKNOWN = LocalTransactionState.UNKNOWN

TRANSACTION_ID_LENGTH = 64
TOPIC_LENGTH = 255
STATE_LENGTH = 8
CONSUMER_GROUP_LENGTH = 127
MESSAGE_ID_LENGTH = 255
"""The columns' lengths, the same in both tables' definitions (SQLAlchemy's and Django's migrations)."""

PURGE_BATCH_SIZE = 500
"""Rows a purge deletes per statement and per transaction: what a concurrent writer may wait for, at most."""

MYSQL_FAMILY = ("mysql", "mariadb")
"""SQLAlchemy's dialect names and Django's vendor name of MySQL and MariaDB."""

_OPEN_HANDLES: weakref.WeakValueDictionary[str, HandleState | ManyHandleState] = weakref.WeakValueDictionary()
"""Transaction id -> the handle a log's ``record`` was given, while the handle lives: one registry for the process,
so that every log answers UNKNOWN for a transaction whose block is open here, whichever log object (of SQLAlchemy or
of Django) recorded it (the producer's ``checker=`` is often built from another one than the request handlers use)."""
_OPEN_HANDLES_LOCK = threading.Lock()
"""Check-backs run on the producer's check threads while request handlers record."""


def remember_open(transaction_id: str, handle: HandleState | ManyHandleState) -> None:
    with _OPEN_HANDLES_LOCK:
        _OPEN_HANDLES[transaction_id] = handle


def open_handle(transaction_id: str) -> HandleState | ManyHandleState | None:
    with _OPEN_HANDLES_LOCK:
        return _OPEN_HANDLES.get(transaction_id)


def check_lengths(values: dict[str, Any], length_of: Callable[[str], int | None], table: str, what: str) -> None:
    """Refuse a value longer than its column holds (``length_of(name)``, None for no bound), on every database:
    PostgreSQL would raise, SQLite store it whole, and MySQL's ``INSERT IGNORE`` (a fence) truncate it silently, so
    that two keys sharing a prefix would share a row."""
    for name, value in values.items():
        length = length_of(name)
        if isinstance(value, str) and length is not None and len(value) > length:
            raise ConfigurationError(
                f"{what}: {name} {value[:40]!r}... is {len(value)} characters, more than the {length} that "
                f"{table}.{name} holds; refused rather than truncated: use a shorter {name}"
            )


def transaction_lock_timeout(dialect: str, seconds: float) -> str | None:
    """PostgreSQL: bound the fence's lock waits for its own transaction. SQLite waits its own busy timeout; MySQL /
    MariaDB have no such setting per transaction: see ``session_lock_timeout``."""
    if dialect == "postgresql":
        return f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'"
    return None


SESSION_LOCK_TIMEOUT_READ = "SELECT @@SESSION.innodb_lock_wait_timeout"


def session_lock_timeout(dialect: str, seconds: float) -> str | None:
    """MySQL / MariaDB: the statement bounding the connection's lock waits (``innodb_lock_wait_timeout``, whole
    seconds, at least 1; the server's default is 50). It lasts for the session: read the value before with
    ``SESSION_LOCK_TIMEOUT_READ`` and set it back after the fence (``session_lock_timeout_restore``): the connection
    goes back to a pool, or to the thread's other work."""
    if dialect in MYSQL_FAMILY:
        return f"SET SESSION innodb_lock_wait_timeout = {max(1, math.ceil(seconds))}"
    return None


def session_lock_timeout_restore(previous: Any) -> str:
    return f"SET SESSION innodb_lock_wait_timeout = {int(previous)}"


def run(steps: Steps[T], perform: Callable[[Any], Any]) -> T:
    """Run ``steps``, each effect performed by ``perform(effect)``; what it raises is thrown into the steps."""
    with Driver(steps) as driver:
        for effect in driver:
            with driver.outcome():
                driver.reply = perform(effect)
    return driver.result


async def run_async(steps: Steps[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """``run`` with ``await perform(effect)``."""
    with Driver(steps) as driver:
        for effect in driver:
            with driver.outcome():
                driver.reply = await perform(effect)
    return driver.result


@dataclass(frozen=True, slots=True)
class StateOf:
    """Read the state of the log's row of ``transaction_id``; the reply is that state, None when there is no row."""

    transaction_id: str


@dataclass(frozen=True, slots=True)
class Fence:
    """Write the ROLLBACK row ``values`` (add the time it is written) unless its key is taken, in a transaction of
    its own whose lock waits are bounded (``transaction_lock_timeout``, ``session_lock_timeout``); the reply is the
    state of the row then. A lock wait that runs out raises the database's error."""

    values: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OldKeys:
    """Read the keys of at most ``batch_size`` rows older than the purge's cutoff, oldest first (no locks); the
    reply is the list of them."""


@dataclass(frozen=True, slots=True)
class DeleteOld:
    """Delete the rows of ``keys`` still older than the cutoff (a key written again since is kept), in a short
    transaction of their own; the reply is how many rows went."""

    keys: list[Any]


def check_purge(older_than: timedelta, batch_size: int) -> None:
    if older_than < timedelta(0):
        raise ConfigurationError(f"purge: older_than must not be negative, got {older_than}")
    if batch_size < 1:
        raise ConfigurationError(f"purge: batch_size must be at least 1, got {batch_size}")


def purge_steps(batch_size: int) -> Steps[int]:
    """A purge in batches, each read then deleted by key in a transaction of its own, so that a concurrent writer
    waits for one batch at most (one large ``DELETE ... WHERE recorded_at < ...`` at MySQL's REPEATABLE READ locks
    the range it scans); returns how many rows went. It ends after a short batch, or one that deleted nothing
    (another purge took the rows, or the keys do not match back: stop rather than loop)."""
    deleted = 0
    while True:
        keys = yield OldKeys()
        removed = (yield DeleteOld(keys)) if keys else 0
        deleted += removed
        if len(keys) < batch_size or removed == 0:
            return deleted


class TransactionLogRules:
    """What a transaction log decides without its database; the SQLAlchemy and Django logs subclass it, perform
    the effects of ``_check_steps`` and say which columns hold how much (``_check_lengths``)."""

    _LOCK_ERRORS: ClassVar[tuple[type[Exception], ...]] = ()
    """The database library's errors of a lock wait that ran out (a fence then answers UNKNOWN)."""
    _logger: ClassVar[logging.Logger] = logging.getLogger(__name__)

    def __init__(
        self, local_transaction_max_seconds: float, lock_timeout_seconds: float, clock: Callable[[], float]
    ) -> None:
        if local_transaction_max_seconds < 0 or lock_timeout_seconds <= 0:
            raise ConfigurationError(
                "transaction log: local_transaction_max_seconds must be >= 0 and lock_timeout_seconds > 0, got "
                f"{local_transaction_max_seconds} and {lock_timeout_seconds}"
            )
        self.local_transaction_max_seconds = local_transaction_max_seconds
        self.lock_timeout_seconds = lock_timeout_seconds
        self._clock = clock

    def _check_lengths(self, values: dict[str, Any], what: str) -> None:
        raise NotImplementedError

    def _identify(
        self, transaction: HandleState | ManyHandleState | Message | str, topic: str | None
    ) -> tuple[str, str | None]:
        """The transaction id and topic a ``record`` is of; a handle is registered as open in this process (for
        every log here) while it lives."""
        if isinstance(transaction, HandleState):
            remember_open(transaction.transaction_id, transaction)
            return transaction.transaction_id, topic or transaction.message.topic
        if isinstance(transaction, ManyHandleState):
            remember_open(transaction.transaction_id, transaction)
            return transaction.transaction_id, topic
        if isinstance(transaction, Message):
            if not transaction.transaction_id:
                raise ConfigurationError(
                    f"topic {transaction.topic!r}: this message has no transaction id; record the message the "
                    "listener received (or the transaction handle), not the one passed to the send"
                )
            return transaction.transaction_id, topic or transaction.topic
        if isinstance(transaction, str) and transaction:
            return transaction, topic
        raise ConfigurationError(
            f"record() takes a transaction handle, a Message or a transaction id, got {transaction!r}"
        )

    def _committed_values(self, transaction_id: str, topic: str | None) -> dict[str, Any]:
        """The row ``record`` writes (without its time), its lengths checked."""
        values = {"transaction_id": transaction_id, "topic": topic, "state": COMMIT.value}
        self._check_lengths(values, f"transaction log, topic {topic!r}")
        return values

    def _transaction_id(self, message: Message) -> str:
        """The transaction a check-back asks about, refused when it could not have a row of its own."""
        if not message.transaction_id:
            raise ConfigurationError(f"topic {message.topic!r}: a check-back message carries a transaction id")
        self._check_lengths(self._fence_values(message), f"transaction log, topic {message.topic!r}")
        return message.transaction_id

    @staticmethod
    def _fence_values(message: Message) -> dict[str, Any]:
        """The fence's row, without the time it is written."""
        return {"transaction_id": message.transaction_id, "topic": message.topic, "state": ROLLBACK.value}

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
                self._logger.debug(
                    "tx=%s topic=%s no log row yet, %.1f s old: UNKNOWN", transaction_id, message.topic, age
                )
                return UNKNOWN
        return None

    def _check_steps(self, transaction_id: str, message: Message) -> Steps[LocalTransactionState]:
        """A check-back of ``message`` (``transaction_id``, from ``_transaction_id``): the row's answer, or
        UNKNOWN while the local transaction may run, or else what the row says once a fence was written."""
        decided = self.decide(transaction_id, (yield StateOf(transaction_id)), message)
        if decided is not None:
            return decided
        try:
            answer = LocalTransactionState((yield Fence(self._fence_values(message))))
        except self._LOCK_ERRORS as exc:
            self._logger.warning(
                "tx=%s topic=%s the local transaction still holds its log row (%s): UNKNOWN, asked again later",
                message.transaction_id,
                message.topic,
                exc.__class__.__name__,
            )
            return UNKNOWN
        if answer is ROLLBACK:
            self._logger.info("tx=%s topic=%s no log row: fenced, ROLLBACK", message.transaction_id, message.topic)
        return answer


class InboxRules:
    """What an inbox decides without its database; the SQLAlchemy and Django inboxes subclass it."""

    _logger: ClassVar[logging.Logger] = logging.getLogger(__name__)

    def _check_lengths(self, values: dict[str, Any], what: str) -> None:
        raise NotImplementedError

    def _values(self, consumer_group: str, message: ConsumedMessage) -> dict[str, Any]:
        """The row of ``message`` applied by ``consumer_group`` (without its time), its lengths checked: keyed by the
        message's transaction id, or by its stream entry for a message sent outside a transaction."""
        require_group(consumer_group)
        values = {
            "consumer_group": consumer_group,
            "message_id": message.transaction_id or f"{message.stream}/{message.id}",
            "topic": message.topic,
        }
        self._check_lengths(values, f"inbox, topic {message.topic!r}, tx={message.transaction_id}")
        return values

    def _claimed(self, claimed: bool, consumer_group: str, message: ConsumedMessage) -> bool:
        """``claimed``, said in the log when the message was applied already."""
        if not claimed:
            self._logger.info(
                "tx=%s topic=%s group=%s already applied: skipped (a redelivery)",
                message.transaction_id,
                message.topic,
                consumer_group,
            )
        return claimed


def require_group(consumer_group: str) -> None:
    if not consumer_group:
        raise ConfigurationError("inbox: consumer_group is required (the group whose effects are recorded)")
