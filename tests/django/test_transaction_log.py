"""The Django transaction log answers check-backs from the Django database as the SQLAlchemy log does: COMMIT for a
committed local transaction, UNKNOWN while one may still run, ROLLBACK (behind a fence row) once it cannot commit any
more — on SQLite, PostgreSQL and MariaDB, from a thread and from async code, and end to end through a producer and the
checker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.core.errors import ConfigurationError
from redis_txmq.core.keys import TopicKeys
from redis_txmq.django import TransactionLog
from redis_txmq.django.models import TransactionLogEntry

from ..helpers import wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
CHECK_NOW = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)
KEYS = TopicKeys("orders")


def a_check(transaction_id: str, age: float | None) -> Message:
    """The message a check-back hands the checker: the transaction id, and when its half message was written."""
    message = Message("orders", b"{}", transaction_id=transaction_id)
    message.prepared_at = None if age is None else time.time() - age
    return message


def log_on(alias: str) -> TransactionLog:
    return TransactionLog(using=alias, local_transaction_max_seconds=30, lock_timeout_seconds=2)


def state_of(alias: str, transaction_id: str) -> str | None:
    return TransactionLogEntry.objects.using(alias).filter(pk=transaction_id).values_list("state", flat=True).first()


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``work`` on a thread of its own (its own Django connections, closed after), started; its result in the list."""
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(work())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, results


def test_a_committed_local_transaction_is_committed(django_database: str) -> None:
    log = log_on(django_database)
    with transaction.atomic(using=django_database):
        log.record("tx-committed", topic="orders")
    assert log.check(a_check("tx-committed", age=0)) is COMMIT


def test_no_row_while_young_is_unknown_and_writes_nothing(django_database: str) -> None:
    assert log_on(django_database).check(a_check("tx-young", age=1)) is UNKNOWN
    assert state_of(django_database, "tx-young") is None


def test_no_row_when_old_is_fenced_and_the_late_local_transaction_cannot_commit(django_database: str) -> None:
    log = log_on(django_database)
    assert log.check(a_check("tx-old", age=31)) is ROLLBACK
    assert state_of(django_database, "tx-old") == "ROLLBACK"
    with pytest.raises(IntegrityError), transaction.atomic(using=django_database):
        log.record("tx-old", topic="orders")
    assert log.check(a_check("tx-old", age=0)) is ROLLBACK, "asked again: the same answer"


def test_a_check_without_the_half_message_time_is_decided_by_the_fence(django_database: str) -> None:
    log = log_on(django_database)
    with transaction.atomic(using=django_database):
        log.record("tx-known", topic="orders")
    assert log.check(a_check("tx-known", age=None)) is COMMIT
    assert log.check(a_check("tx-unknown", age=None)) is ROLLBACK


def test_a_fence_waits_for_a_local_transaction_holding_its_row_and_then_answers_commit(django_database: str) -> None:
    """The local transaction wrote its row but has not committed when the check comes (its half is old): the fence
    waits on the row instead of taking the key, and finds the commit."""
    log = log_on(django_database)
    with transaction.atomic(using=django_database):
        log.record("tx-racing", topic="orders")
        checking, answers = in_thread(lambda: log.check(a_check("tx-racing", age=31)))
        time.sleep(0.3)  # the check reaches the fence's insert and waits on the row (a wait, not a condition)
    checking.join(timeout=10)
    assert answers == [COMMIT]


def test_a_local_transaction_holding_its_row_past_the_lock_timeout_is_unknown(django_database: str) -> None:
    """The fence gives up after ``lock_timeout_seconds`` (2 s; on SQLite the database's busy timeout, 2 s here), far
    below MariaDB's own 50 s; then the rolled-back transaction is fenced."""
    log = log_on(django_database)
    with transaction.atomic(using=django_database):
        log.record("tx-holding", topic="orders")
        started = time.monotonic()
        checking, answers = in_thread(lambda: log.check(a_check("tx-holding", age=31)))
        checking.join(timeout=30)
        waited = time.monotonic() - started
        transaction.set_rollback(True, using=django_database)
    assert answers == [UNKNOWN] and waited < 10
    assert log.check(a_check("tx-holding", age=31)) is ROLLBACK, "rolled back: fenced now"


def test_a_fence_on_mysql_leaves_the_sessions_lock_wait_timeout_as_it_was(django_database: str) -> None:
    if django_database != "mariadb":
        pytest.skip("MySQL / MariaDB only: elsewhere the bound is the fence transaction's")
    connection = connections[django_database]
    previous_max_age = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = None  # a persistent connection: the one the check uses stays
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 37")  # the service's own choice
        assert log_on(django_database).check(a_check("tx-fenced", age=31)) is ROLLBACK
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
            assert cursor.fetchone()[0] == 37
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = previous_max_age


def test_record_outside_an_atomic_block_and_a_check_inside_one_are_refused(django_database: str) -> None:
    log = log_on(django_database)
    with pytest.raises(ConfigurationError, match="inside the local transaction"):
        log.record("tx-alone", topic="orders")
    assert state_of(django_database, "tx-alone") is None
    with transaction.atomic(using=django_database), pytest.raises(ConfigurationError, match="its own database"):
        log.check(a_check("tx-alone", age=31))
    with pytest.raises(ValueError, match="record the message the listener received"):
        log.record(Message("orders", b"{}"))


def test_transaction_ids_differing_in_case_are_two_transactions(django_database: str) -> None:
    """On MariaDB a VARCHAR key takes the server's case-insensitive collation: the fence of ``tx-case`` would find
    the row of ``tx-Case`` and answer COMMIT."""
    log = log_on(django_database)
    with transaction.atomic(using=django_database):
        log.record("tx-Case", topic="orders")
    assert log.check(a_check("tx-case", age=None)) is ROLLBACK
    assert log.check(a_check("tx-Case", age=None)) is COMMIT
    assert log.check(a_check("tx-Case ", age=None)) is ROLLBACK, "a trailing space makes another id"
    assert state_of(django_database, "tx-case") == "ROLLBACK" and state_of(django_database, "tx-Case") == "COMMIT"


def test_an_over_long_transaction_id_is_refused_not_truncated(django_database: str) -> None:
    log = log_on(django_database)
    shared = "tx-" + "x" * 61  # the column's 64 characters
    with transaction.atomic(using=django_database):
        log.record(shared, topic="orders")
    with pytest.raises(ConfigurationError, match="transaction_id"):
        log.check(a_check(shared + "-other", age=None))
    with pytest.raises(ConfigurationError, match="transaction_id"), transaction.atomic(using=django_database):
        log.record(Message("orders", b"{}", transaction_id=shared + "-other"))
    assert list(TransactionLogEntry.objects.using(django_database).values_list("pk", "state")) == [(shared, "COMMIT")]


def test_purge_keeps_the_window_and_deletes_in_batches(django_database: str) -> None:
    log = log_on(django_database)
    two_hours_ago = timezone.now() - timedelta(hours=2)
    TransactionLogEntry.objects.using(django_database).bulk_create(
        TransactionLogEntry(transaction_id=f"tx-old-{i:04d}", topic="orders", state="COMMIT", recorded_at=two_hours_ago)
        for i in range(1200)
    )
    with transaction.atomic(using=django_database):
        log.record("tx-new", topic="orders")
    deletes: list[int] = []
    real_delete = TransactionLogEntry.objects.none().__class__.delete

    def counted_delete(queryset: Any) -> Any:
        result = real_delete(queryset)
        deletes.append(result[0])
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionLogEntry.objects.none().__class__, "delete", counted_delete)
        assert log.purge(timedelta(hours=1), batch_size=500) == 1200
    assert deletes == [500, 500, 200]
    assert state_of(django_database, "tx-new") == "COMMIT"
    assert log.purge(timedelta(0)) == 1
    with pytest.raises(ValueError, match="negative"):
        log.purge(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="batch_size"):
        log.purge(timedelta(hours=1), batch_size=0)


def test_the_async_checker_answers_on_a_thread_of_its_own(django_database: str) -> None:
    log = log_on(django_database)
    with transaction.atomic(using=django_database):
        log.record("tx-async", topic="orders")

    async def answers() -> list[LocalTransactionState]:
        check = log.async_checker()
        assert asyncio.iscoroutinefunction(check)
        return [
            await check(a_check("tx-async", age=0)),
            await check(a_check("tx-async-young", age=0)),
            await check(a_check("tx-async-old", age=60)),
        ]

    assert asyncio.run(answers()) == [COMMIT, UNKNOWN, ROLLBACK]
    assert state_of(django_database, "tx-async-old") == "ROLLBACK"


# End to end: a producer whose check-backs are answered by the log.


def test_handles_with_the_log_end_to_end(django_database: str, real_client: Any, redis_url: str) -> None:
    """Three transactions through handles, the log written in each local transaction: the first commits normally;
    the second's block is interrupted after its database commit (its row committed: the handle commits); the
    third's before its database commit (its row rolled back with it: the handle rolls back). A fourth, recorded by
    its transaction id (not followed), is interrupted after its commit and left to the check-back, which finds the
    row: COMMIT. The topic ends with the first, second and fourth, each once, and nothing in flight."""
    log = log_on(django_database)
    handles: list[Any] = []  # alive, as in a process that goes on: the log knows their blocks ended
    with TransactionProducer("order_group", checker=log.checker(), redis_url=redis_url, settings=CHECK_NOW) as p:

        def place(
            body: bytes,
            *,
            interrupt_after_commit: bool = False,
            interrupt_before_commit: bool = False,
            by_id: bool = False,
        ) -> Any:
            tx = p.transaction(Message("orders", body))
            handles.append(tx)
            with tx:
                with transaction.atomic(using=django_database):
                    log.record(tx.transaction_id if by_id else tx)
                    if interrupt_before_commit:
                        raise KeyboardInterrupt
                if interrupt_after_commit:
                    raise KeyboardInterrupt
            return tx

        place(b"1")
        with pytest.raises(KeyboardInterrupt):
            place(b"2", interrupt_after_commit=True)
        with pytest.raises(KeyboardInterrupt):
            place(b"3", interrupt_before_commit=True)
        assert real_client.hlen(KEYS.inflight) == 0, "the handles knew where their rows stood"
        with pytest.raises(KeyboardInterrupt):
            place(b"4", interrupt_after_commit=True, by_id=True)
        first, second, third, fourth = handles
        assert real_client.hlen(KEYS.inflight) == 1, "the one recorded by its id is left to the check-back"

        checker = Checker(real_client, CHECK_NOW)
        wait_until(lambda: checker.run_round() is not None and real_client.hlen(KEYS.inflight) == 0, timeout=20)
    published = [fields[b"transaction_id"].decode() for _, fields in real_client.xrange(KEYS.topic_stream)]
    assert sorted(published) == sorted([first.transaction_id, second.transaction_id, fourth.transaction_id])
    assert third.result.local_transaction_state is ROLLBACK and state_of(django_database, third.transaction_id) is None


def test_a_transaction_of_several_messages_open_in_this_process_is_not_fenced(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    log = log_on(django_database)
    with TransactionProducer("order_group", checker=log.checker(), redis_url=redis_url) as p:
        with p.transaction() as tx, transaction.atomic(using=django_database):
            log.record(tx)
            tx.send(Message("orders", b"1"))
            tx.send(Message("invoices", b"2"))
            slow = a_check(tx.transaction_id, age=3600)  # older than local_transaction_max_seconds
            checking, answers = in_thread(lambda: log_on(django_database).check(slow))
            checking.join(timeout=10)
            assert answers == [UNKNOWN], "its block is open here"
    assert state_of(django_database, tx.transaction_id) == "COMMIT"
    assert [r.local_transaction_state for r in tx.results] == [COMMIT, COMMIT]
