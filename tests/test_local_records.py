"""The rules the SQLAlchemy and Django logs and inboxes share (``redis_txmq/core/local_records.py``), without a
database: the check-back's and the purge's steps driven by a fake database, the lock-wait statements, the length
refusal. The databases themselves are in tests/test_transaction_log.py, tests/test_inbox.py and tests/django/."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from redis_txmq import LocalTransactionState, Message
from redis_txmq.core.entries import ConsumedMessage
from redis_txmq.core.errors import ConfigurationError
from redis_txmq.core.local_records import (
    DeleteOld,
    Fence,
    InboxRules,
    OldKeys,
    StateOf,
    TransactionLogRules,
    check_lengths,
    check_purge,
    purge_steps,
    remember_open,
    run,
    session_lock_timeout,
    transaction_lock_timeout,
)

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN


class LockTimeout(Exception):
    """A lock wait that ran out, as a database library raises it."""


class Log(TransactionLogRules):
    _LOCK_ERRORS = (LockTimeout,)

    def _check_lengths(self, values: dict[str, Any], what: str) -> None:
        check_lengths(values, {"transaction_id": 64, "topic": 255, "state": 8}.get, "log", what)


class Table:
    """A fake log table: the rows, and the effects performed on it."""

    def __init__(self, rows: dict[str, str] | None = None, fence_error: Exception | None = None) -> None:
        self.rows = dict(rows or {})
        self.fence_error = fence_error
        self.effects: list[Any] = []

    def perform(self, effect: Any) -> Any:
        self.effects.append(effect)
        if isinstance(effect, StateOf):
            return self.rows.get(effect.transaction_id)
        assert isinstance(effect, Fence)
        if self.fence_error is not None:
            raise self.fence_error
        return self.rows.setdefault(effect.values["transaction_id"], effect.values["state"])


def check(log: Log, table: Table, message: Message) -> LocalTransactionState:
    return run(log._check_steps(log._transaction_id(message), message), table.perform)


def a_check(transaction_id: str, age: float | None) -> Message:
    message = Message("orders", b"{}", transaction_id=transaction_id)
    message.prepared_at = None if age is None else time.time() - age
    return message


def a_log() -> Log:
    return Log(local_transaction_max_seconds=30, lock_timeout_seconds=2, clock=time.time)


def test_a_row_answers_and_no_fence_is_written() -> None:
    table = Table({"tx-1": "COMMIT", "tx-2": "ROLLBACK"})
    assert check(a_log(), table, a_check("tx-1", age=3600)) is COMMIT
    assert check(a_log(), table, a_check("tx-2", age=3600)) is ROLLBACK
    assert not [effect for effect in table.effects if isinstance(effect, Fence)]


def test_no_row_while_young_is_unknown_and_when_old_is_fenced() -> None:
    table = Table()
    assert check(a_log(), table, a_check("tx-1", age=1)) is UNKNOWN
    assert table.rows == {}
    assert check(a_log(), table, a_check("tx-1", age=3600)) is ROLLBACK
    assert check(a_log(), table, a_check("tx-2", age=None)) is ROLLBACK
    assert table.rows == {"tx-1": "ROLLBACK", "tx-2": "ROLLBACK"}


def test_a_fence_that_finds_the_row_answers_it_and_one_that_waits_too_long_is_unknown() -> None:
    class Racing(Table):
        def perform(self, effect: Any) -> Any:
            if isinstance(effect, Fence):
                self.rows["tx-1"] = "COMMIT"  # the local transaction committed meanwhile
            return super().perform(effect)

    assert check(a_log(), Racing(), a_check("tx-1", age=3600)) is COMMIT
    assert check(a_log(), Table(fence_error=LockTimeout()), a_check("tx-1", age=3600)) is UNKNOWN
    with pytest.raises(ZeroDivisionError):  # not a lock wait: the database's error goes to the caller
        check(a_log(), Table(fence_error=ZeroDivisionError()), a_check("tx-1", age=3600))


def test_an_open_handle_is_unknown_for_every_log_until_it_ends() -> None:
    class Handle:
        ended = False

    handle = Handle()
    remember_open("tx-open", handle)  # type: ignore[arg-type]
    table = Table()
    assert check(a_log(), table, a_check("tx-open", age=3600)) is UNKNOWN
    assert check(a_log(), table, a_check("tx-open", age=3600)) is UNKNOWN, "another log object agrees"
    handle.ended = True
    assert check(a_log(), table, a_check("tx-open", age=3600)) is ROLLBACK


def test_record_and_check_refuse_what_has_no_row_of_its_own() -> None:
    log = a_log()
    with pytest.raises(ConfigurationError, match="record the message the listener received"):
        log._identify(Message("orders", b"{}"), None)
    with pytest.raises(ConfigurationError, match="transaction_id .* more than the 64"):
        log._committed_values(*log._identify("tx-" + "x" * 62, "orders"))
    with pytest.raises(ConfigurationError, match="carries a transaction id"):
        log._transaction_id(Message("orders", b"{}"))
    with pytest.raises(ConfigurationError, match="lock_timeout_seconds > 0"):
        Log(local_transaction_max_seconds=30, lock_timeout_seconds=0, clock=time.time)


def test_the_inbox_keys_a_message_by_its_transaction_or_its_entry() -> None:
    class Inbox(InboxRules):
        def _check_lengths(self, values: dict[str, Any], what: str) -> None:
            check_lengths(values, {"consumer_group": 127, "message_id": 255, "topic": 255}.get, "inbox", what)

    def consumed(transaction_id: str | None) -> ConsumedMessage:
        return ConsumedMessage(
            topic="orders", body=b"{}", stream="txmq:orders", id="1-0", transaction_id=transaction_id
        )

    assert Inbox()._values("billing", consumed("tx-1"))["message_id"] == "tx-1"
    assert Inbox()._values("billing", consumed(None))["message_id"] == "txmq:orders/1-0"
    with pytest.raises(ConfigurationError, match="consumer_group is required"):
        Inbox()._values("", consumed("tx-1"))
    with pytest.raises(ConfigurationError, match="consumer_group .* refused rather than truncated"):
        Inbox()._values("g" * 128, consumed("tx-1"))


def test_a_purge_goes_in_batches_until_one_is_short_or_deletes_nothing() -> None:
    def purge(rows: int, batch_size: int, taken_by_another: bool = False) -> tuple[int, list[Any]]:
        left, effects = list(range(rows)), []

        def perform(effect: Any) -> Any:
            effects.append(effect)
            if isinstance(effect, OldKeys):
                return left[:batch_size]
            assert isinstance(effect, DeleteOld)
            if taken_by_another:
                return 0
            del left[: len(effect.keys)]
            return len(effect.keys)

        return run(purge_steps(batch_size), perform), effects

    deleted, effects = purge(1200, 500)
    assert deleted == 1200 and [len(e.keys) for e in effects if isinstance(e, DeleteOld)] == [500, 500, 200]
    deleted, effects = purge(1000, 500)
    assert deleted == 1000 and effects[-1] == OldKeys(), "a full last batch: one more read finds nothing"
    assert purge(1200, 500, taken_by_another=True)[0] == 0, "stops rather than loops"
    with pytest.raises(ValueError, match="negative"):
        check_purge(timedelta(seconds=-1), 500)
    with pytest.raises(ValueError, match="batch_size"):
        check_purge(timedelta(hours=1), 0)


def test_lock_waits_are_bounded_per_database() -> None:
    assert transaction_lock_timeout("postgresql", 2.5) == "SET LOCAL lock_timeout = '2500ms'"
    assert transaction_lock_timeout("mysql", 2.5) is None and transaction_lock_timeout("sqlite", 2.5) is None
    assert session_lock_timeout("mysql", 2.5) == session_lock_timeout("mariadb", 2.5)
    assert session_lock_timeout("mariadb", 2.5) == "SET SESSION innodb_lock_wait_timeout = 3"
    assert session_lock_timeout("mariadb", 0.1) == "SET SESSION innodb_lock_wait_timeout = 1"
    assert session_lock_timeout("postgresql", 2.5) is None
