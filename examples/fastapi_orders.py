"""An order service on FastAPI and SQLAlchemy (async): ``POST /orders`` stores the order and publishes it on the
``fastapi-orders`` topic in one transaction handle, so an order is published if and only if it is saved.

    pip install "redis-txmq[example]"
    python examples/fastapi_orders.py --redis-url redis://localhost:6379/0 --database-url sqlite+aiosqlite:///orders.db
    python examples/fastapi_orders.py --role billing --redis-url redis://localhost:6379/0 \\
        --database-url sqlite+aiosqlite:///orders.db      # or postgresql+psycopg://user@host/db for both
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
        -d '{"id": 1, "customer": "ada", "amount": 25.0}'
    curl localhost:8000/orders/1

Run ``txmq checker`` beside it: an order whose end call never reached Redis (the network, a crash after the local
commit) is published by the check-back, which this service answers from the transaction log in its own database
(:class:`redis_txmq.sqlalchemy.TransactionLog`: one row written in each order's local transaction; a check that finds
none once the transaction can no longer be running fences it, so a late commit fails instead of being lost).
``--role billing`` is the consuming side: it invoices each order once through the inbox
(:class:`redis_txmq.sqlalchemy.Inbox`), however often the order is delivered; a message that is not an order (another
writer's, a bad body) is dead-lettered and logged once, not retried. ``--console-traces`` prints the OpenTelemetry
spans: the ``send fastapi-orders`` span with the database work under it, the ``process fastapi-orders`` span linked to
it.

Its names (topic ``fastapi-orders``, producer group ``fastapi-order-service``, consumer group ``fastapi-billing``) are
its own: ``txmq demo`` (topic ``orders``) and the Django example (``django-orders``) can run on the same Redis without
reading its messages or answering its check-backs from another database.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import String, event, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from redis_txmq import ConsumedMessage, LocalTransactionState, Message, Settings, TxMQConnectionError
from redis_txmq.asyncio import Consumer, TransactionProducer
from redis_txmq.sqlalchemy import Inbox, TransactionLog

TOPIC = "fastapi-orders"
PRODUCER_GROUP = "fastapi-order-service"
BILLING_GROUP = "fastapi-billing"
LOCAL_TRANSACTION_MAX_SECONDS = 30.0
"""Longer than any order's local transaction takes: a check-back waits this long before it gives one up."""

logger = logging.getLogger("fastapi_orders")


class Base(DeclarativeBase):
    pass


class OrderRow(Base):
    __tablename__ = "orders"

    order_id: Mapped[int] = mapped_column(primary_key=True)
    transaction_id: Mapped[str] = mapped_column(String(64), unique=True)
    customer: Mapped[str] = mapped_column(String(100))
    amount: Mapped[float]


class InvoiceRow(Base):
    """What the billing consumer makes of an order: one invoice per order, however often the order is delivered."""

    __tablename__ = "invoices"

    order_id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[float]


class OrderIn(BaseModel):
    """A new order; a request that does not fit is refused (422) before anything is written anywhere."""

    model_config = ConfigDict(extra="forbid")

    id: int = Field(gt=0)
    customer: str = Field(min_length=1, max_length=100)
    amount: float = Field(gt=0, allow_inf_nan=False)


class OrderOut(BaseModel):
    id: int
    customer: str
    amount: float


class OrderPlaced(BaseModel):
    order: OrderOut
    transaction_id: str
    committed_id: str | None = Field(
        description="the entry id of the order on the topic stream; null when the end call did not reach Redis: "
        "the order is saved, and the check-back publishes it"
    )


class OrderRefused(Exception):
    """The local transaction refused the order, so its message was rolled back; ``status_code`` is the HTTP answer."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code


class OrderService:
    """The database, and the producer whose transactions pair an order row with its ``fastapi-orders`` message."""

    def __init__(
        self,
        redis_url: str,
        database_url: str,
        *,
        settings: Settings | None = None,
        group: str = PRODUCER_GROUP,
        local_transaction_max_seconds: float = LOCAL_TRANSACTION_MAX_SECONDS,
    ) -> None:
        self.engine = _engine(database_url)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self.log = TransactionLog(Base.metadata, local_transaction_max_seconds=local_transaction_max_seconds)
        self.producer = TransactionProducer(
            group, checker=self.log.checker(self.engine), redis_url=redis_url, settings=settings
        )

    async def start(self) -> None:
        """Create the table, then start the producer: from then on it answers the check-backs of its group."""
        async with self.engine.begin() as connection:
            await connection.run_sync(Base.metadata.create_all)
        await self.producer.start()

    async def stop(self) -> None:
        """Stop the producer first: a check it is still answering needs the database."""
        await self.producer.shutdown()
        await self.engine.dispose()

    async def place(self, order: OrderIn) -> OrderPlaced:
        """Save the order and publish it: both or neither. An exception in the block (the insert refused) rolls the
        message back and goes on; the local commit happens inside the block, before the message's commit."""
        body = json.dumps(order.model_dump()).encode()
        try:
            async with self.producer.transaction(Message(TOPIC, body, keys=f"order-{order.id}", tags="created")) as tx:
                async with self.sessions.begin() as session:
                    await session.execute(self.log.record(tx))  # first: the check-back's answer
                    session.add(
                        OrderRow(
                            order_id=order.id,
                            transaction_id=tx.transaction_id,
                            customer=order.customer,
                            amount=order.amount,
                        )
                    )
        except IntegrityError as exc:
            if await self.get(order.id) is not None:
                raise OrderRefused(409, f"order {order.id} exists") from exc
            # the log row was refused: a check-back had given the transaction up (fenced it); nothing is saved
            raise OrderRefused(503, f"order {order.id} took too long and was not saved; retry") from exc
        committed_id = tx.result.committed_id if tx.result is not None else None
        return OrderPlaced(
            order=OrderOut(**order.model_dump()), transaction_id=tx.transaction_id, committed_id=committed_id
        )

    async def get(self, order_id: int) -> OrderOut | None:
        async with self.sessions() as session:
            row = await session.scalar(select(OrderRow).where(OrderRow.order_id == order_id))
        if row is None:
            return None
        return OrderOut(id=order_id, customer=row.customer, amount=row.amount)

    async def check(self, message: Message) -> LocalTransactionState:
        """The check-back, answered from the transaction log (what the producer's ``checker`` calls)."""
        return await self.log.check_async(self.engine, message)


class Billing:
    """The consuming side: invoices each published order, through the inbox, so that a redelivered order (the
    consumer killed between its database commit and its ack) is invoiced once.

    A message that is not an order can never be invoiced: raising would only have it delivered again, up to the
    consumer's ``max_deliveries`` (16), a traceback each time, before the consumer dead-letters it. It is
    dead-lettered at once instead, with why, and said once (``consumer.dead_letter``, as the consuming guide shows)."""

    def __init__(self, redis_url: str, database_url: str, **consumer_options: Any) -> None:
        self.engine = _engine(database_url)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self.inbox = Inbox(Base.metadata)
        self.apply = self.inbox.async_handler(self.sessions, self.invoice, consumer_group=BILLING_GROUP)
        self.consumer = Consumer(TOPIC, BILLING_GROUP, redis_url=redis_url, **consumer_options)

    async def handler(self, message: ConsumedMessage) -> None:
        """What ``consumer.run`` calls: an order goes through the inbox; anything else to the dead letters."""
        try:
            OrderOut.model_validate_json(message.body)
        except ValidationError as exc:
            await self.refuse(message, _problems(exc))
            return
        await self.apply(message)

    async def invoice(self, session: Any, message: ConsumedMessage) -> None:
        order = OrderOut.model_validate_json(message.body)
        session.add(InvoiceRow(order_id=order.id, amount=order.amount))

    async def refuse(self, message: ConsumedMessage, problem: str) -> None:
        """Dead-letter a message that is not an order, and say so once; ``consumer.run`` then goes on."""
        moved = await self.consumer.dead_letter(message, f"not an order: {problem}")
        where = (
            f"dead-lettered (`txmq status` counts it under consumer group {BILLING_GROUP}; "
            "`consumer.dead_letters()` reads it): fix what published it, then place the order again"
            if moved
            else "already dead-lettered or acked by another consumer of the group"
        )
        logger.warning(
            "topic=%s entry=%s tx=%s is not an order (%s); not invoiced, %s",
            message.topic,
            message.id,
            message.transaction_id,
            problem,
            where,
        )

    async def run(self, max_messages: int | None = None) -> int:
        """Invoice orders until stopped (or ``max_messages``); each is acked after its invoice committed."""
        async with self.engine.begin() as connection:
            await connection.run_sync(Base.metadata.create_all)
        async with self.consumer:
            return await self.consumer.run(self.handler, max_messages=max_messages)

    async def close(self) -> None:
        await self.engine.dispose()


def _problems(error: ValidationError) -> str:
    """What is wrong with a body, on one line (``id: Field required; amount: ...``)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}" for problem in error.errors()
    )


def _engine(database_url: str) -> AsyncEngine:
    """The async engine; on SQLite in WAL mode, so that readers (the check-back, ``GET``) never wait for a writer."""
    engine = create_async_engine(database_url)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

    return engine


def create_app(redis_url: str, database_url: str, **options: Any) -> FastAPI:
    """The service; its lifespan starts and stops the database and the producer (``app.state.orders``); ``options``
    go to :class:`OrderService`."""
    service = OrderService(redis_url, database_url, **options)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="orders", lifespan=lifespan)
    app.state.orders = service

    @app.post("/orders", status_code=201, response_model=OrderPlaced)
    async def place_order(order: OrderIn) -> OrderPlaced:
        try:
            return await service.place(order)
        except OrderRefused as exc:
            raise HTTPException(exc.status_code, str(exc)) from exc
        except TxMQConnectionError as exc:
            # the half message could not be written: the local transaction did not run, nothing was saved
            raise HTTPException(503, "cannot publish orders now; nothing was saved, retry later") from exc

    @app.get("/orders/{order_id}", response_model=OrderOut)
    async def read_order(order_id: int) -> OrderOut:
        order = await service.get(order_id)
        if order is None:
            raise HTTPException(404, f"order {order_id} not found")
        return order

    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description="An order service on FastAPI and SQLAlchemy: POST /orders saves an order and publishes it on "
        f"the {TOPIC} topic, both or neither (--role billing invoices them)."
    )
    parser.add_argument("--redis-url", default=os.environ.get("TXMQ_REDIS_URL", "redis://localhost:6379/0"))
    parser.add_argument("--database-url", default="sqlite+aiosqlite:///orders.db")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--role", choices=["api", "billing"], default="api", help="serve orders, or invoice them")
    parser.add_argument("--console-traces", action="store_true", help="print OpenTelemetry spans (needs the SDK)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.console_traces:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(provider)
    if args.role == "billing":
        import asyncio

        asyncio.run(Billing(args.redis_url, args.database_url).run())
        return

    import uvicorn  # only needed to serve the app

    uvicorn.run(create_app(args.redis_url, args.database_url), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
