"""The inbox: a redelivered message (its consumer died between the database commit and the ack, another instance
claimed it) changes the consumer's database once — sync and asyncio, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Column, Integer, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from redis_txmq import ConsumedMessage, Consumer, LocalTransactionState, Message, TransactionProducer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.keys import TopicKeys

from .databases import Database

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
