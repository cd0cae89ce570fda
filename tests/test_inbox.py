"""The inbox: a redelivered message (its consumer died between the database commit and the ack, another instance
claimed it) changes the consumer's database once — sync and asyncio, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Column, Integer, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from redis_txmq import ConsumedMessage, Consumer, LocalTransactionState, Message, TransactionProducer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.core.errors import ConfigurationError
from redis_txmq.core.keys import TopicKeys

from .databases import Database, DeleteWatch, bound_lock_waits
from .helpers import wait_until

REDELIVER_SOON: dict[str, Any] = {"block": 0.05, "min_idle_time": 0.2}


def a_message(transaction_id: str = "tx-1") -> ConsumedMessage:
    return ConsumedMessage("orders", "txmq:{orders}:topic", "1-0", b"{}", transaction_id)


def applied_table(database: Database) -> Table:
    table = Table(
        "applied",
        database.metadata,
        Column("n", Integer, primary_key=True, autoincrement=True),
        Column("transaction_id", String(64), nullable=False),
    )
    table.create(database.engine)
    return table


def applied(database: Database, table: Table) -> list[str]:
    with database.engine.connect() as connection:
        return [row[0] for row in connection.execute(select(table.c.transaction_id).order_by(table.c.n))]


def test_a_message_is_claimed_once_per_group(database: Database) -> None:
    inbox = database.inbox
    with Session(database.engine) as session, session.begin():
        assert inbox.claim(session, "billing", a_message()) is True
    with Session(database.engine) as session, session.begin():
        assert inbox.claim(session, "billing", a_message()) is False, "already applied by this group"
        assert inbox.claim(session, "shipping", a_message()) is True, "another group applies it too"


def test_a_claim_rolled_back_with_its_transaction_is_claimed_again(database: Database) -> None:
    inbox = database.inbox
    with pytest.raises(RuntimeError), Session(database.engine) as session, session.begin():
        assert inbox.claim(session, "billing", a_message())
        raise RuntimeError("the handler failed: nothing of this transaction stays")
    with Session(database.engine) as session, session.begin():
        assert inbox.claim(session, "billing", a_message()) is True


def test_two_instances_handling_one_message_at_once_apply_it_once(database: Database) -> None:
    """The second instance's claim waits for the first one's transaction, then finds its row."""
    table = applied_table(database)
    handler = database.inbox.handler(
        sessionmaker(database.engine),
        lambda session, message: session.execute(insert(table).values(transaction_id=message.transaction_id)),
        consumer_group="billing",
    )
    first_claimed, second_done = threading.Event(), threading.Event()
    with Session(database.engine) as session:
        session.begin()
        assert database.inbox.claim(session, "billing", a_message())
        session.execute(insert(table).values(transaction_id="tx-1"))
        first_claimed.set()
        second = threading.Thread(target=lambda: (handler(a_message()), second_done.set()))
        second.start()
        assert not second_done.wait(0.3), "the second claim waits for the first transaction"
        session.commit()
    second.join(timeout=10)
    assert second_done.is_set() and applied(database, table) == ["tx-1"]


def test_purge_keeps_the_window(database: Database) -> None:
    inbox = database.inbox
    with Session(database.engine) as session, session.begin():
        inbox.claim(session, "billing", a_message("tx-1"))
        inbox.claim(session, "billing", a_message("tx-2"))
    assert inbox.purge(database.engine, timedelta(hours=1)) == 0
    assert inbox.purge(database.engine, timedelta(0)) == 2


def old_claims(database: Database, count: int, group: str = "billing") -> None:
    """``count`` messages ``group`` applied two hours ago."""
    two_hours_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    rows = [
        {"consumer_group": group, "message_id": f"tx-{i:06d}", "topic": "orders", "processed_at": two_hours_ago}
        for i in range(count)
    ]
    with database.engine.begin() as connection:
        connection.execute(insert(database.inbox.table), rows)


def inbox_rows(database: Database) -> list[tuple[str, str]]:
    table = database.inbox.table
    with database.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(select(table.c.consumer_group, table.c.message_id)))


def test_purge_deletes_in_batches_of_bounded_size(database: Database) -> None:
    """Defect: purge() was one DELETE of every old row, in one transaction."""
    old_claims(database, 1100)
    old_claims(database, 100, group="shipping")
    with Session(database.engine) as session, session.begin():
        database.inbox.claim(session, "billing", a_message("tx-new"))
    watch = DeleteWatch().watch(database.engine)
    assert database.inbox.purge(database.engine, timedelta(hours=1), batch_size=400) == 1200
    assert watch.per_statement and max(watch.per_statement) <= 400 and sum(watch.per_statement) == 1200
    assert max(watch.per_transaction) <= 400 and sum(watch.per_transaction) == 1200
    assert inbox_rows(database) == [("billing", "tx-new")]

    old_claims(database, 500)

    async def purge_async() -> tuple[int, DeleteWatch]:
        engine = database.async_engine()
        try:
            async_watch = DeleteWatch().watch(engine.sync_engine)
            return await database.inbox.purge_async(engine, timedelta(hours=1), batch_size=200), async_watch
        finally:
            await engine.dispose()

    deleted, async_watch = asyncio.run(purge_async())
    assert deleted == 500 and max(async_watch.per_transaction) <= 200 and sum(async_watch.per_transaction) == 500
    assert inbox_rows(database) == [("billing", "tx-new")]


def test_a_claim_completes_while_a_purge_of_many_rows_runs(database: Database) -> None:
    """Defect: on MariaDB a purge of many rows (one DELETE) locked the table until it committed. Here its first
    batch holds its locks until the claim is done (on SQLite, one writer at a time, the claim comes between
    batches), and the claim may wait on a lock 1 s at most."""
    old_claims(database, 5000)
    purging, writing = database.other_engine(), database.other_engine()
    watch = DeleteWatch(hold=database.name != "sqlite").watch(purging)
    purged: list[int] = []
    purge = threading.Thread(target=lambda: purged.append(database.inbox.purge(purging, timedelta(hours=1))))
    purge.start()
    try:
        wait_until(lambda: watch.holding.is_set() or bool(watch.per_transaction), timeout=30)
        with Session(writing) as session, session.begin():
            bound_lock_waits(session.connection(), 1)
            assert database.inbox.claim(session, "billing", a_message("tx-during-purge"))
    finally:
        watch.release.set()
        purge.join(60)
        purging.dispose()
        writing.dispose()
    assert purged == [5000]
    assert inbox_rows(database) == [("billing", "tx-during-purge")]


def test_groups_differing_in_case_accents_or_trailing_spaces_are_distinct(database: Database) -> None:
    """Defect: on MariaDB the key took the server's case- and accent-insensitive collation, so ``Billing`` found
    ``billing``'s row and its effects were skipped."""
    groups = ["billing", "Billing", "billïng", "billing "]
    for group in groups:
        with Session(database.engine) as session, session.begin():
            assert database.inbox.claim(session, group, a_message()) is True, f"{group!r} has not applied it"
    with Session(database.engine) as session, session.begin():
        assert [database.inbox.claim(session, group, a_message()) for group in groups] == [False] * 4
        assert database.inbox.claim(session, "billing", a_message("TX-1")) is True, "another transaction id"
    assert inbox_rows(database) == sorted([(group, "tx-1") for group in groups] + [("billing", "TX-1")])


def test_an_over_long_group_or_id_is_refused_not_truncated(database: Database) -> None:
    """Defect: MariaDB's INSERT IGNORE truncated a group name longer than its column, so two long names sharing a
    prefix shared rows (the second one's effects skipped)."""
    prefix = "g" * 127  # the column's 127 characters
    with Session(database.engine) as session, session.begin():
        with pytest.raises(ConfigurationError, match="consumer_group"):
            database.inbox.claim(session, prefix + "-billing", a_message())
        with pytest.raises(ConfigurationError, match="message_id"):
            database.inbox.claim(session, "billing", a_message("tx-" + "x" * 300))
        assert database.inbox.claim(session, prefix, a_message()) is True, "127 characters fit"

    async def claim_async() -> None:
        engine = database.async_engine()
        try:
            async with async_sessionmaker(engine)() as session, session.begin():
                with pytest.raises(ConfigurationError, match="consumer_group"):
                    await database.inbox.claim_async(session, prefix + "-shipping", a_message())
        finally:
            await engine.dispose()

    asyncio.run(claim_async())
    assert inbox_rows(database) == [(prefix, "tx-1")]


def test_a_consumer_killed_between_its_commit_and_its_ack_applies_the_message_once(
    database: Database, real_client: Any, redis_url: str
) -> None:
    """The first instance commits its database transaction (effects + inbox row) and dies before the ack; the
    second instance is handed the message again after ``claim_idle``, skips its effects, and acks it."""
    table = applied_table(database)
    with TransactionProducer(
        "order_group", checker=lambda m: LocalTransactionState.COMMIT, redis_url=redis_url
    ) as producer:
        sent = []
        for i in range(3):
            with producer.transaction(Message("orders", b"%d" % i)) as tx:
                sent.append(tx)
    handler = database.inbox.handler(
        sessionmaker(database.engine),
        lambda session, message: session.execute(insert(table).values(transaction_id=message.transaction_id)),
        consumer_group="billing",
    )
    with Consumer("orders", "billing", redis_url=redis_url, consumer_name="dies", **REDELIVER_SOON) as dying:
        for message in dying:
            handler(message)  # committed; the process dies before consumer.ack(message)
            if message.transaction_id == sent[1].transaction_id:
                break
    with Consumer("orders", "billing", redis_url=redis_url, consumer_name="takes-over", **REDELIVER_SOON) as c:
        handled = c.run(handler, max_messages=3)
    assert handled == 3
    assert sorted(applied(database, table)) == sorted(r.transaction_id for r in sent), "each order applied once"
    assert real_client.xpending(TopicKeys("orders").topic_stream, "billing")["pending"] == 0, "every message acked"


def test_asyncio_consumer_with_the_inbox(database: Database, real_client: Any, redis_url: str) -> None:
    table = applied_table(database)

    async def scenario() -> None:
        engine = database.async_engine()
        try:
            async with txmq_asyncio.TransactionProducer(
                "order_group", checker=lambda m: LocalTransactionState.COMMIT, redis_url=redis_url
            ) as producer:
                sent = []
                for i in range(2):
                    async with producer.transaction(Message("orders", b"%d" % i)) as tx:
                        sent.append(tx)

            async def apply(session: Any, message: ConsumedMessage) -> None:
                await session.execute(insert(table).values(transaction_id=message.transaction_id))

            handler = database.inbox.async_handler(async_sessionmaker(engine), apply, consumer_group="billing")
            async with txmq_asyncio.Consumer("orders", "billing", redis_url=redis_url, **REDELIVER_SOON) as consumer:
                async for message in consumer:
                    await handler(message)
                    await handler(message)  # the same delivery handled twice: applied once
                    await consumer.ack(message)
                    if message.transaction_id == sent[-1].transaction_id:
                        break
            async with engine.connect() as connection:
                count = (await connection.execute(select(func.count()).select_from(table))).scalar_one()
            assert count == 2
        finally:
            await engine.dispose()

    asyncio.run(scenario())
