"""The SQLAlchemy log in an outer transaction: "committed" means the outermost transaction holding the log row
committed. The row written in a savepoint (``session.begin_nested()``) or in a session whose transaction is still
open when the handle's block ends: the message is published when the session commits, never before, and not at all
when it rolls back (the check-back fences it). On SQLite, PostgreSQL and MariaDB, sync and asyncio sessions, and a
Core connection (no event after its commit: the check-back publishes it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Column, Integer, String, Table, event, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.core.keys import TopicKeys
from redis_txmq.sqlalchemy import TransactionLog

from .databases import Database
from .helpers import check_until_settled, published_of

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
CHECK_NOW = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)
KEYS = TopicKeys("orders")


def sqlite_savepoints(engine: Any) -> Any:
    """SQLAlchemy's documented recipe for savepoints on SQLite: the pysqlite driver begins a transaction only
    before a write, so a SAVEPOINT opened first is the outermost transaction and its RELEASE commits. Without it
    ``begin_nested()`` commits on SQLite, whatever the session does after (the log then rightly answers COMMIT)."""
    if engine.dialect.name != "sqlite":
        return engine

    @event.listens_for(engine, "connect")
    def no_driver_transactions(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    return engine


def orders_of(database: Database) -> Table:
    sqlite_savepoints(database.engine)
    table = Table("orders", database.metadata, Column("id", Integer, primary_key=True), Column("tx", String(64)))
    table.create(database.engine)
    return table


def fencing_log(database: Database) -> TransactionLog:
    """The test's log over the same table, fencing a transaction without a row at once (no age bound)."""
    log = TransactionLog(database.metadata, local_transaction_max_seconds=0, lock_timeout_seconds=2)
    return log


def published(client: Any, transaction_id: str) -> int:
    return published_of(client, KEYS.topic_stream, transaction_id)


def settle_in_flight(client: Any) -> None:
    check_until_settled(client, CHECK_NOW, KEYS.inflight)


def state_of(database: Database, transaction_id: str) -> str | None:
    table = database.log.table
    with database.engine.connect() as connection:
        return connection.execute(
            select(table.c.state).where(table.c.transaction_id == transaction_id)
        ).scalar_one_or_none()


@pytest.mark.parametrize("nested", [True, False], ids=["begin_nested", "open-session"])
def test_a_session_commit_publishes_and_its_rollback_does_not(
    database: Database, real_client: Any, redis_url: str, nested: bool
) -> None:
    """Two orders in a session whose transaction is still open when each handle's block ends (the record in a
    savepoint, or straight in the session): nothing is visible then; the first session commits (published, once),
    the second rolls back (never published; the check-back fences it)."""
    orders = orders_of(database)
    log = database.log
    with TransactionProducer(
        "order_group", checker=log.checker(database.engine), redis_url=redis_url, settings=CHECK_NOW
    ) as producer:
        ids = []
        for order_id, commit in ((1, True), (2, False)):
            with Session(database.engine) as session:
                session.begin()
                with producer.transaction(Message("orders", b"%d" % order_id)) as tx:
                    if nested:
                        with session.begin_nested():
                            session.execute(log.record(tx))
                            session.execute(insert(orders).values(id=order_id, tx=tx.transaction_id))
                    else:
                        session.execute(log.record(tx))
                        session.execute(insert(orders).values(id=order_id, tx=tx.transaction_id))
                assert tx.result.local_transaction_state is UNKNOWN
                assert published(real_client, tx.transaction_id) == 0, "published before the session committed"
                if commit:
                    session.commit()
                else:
                    session.rollback()
            ids.append(tx.transaction_id)
        committed, rolled_back = ids
        assert published(real_client, committed) == 1, "sent by the session's commit"
        assert tx.result.local_transaction_state is UNKNOWN
        fence = fencing_log(database)
        with TransactionProducer("order_group", checker=fence.checker(database.engine), redis_url=redis_url):
            settle_in_flight(real_client)
    assert published(real_client, rolled_back) == 0
    assert state_of(database, rolled_back) == "ROLLBACK"
    assert published(real_client, committed) == 1


def test_a_rolled_back_savepoint_rolls_the_message_back_at_once(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """The block catches its savepoint's failure and ends normally inside the session's open transaction: the log
    row is gone, so the handle rolls back (it committed a message without a row)."""
    orders = orders_of(database)
    log = database.log
    with TransactionProducer("order_group", checker=log.checker(database.engine), redis_url=redis_url) as producer:
        with Session(database.engine) as session, session.begin():
            session.execute(insert(orders).values(id=99, tx="other work of the session"))
            with producer.transaction(Message("orders", b"3")) as tx:
                savepoint = session.begin_nested()
                session.execute(log.record(tx))
                savepoint.rollback()
    assert tx.result.local_transaction_state is ROLLBACK
    assert published(real_client, tx.transaction_id) == 0 and real_client.hlen(KEYS.inflight) == 0


def test_a_block_that_raises_after_its_session_committed_still_commits(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """The session committed inside the block, then the block raised: the order is saved, so the message goes."""
    orders = orders_of(database)
    log = database.log
    with TransactionProducer("order_group", checker=log.checker(database.engine), redis_url=redis_url) as producer:
        with pytest.raises(ValueError), producer.transaction(Message("orders", b"4")) as tx:
            with Session(database.engine) as session, session.begin():
                session.execute(log.record(tx))
                session.execute(insert(orders).values(id=4, tx=tx.transaction_id))
            raise ValueError("after the commit")
    assert tx.result.local_transaction_state is COMMIT
    assert published(real_client, tx.transaction_id) == 1


def test_a_core_connection_left_open_waits_for_the_check_back(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """A Core connection's transaction still open when the block ends: nothing is published then (a connection
    says nothing after its commit); once it committed, the check-back publishes the order, once."""
    orders = orders_of(database)
    log = database.log
    with TransactionProducer(
        "order_group", checker=log.checker(database.engine), redis_url=redis_url, settings=CHECK_NOW
    ) as producer:
        with database.engine.connect() as connection, connection.begin():
            with producer.transaction(Message("orders", b"5")) as tx:
                connection.execute(log.record(tx))
                connection.execute(insert(orders).values(id=5, tx=tx.transaction_id))
            assert tx.result.local_transaction_state is UNKNOWN
            assert published(real_client, tx.transaction_id) == 0
        settle_in_flight(real_client)
    assert published(real_client, tx.transaction_id) == 1


def test_asyncio_session_commit_publishes_from_the_event_loop(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """An AsyncSession's outer transaction open around the asyncio handle: its commit sends the COMMIT on the loop."""
    orders = orders_of(database)
    log = database.log

    async def scenario() -> str:
        engine = database.async_engine()
        sqlite_savepoints(engine.sync_engine)
        try:
            async with txmq_asyncio.TransactionProducer(
                "order_group", checker=log.checker(engine), redis_url=redis_url
            ) as producer:
                async with AsyncSession(engine) as session:
                    await session.begin()
                    async with producer.transaction(Message("orders", b"6")) as tx:
                        async with session.begin_nested():
                            await session.execute(log.record(tx))
                            await session.execute(insert(orders).values(id=6, tx=tx.transaction_id))
                    assert published(real_client, tx.transaction_id) == 0
                    await session.commit()
                for _ in range(500):
                    if published(real_client, tx.transaction_id):
                        break
                    await asyncio.sleep(0.02)
                return tx.transaction_id
        finally:
            await engine.dispose()

    transaction_id = asyncio.run(scenario())
    assert published(real_client, transaction_id) == 1
    assert real_client.hlen(KEYS.inflight) == 0


# The review's cases: where the row stands is only what the database's own events say.


def test_a_session_closed_without_commit_then_used_again_publishes_nothing(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """``close()`` rolls the row's transaction back without a rollback event: a later commit of the same session,
    for other work, must not be taken for the row's (it published a message whose order was rolled back)."""
    orders = orders_of(database)
    log = database.log
    session = Session(database.engine)
    try:
        with TransactionProducer("order_group", checker=log.checker(database.engine), redis_url=redis_url) as p:
            with p.transaction(Message("orders", b"1")) as tx:
                session.execute(log.record(tx))
                session.execute(insert(orders).values(id=1, tx=tx.transaction_id))
            session.close()
            session.execute(insert(orders).values(id=2, tx="unrelated"))
            session.commit()
    finally:
        session.close()
    assert published(real_client, tx.transaction_id) == 0


@pytest.mark.parametrize("mode", ["conditional_savepoint", "create_savepoint", "rollback_only"])
def test_a_session_joined_to_its_callers_transaction_waits_for_that_transaction(
    database: Database, real_client: Any, redis_url: str, mode: str
) -> None:
    """``Session(bind=connection)`` inside a caller's open transaction (the test-suite pattern): the session's
    commit is not the database's; the caller rolls back, and the message is never published."""
    if database.name == "mariadb" and mode != "rollback_only":
        pytest.skip("one mode is enough on MariaDB")
    orders = orders_of(database)
    log = database.log
    with TransactionProducer("order_group", checker=log.checker(database.engine), redis_url=redis_url) as p:
        with database.engine.connect() as connection:
            outer = connection.begin()
            session = Session(bind=connection, join_transaction_mode=mode)  # type: ignore[arg-type]
            with p.transaction(Message("orders", b"1")) as tx:
                session.execute(log.record(tx))
                session.execute(insert(orders).values(id=1, tx=tx.transaction_id))
                session.commit()
            assert tx.result.local_transaction_state is UNKNOWN
            assert published(real_client, tx.transaction_id) == 0, "published inside the caller's transaction"
            session.close()
            outer.rollback()
    assert published(real_client, tx.transaction_id) == 0


def test_a_core_connection_that_begins_with_the_record_waits_for_its_commit(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """ "Commit as you go": the record is the connection's first statement, which begins its transaction."""
    orders = orders_of(database)
    log = database.log
    with TransactionProducer("order_group", checker=log.checker(database.engine), redis_url=redis_url) as p:
        with database.engine.connect() as connection:
            with p.transaction(Message("orders", b"1")) as tx:
                connection.execute(log.record(tx))
                connection.execute(insert(orders).values(id=1, tx=tx.transaction_id))
            assert published(real_client, tx.transaction_id) == 0, "published before the connection committed"
            connection.rollback()
    assert published(real_client, tx.transaction_id) == 0


def test_a_rolled_back_core_savepoint_rolls_the_message_back(
    database: Database, real_client: Any, redis_url: str
) -> None:
    orders = orders_of(database)
    log = database.log
    with TransactionProducer("order_group", checker=log.checker(database.engine), redis_url=redis_url) as p:
        with p.transaction(Message("orders", b"1")) as tx:
            with database.engine.connect() as connection, connection.begin():
                savepoint = connection.begin_nested()
                connection.execute(log.record(tx))
                connection.execute(insert(orders).values(id=1, tx=tx.transaction_id))
                savepoint.rollback()
    assert tx.result.local_transaction_state is ROLLBACK
    assert published(real_client, tx.transaction_id) == 0


def test_an_early_commit_inside_an_outer_transaction_waits_for_it(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """``tx.commit()`` inside the block while the row waits in the session's open transaction: it waits too."""
    orders = orders_of(database)
    log = database.log
    with TransactionProducer("order_group", checker=log.checker(database.engine), redis_url=redis_url) as p:
        with Session(database.engine) as session:
            session.begin()
            with p.transaction(Message("orders", b"1")) as tx:
                session.execute(log.record(tx))
                session.execute(insert(orders).values(id=1, tx=tx.transaction_id))
                tx.commit()
            assert published(real_client, tx.transaction_id) == 0
            session.rollback()
    assert published(real_client, tx.transaction_id) == 0


def test_no_watch_is_left_behind_by_cancelled_sends(database: Database, redis_url: str) -> None:
    """A listener's send cancelled after its record, and an asyncio block cancelled while its thread records: the
    watches are taken (they hold the session) and nothing is kept for a send that is over."""
    from redis_txmq.core import log_rows

    log = database.log
    orders = orders_of(database)

    class Recording(txmq_asyncio.TransactionListener):
        async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
            with Session(database.engine) as session, session.begin():
                session.execute(log.record(message))
                session.execute(insert(orders).values(id=arg, tx=message.transaction_id))
            await asyncio.Event().wait()  # cancelled here
            return COMMIT

        async def check_local_transaction(self, message: Message) -> LocalTransactionState:
            return UNKNOWN

    async def scenario() -> None:
        async with txmq_asyncio.TransactionProducer("order_group", Recording(), redis_url=redis_url) as producer:
            for order_id in (1, 2, 3):  # not 0: MySQL takes an id of 0 for AUTO_INCREMENT's next
                send = asyncio.create_task(producer.send_message_in_transaction(Message("orders", b"x"), order_id))
                await asyncio.sleep(0.2)
                send.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await send

    before = len(log_rows._WATCHES)
    asyncio.run(scenario())
    assert len(log_rows._WATCHES) == before
