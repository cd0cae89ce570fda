"""The transaction log answers check-backs from the service's own database: COMMIT for a committed local transaction,
UNKNOWN while one may still run, ROLLBACK (behind a fence row) once it cannot commit any more — on SQLite,
PostgreSQL and MariaDB, sync and asyncio, and end to end through a producer, a lost end call and the checker."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, update
from sqlalchemy.exc import IntegrityError

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.checker import Checker
from redis_txmq.core.errors import ConfigurationError
from redis_txmq.core.keys import TopicKeys
from redis_txmq.sqlalchemy import TransactionLog

from .databases import Database, DeleteWatch, bound_lock_waits
from .helpers import wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
CHECK_NOW = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)
KEYS = TopicKeys("orders")


def a_check(transaction_id: str, age: float | None) -> Message:
    """The message a check-back hands the checker: the transaction id, and when its half message was written."""
    message = Message("orders", b"{}", transaction_id=transaction_id)
    message.prepared_at = None if age is None else time.time() - age
    return message


def state_of(db: Database, transaction_id: str) -> str | None:
    with db.engine.connect() as connection:
        table = db.log.table
        return connection.execute(
            select(table.c.state).where(table.c.transaction_id == transaction_id)
        ).scalar_one_or_none()


def old_rows(database: Database, count: int, prefix: str = "tx-old") -> None:
    """``count`` COMMIT rows recorded two hours ago."""
    two_hours_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    rows = [
        {"transaction_id": f"{prefix}-{i:06d}", "topic": "orders", "state": "COMMIT", "recorded_at": two_hours_ago}
        for i in range(count)
    ]
    with database.engine.begin() as connection:
        connection.execute(insert(database.log.table), rows)


def test_a_committed_local_transaction_is_committed(database: Database) -> None:
    with database.engine.begin() as connection:
        connection.execute(database.log.record("tx-committed", topic="orders"))
    assert database.log.check(database.engine, a_check("tx-committed", age=0)) is COMMIT


def test_no_row_while_young_is_unknown_and_writes_nothing(database: Database) -> None:
    assert database.log.check(database.engine, a_check("tx-young", age=1)) is UNKNOWN
    assert state_of(database, "tx-young") is None


def test_no_row_when_old_is_fenced_and_the_late_local_transaction_cannot_commit(database: Database) -> None:
    assert database.log.check(database.engine, a_check("tx-old", age=31)) is ROLLBACK
    assert state_of(database, "tx-old") == "ROLLBACK"
    with pytest.raises(IntegrityError), database.engine.begin() as connection:
        connection.execute(database.log.record("tx-old", topic="orders"))
    assert database.log.check(database.engine, a_check("tx-old", age=0)) is ROLLBACK, "asked again: same answer"


def test_a_check_without_the_half_message_time_is_decided_by_the_fence(database: Database) -> None:
    with database.engine.begin() as connection:
        connection.execute(database.log.record("tx-known", topic="orders"))
    assert database.log.check(database.engine, a_check("tx-known", age=None)) is COMMIT
    assert database.log.check(database.engine, a_check("tx-unknown", age=None)) is ROLLBACK


def test_a_fence_waits_for_a_local_transaction_holding_its_row_and_then_answers_commit(database: Database) -> None:
    """The local transaction wrote its row but has not committed when the check comes (its half is old): the fence
    waits on the row instead of taking the key, and finds the commit."""
    answers: list[LocalTransactionState] = []
    with database.engine.connect() as local:
        local.begin()
        local.execute(database.log.record("tx-racing", topic="orders"))
        checking = threading.Thread(
            target=lambda: answers.append(database.log.check(database.engine, a_check("tx-racing", age=31)))
        )
        checking.start()
        time.sleep(0.3)  # the check reaches the fence's insert and waits on the row (a wait, not a condition)
        local.commit()
    checking.join(timeout=10)
    assert answers == [COMMIT]


def test_a_local_transaction_holding_its_row_past_the_lock_timeout_is_unknown(database: Database) -> None:
    """The fence gives up after ``lock_timeout_seconds`` (2 s here), far below the servers' own bounds (MariaDB's
    ``innodb_lock_wait_timeout`` is 50 s): defect, MySQL / MariaDB ignored it. On MySQL / MariaDB the bound is the
    session's, set back once the fence is done: the connection goes back to the pool as it was."""
    checks = database.other_engine()
    with database.engine.connect() as local:
        local.begin()
        local.execute(database.log.record("tx-holding", topic="orders"))
        started = time.monotonic()
        answer = database.log.check(checks, a_check("tx-holding", age=31))
        waited = time.monotonic() - started
        local.rollback()
    assert answer is UNKNOWN and waited < 10
    assert database.log.check(database.engine, a_check("tx-holding", age=31)) is ROLLBACK, "rolled back: fenced now"
    checks.dispose()


def test_a_fence_on_mysql_leaves_the_sessions_lock_wait_timeout_as_it_was(database: Database) -> None:
    if database.name != "mariadb":
        pytest.skip("MySQL / MariaDB only: elsewhere the bound is the transaction's")
    from sqlalchemy import create_engine

    one_connection = create_engine(database.engine.url, pool_size=1, max_overflow=0)
    try:
        with one_connection.connect() as connection:
            connection.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 37")  # the service's own choice
        assert database.log.check(one_connection, a_check("tx-fenced", age=31)) is ROLLBACK
        with one_connection.connect() as connection:
            assert connection.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar_one() == 37
    finally:
        one_connection.dispose()


def test_async_check_and_purge(database: Database) -> None:
    async def scenario() -> None:
        engine = database.async_engine()
        try:
            async with engine.begin() as connection:
                await connection.execute(database.log.record("tx-async", topic="orders"))
            check = database.log.checker(engine)
            assert asyncio.iscoroutinefunction(check)
            assert await check(a_check("tx-async", age=0)) is COMMIT
            assert await check(a_check("tx-async-young", age=0)) is UNKNOWN
            assert await check(a_check("tx-async-old", age=60)) is ROLLBACK
            assert await database.log.purge_async(engine, timedelta(hours=1)) == 0
            assert await database.log.purge_async(engine, timedelta(0)) == 2
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert state_of(database, "tx-async") is None


def test_purge_keeps_rows_inside_the_window(database: Database) -> None:
    with database.engine.begin() as connection:
        connection.execute(database.log.record("tx-new", topic="orders"))
        connection.execute(database.log.record("tx-old", topic="orders"))
        table = database.log.table
        two_hours_ago = datetime.now(timezone.utc) - timedelta(hours=2)
        connection.execute(update(table).where(table.c.transaction_id == "tx-old").values(recorded_at=two_hours_ago))
    assert database.log.purge(database.engine, timedelta(hours=1)) == 1
    assert state_of(database, "tx-new") == "COMMIT" and state_of(database, "tx-old") is None
    with pytest.raises(ValueError, match="negative"):
        database.log.purge(database.engine, timedelta(seconds=-1))


def test_purge_deletes_in_batches_of_bounded_size(database: Database) -> None:
    """Defect: purge() was one DELETE of every old row, in one transaction (on MySQL / MariaDB at REPEATABLE READ
    that locks the range it scans, so writers waited for all of it)."""
    old_rows(database, 1200)
    with database.engine.begin() as connection:
        connection.execute(database.log.record("tx-new", topic="orders"))
    watch = DeleteWatch().watch(database.engine)
    assert database.log.purge(database.engine, timedelta(hours=1), batch_size=500) == 1200
    assert watch.per_statement and max(watch.per_statement) <= 500 and sum(watch.per_statement) == 1200
    assert max(watch.per_transaction) <= 500 and sum(watch.per_transaction) == 1200
    assert state_of(database, "tx-new") == "COMMIT"

    old_rows(database, 700, prefix="tx-older")

    async def purge_async() -> tuple[int, DeleteWatch]:
        engine = database.async_engine()
        try:
            async_watch = DeleteWatch().watch(engine.sync_engine)
            return await database.log.purge_async(engine, timedelta(hours=1), batch_size=300), async_watch
        finally:
            await engine.dispose()

    deleted, async_watch = asyncio.run(purge_async())
    assert deleted == 700 and max(async_watch.per_transaction) <= 300 and sum(async_watch.per_transaction) == 700
    assert state_of(database, "tx-new") == "COMMIT"
    with pytest.raises(ValueError, match="batch_size"):
        database.log.purge(database.engine, timedelta(hours=1), batch_size=0)


def test_a_record_completes_while_a_purge_of_many_rows_runs(database: Database) -> None:
    """Defect: on MariaDB a record() waited for a purge of 20,000 rows to commit (one DELETE locking the table), and
    failed at its lock timeout. Here the purge's first batch holds its locks until the record is done (on SQLite,
    one writer at a time, the record comes between batches), and the record may wait on a lock 1 s at most."""
    old_rows(database, 5000)
    purging, writing = database.other_engine(), database.other_engine()
    watch = DeleteWatch(hold=database.name != "sqlite").watch(purging)
    purged: list[int] = []
    purge = threading.Thread(target=lambda: purged.append(database.log.purge(purging, timedelta(hours=1))))
    purge.start()
    try:
        wait_until(lambda: watch.holding.is_set() or bool(watch.per_transaction), timeout=30)
        with writing.begin() as connection:
            bound_lock_waits(connection, 1)
            connection.execute(database.log.record("tx-during-purge", topic="orders"))
    finally:
        watch.release.set()
        purge.join(60)
        purging.dispose()
        writing.dispose()
    assert purged == [5000]
    assert state_of(database, "tx-during-purge") == "COMMIT"


def test_transaction_ids_differing_in_case_are_two_transactions(database: Database) -> None:
    """Defect: on MariaDB the key took the server's case-insensitive collation: the fence of ``tx-case`` found the
    row of ``tx-Case`` and answered COMMIT."""
    with database.engine.begin() as connection:
        connection.execute(database.log.record("tx-Case", topic="orders"))
    assert database.log.check(database.engine, a_check("tx-case", age=None)) is ROLLBACK
    assert database.log.check(database.engine, a_check("tx-Case", age=None)) is COMMIT
    assert state_of(database, "tx-case") == "ROLLBACK" and state_of(database, "tx-Case") == "COMMIT"


def test_an_over_long_transaction_id_is_refused_not_truncated(database: Database) -> None:
    """Defect: MariaDB's INSERT IGNORE truncated an over-long id: the fence of one transaction landed on another."""
    shared = "tx-" + "x" * 61  # the column's 64 characters
    with database.engine.begin() as connection:
        connection.execute(database.log.record(shared, topic="orders"))
    longer = a_check(shared + "-other", age=None)
    with pytest.raises(ConfigurationError, match="transaction_id"):
        database.log.check(database.engine, longer)
    with pytest.raises(ConfigurationError, match="transaction_id"):
        database.log.record(Message("orders", b"{}", transaction_id=shared + "-other"))
    assert state_of(database, shared) == "COMMIT"
    with database.engine.connect() as connection:
        assert len(connection.execute(select(database.log.table.c.transaction_id)).all()) == 1


def test_record_refuses_the_callers_message_without_a_transaction_id() -> None:
    log = TransactionLog(MetaData())
    with pytest.raises(ValueError, match="record the message the listener received"):
        log.record(Message("orders", b"{}"))


# End to end: a producer whose check-backs are answered by the log.

ORDERS_METADATA = MetaData()


def orders_table(metadata: MetaData) -> Table:
    return Table("orders", metadata, Column("id", Integer, primary_key=True), Column("transaction_id", String(64)))


def test_handles_with_the_log_end_to_end(database: Database, real_client: Any, redis_url: str) -> None:
    """Three orders through transaction handles, the log written in each local transaction: the first commits
    normally; the second's end call is lost after its database commit (the check-back finds the row: COMMIT); the
    third's process is interrupted before its database commit (the connection rolled its row back: the handle rolls
    back). The topic ends with the first two orders, each once, and nothing in flight."""
    orders = orders_table(database.metadata)
    orders.create(database.engine)
    log = database.log
    with TransactionProducer(
        "order_group", checker=log.checker(database.engine), redis_url=redis_url, settings=CHECK_NOW
    ) as producer:

        def place(order_id: int) -> Any:
            with producer.transaction(Message("orders", b"%d" % order_id)) as tx, database.engine.begin() as db:
                db.execute(log.record(tx))
                db.execute(insert(orders).values(id=order_id, transaction_id=tx.transaction_id))
            return tx

        first = place(1)
        real_run = producer.broker.runner.run

        def end_lost(script: Any, keys: Any, args: Any) -> Any:
            if script is producer.broker._end:
                raise redis.ConnectionError("connection lost before the end call reached Redis")
            return real_run(script, keys, args)

        producer.broker.runner.run = end_lost
        second = place(2)
        producer.broker.runner.run = real_run
        assert second.result.end_error and second.result.committed_id is None

        third = producer.transaction(Message("orders", b"3"))
        with pytest.raises(KeyboardInterrupt), third, database.engine.begin() as db:
            db.execute(log.record(third))
            raise KeyboardInterrupt  # interrupted before the database commit: left to the check-back

        checker = Checker(real_client, CHECK_NOW)
        wait_until(lambda: checker.run_round() is not None and real_client.hlen(KEYS.inflight) == 0, timeout=20)
    published = [fields[b"transaction_id"].decode() for _, fields in real_client.xrange(KEYS.topic_stream)]
    assert sorted(published) == sorted([first.transaction_id, second.transaction_id])
    assert third.result.local_transaction_state is ROLLBACK and state_of(database, third.transaction_id) is None


def test_asyncio_handles_with_the_log(database: Database, real_client: Any, redis_url: str) -> None:
    """The asyncio producer and an AsyncEngine: a committed order is published; an order whose block was cancelled
    after its database commit is published by the check-back, once."""
    orders = orders_table(database.metadata)
    orders.create(database.engine)

    async def scenario() -> None:
        engine = database.async_engine()
        log = database.log
        try:
            async with txmq_asyncio.TransactionProducer(
                "order_group", checker=log.checker(engine), redis_url=redis_url, settings=CHECK_NOW
            ) as producer:
                async with producer.transaction(Message("orders", b"1")) as tx, engine.begin() as db:
                    await db.execute(log.record(tx))
                    await db.execute(insert(orders).values(id=1, transaction_id=tx.transaction_id))
                cancelled = producer.transaction(Message("orders", b"2"))
                database_committed = asyncio.Event()

                async def cancelled_after_the_commit() -> None:
                    async with cancelled:
                        async with engine.begin() as db:
                            await db.execute(log.record(cancelled))
                            await db.execute(insert(orders).values(id=2, transaction_id=cancelled.transaction_id))
                        database_committed.set()
                        await asyncio.Event().wait()  # cancelled here, after the database commit

                task = asyncio.create_task(cancelled_after_the_commit())
                await database_committed.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                checker = Checker(real_client, CHECK_NOW)
                deadline = time.monotonic() + 20
                while real_client.hlen(KEYS.inflight) and time.monotonic() < deadline:
                    await asyncio.to_thread(checker.run_round)
                    await asyncio.sleep(0.05)
        finally:
            await engine.dispose()
        assert real_client.hlen(KEYS.inflight) == 0
        assert len(real_client.xrange(KEYS.topic_stream)) == 2

    asyncio.run(scenario())


def test_a_transaction_of_several_messages_open_in_this_process_is_not_fenced(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """Defect: record() refused the handle of a transaction of several messages, so a check-back of a slow one
    fenced it (ROLLBACK) while its block was still running."""
    with TransactionProducer("order_group", checker=database.log.checker(database.engine), redis_url=redis_url) as p:
        with p.transaction() as tx, database.engine.begin() as db:
            db.execute(database.log.record(tx))
            tx.send(Message("orders", b"1"))
            tx.send(Message("invoices", b"2"))
            slow = a_check(tx.transaction_id, age=3600)  # older than local_transaction_max_seconds
            assert database.log.check(database.engine, slow) is UNKNOWN, "its block is open here"
    assert state_of(database, tx.transaction_id) == "COMMIT"
    assert [r.local_transaction_state for r in tx.results] == [COMMIT, COMMIT]


def test_two_logs_over_one_table_agree_on_an_open_handle(database: Database, real_client: Any, redis_url: str) -> None:
    """Defect: record() remembered the open handle in its own log object only, so the producer's checker built from
    another TransactionLog over the same table fenced (ROLLBACK) a slow local transaction still running here."""
    other = TransactionLog(MetaData(), local_transaction_max_seconds=30, lock_timeout_seconds=2)
    assert other.table is not database.log.table and other.table.name == database.log.table.name
    with TransactionProducer("order_group", checker=other.checker(database.engine), redis_url=redis_url) as p:
        with p.transaction(Message("orders", b"1")) as tx, database.engine.begin() as db:
            statement = database.log.record(tx)
            slow = a_check(tx.transaction_id, age=3600)  # older than local_transaction_max_seconds
            assert other.check(database.engine, slow) is UNKNOWN, "its block is open in this process"
            db.execute(statement)
        assert other.check(database.engine, slow) is COMMIT
    assert state_of(database, tx.transaction_id) == "COMMIT"
    assert tx.result.local_transaction_state is COMMIT
