"""The PostgreSQL variant's databases, built on :mod:`redis_txmq.sqlalchemy` as a service would use it.

- :class:`OrderDatabase`, the order service's (all producer instances of the group share it, as the instances of one
  service do): an ``orders`` row and its transaction-log row in one database transaction; the check-back is the
  log's own check (the fence makes a check that overtakes a slow local transaction safe: no tombstone of ours).
- :class:`BillingDatabase`, the consumer group's: every delivery goes through the inbox, whose handler inserts an
  ``invoices`` row (no unique constraint: a message applied twice shows as two rows) and commits before the ack.

Both answer sync and asyncio callers (psycopg 3 does both on one URL)."""

from __future__ import annotations

import collections
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from redis_txmq import ConsumedMessage, LocalTransactionState, Message
from redis_txmq.core.sending import HandleState
from redis_txmq.sqlalchemy import Inbox, TransactionLog

from .ledger import recorded_topics

LOCAL_TRANSACTION_MAX_SECONDS = 5.0
"""Above the longest local transaction of the suite (its pause after the database work, and the prepare held up by a
fault before it): a younger transaction without a row is asked about again rather than fenced."""

metadata = MetaData()
orders = Table(
    "orders",
    metadata,
    Column("transaction_id", String(64), primary_key=True),
    Column("order_id", String(64), nullable=False, unique=True),
    Column("topic", String(255), nullable=False),
)
invoices = Table(
    "invoices",
    metadata,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("transaction_id", String(64), nullable=False),
    Column("stream", String(255), nullable=False),
    Column("entry_id", String(64), nullable=False),
)
ROLLBACK = LocalTransactionState.ROLLBACK.value
log = TransactionLog(metadata, local_transaction_max_seconds=LOCAL_TRANSACTION_MAX_SECONDS, lock_timeout_seconds=2)
inbox = Inbox(metadata)


def create_schema(url: str) -> None:
    engine = create_engine(url)
    metadata.create_all(engine)
    engine.dispose()


class OrderDatabase:
    """The order service's database: its local transaction and the check-back that reads the log."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_engine(url, pool_size=2)
        self._async_engine: Any = None

    @property
    def async_engine(self) -> Any:
        if self._async_engine is None:
            self._async_engine = create_async_engine(self.url, pool_size=4)
        return self._async_engine

    @staticmethod
    def _order_values(transaction: HandleState | Message) -> dict[str, Any]:
        message = transaction.message if isinstance(transaction, HandleState) else transaction
        return {
            "transaction_id": message.transaction_id,
            "order_id": dict(message.properties or {})["order"],
            "topic": recorded_topics(message),
        }

    def commit_order(self, transaction: HandleState | Message) -> bool:
        """The local transaction: the log row, then the order. False when a check-back fenced it first."""
        try:
            with self.engine.begin() as db:
                db.execute(log.record(transaction))
                db.execute(insert(orders).values(**self._order_values(transaction)))
        except IntegrityError:
            return False
        return True

    async def commit_order_async(self, transaction: HandleState | Message) -> bool:
        try:
            async with self.async_engine.begin() as db:
                await db.execute(log.record(transaction))
                await db.execute(insert(orders).values(**self._order_values(transaction)))
        except IntegrityError:
            return False
        return True

    def check(self, message: Message) -> LocalTransactionState:
        return log.check(self.engine, message)

    async def check_async(self, message: Message) -> LocalTransactionState:
        return await log.check_async(self.async_engine, message)

    def committed(self) -> dict[str, str]:
        """Transaction id -> topic(s) of every committed order (the ground truth, as the ledgers record it)."""
        with self.engine.connect() as db:
            return {tx: topic for tx, topic in db.execute(select(orders.c.transaction_id, orders.c.topic))}

    def fenced(self) -> int:
        """Transactions a check-back fenced (rolled back for good) because their local transaction had no row."""
        with self.engine.connect() as db:
            fences = select(func.count()).select_from(log.table).where(log.table.c.state == ROLLBACK)
            return int(db.execute(fences).scalar_one())

    async def aclose(self) -> None:
        if self._async_engine is not None:
            await self._async_engine.dispose()
        self.engine.dispose()

    def close(self) -> None:
        self.engine.dispose()


def _invoice(message: ConsumedMessage) -> Any:
    return insert(invoices).values(transaction_id=message.transaction_id, stream=message.stream, entry_id=message.id)


class BillingDatabase:
    """The consumer group's database: an invoice per message, through the inbox."""

    def __init__(self, url: str, consumer_group: str) -> None:
        self.url = url
        self.consumer_group = consumer_group
        self.engine = create_engine(url, pool_size=2)
        self._async_engine: Any = None

    def handler(self) -> Any:
        """``message -> None``: the invoice and the inbox row in one database transaction, committed on return."""

        def bill(session: Any, message: ConsumedMessage) -> None:
            session.execute(_invoice(message))

        return inbox.handler(sessionmaker(self.engine), bill, consumer_group=self.consumer_group)

    def async_handler(self) -> Any:
        self._async_engine = self._async_engine or create_async_engine(self.url, pool_size=4)

        async def bill(session: Any, message: ConsumedMessage) -> None:
            await session.execute(_invoice(message))

        factory = async_sessionmaker(self._async_engine)
        return inbox.async_handler(factory, bill, consumer_group=self.consumer_group)

    def billed(self) -> collections.Counter[str]:
        """Transaction id -> how many invoices it made (one, if all is well)."""
        with self.engine.connect() as db:
            per_transaction = select(invoices.c.transaction_id, func.count()).group_by(invoices.c.transaction_id)
            return collections.Counter({tx: count for tx, count in db.execute(per_transaction)})

    async def aclose(self) -> None:
        if self._async_engine is not None:
            await self._async_engine.dispose()
        self.engine.dispose()

    def close(self) -> None:
        self.engine.dispose()
