"""An order service and a billing consumer on PostgreSQL or MariaDB, as processes that SIGKILL themselves at the worst
moment: ``python -m tests.pg_service producer|consumer REDIS_URL DATABASE_URL KILL_AT``.

- ``producer``: places orders ``0..ORDERS-1`` not in the database yet, each in a transaction handle whose local
  transaction inserts the order and its transaction-log row; order ``KILL_AT`` kills the process right after its
  database commit, before the end call (the check-back must publish it). Then it answers check-backs until killed.
- ``consumer``: bills each order through the inbox (the invoice and the inbox row in one database transaction, then
  the ack); order ``KILL_AT`` kills the process after that commit, before the ack (the redelivery must be skipped).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, select
from sqlalchemy.orm import sessionmaker

from redis_txmq import Consumer, Message, Settings, TransactionProducer
from redis_txmq.sqlalchemy import Inbox, TransactionLog

ORDERS = 12
SETTINGS = Settings(transaction_timeout=0.5, check_interval=0.5, heartbeat_interval=0.5, claim_idle=1)
metadata = MetaData()
orders = Table(  # order ids are given (MySQL would number an order 0 inserted into an AUTO_INCREMENT key)
    "orders",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("transaction_id", String(64)),
)
invoices = Table("invoices", metadata, Column("n", Integer, primary_key=True), Column("order_id", Integer))
log = TransactionLog(metadata, local_transaction_max_seconds=2)
inbox = Inbox(metadata)


def produce(redis_url: str, database_url: str, kill_at: int) -> None:
    engine = create_engine(database_url)
    with engine.connect() as db:
        placed = set(db.execute(select(orders.c.id)).scalars())
    with TransactionProducer(
        "orders-service", checker=log.checker(engine), redis_url=redis_url, settings=SETTINGS
    ) as p:
        for order_id in range(ORDERS):
            if order_id in placed:
                continue
            with p.transaction(Message("orders", json.dumps({"id": order_id}).encode())) as tx:
                with engine.begin() as db:
                    db.execute(log.record(tx))
                    db.execute(insert(orders).values(id=order_id, transaction_id=tx.transaction_id))
                if order_id == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # committed in the database, the end call never sent
        print("placed", flush=True)
        threading.Event().wait()  # answer check-backs until killed


def consume(redis_url: str, database_url: str, kill_at: int) -> None:
    engine = create_engine(database_url)

    def bill(session: object, message: object) -> None:
        order_id = json.loads(message.body)["id"]  # type: ignore[attr-defined]
        session.execute(insert(invoices).values(order_id=order_id))  # type: ignore[attr-defined]

    handler = inbox.handler(sessionmaker(engine), bill, consumer_group="billing")

    def bill_then_maybe_die(message: object) -> None:
        handler(message)  # type: ignore[arg-type]
        if json.loads(message.body)["id"] == kill_at:  # type: ignore[attr-defined]
            os.kill(os.getpid(), signal.SIGKILL)  # committed in the database, never acked

    with Consumer("orders", "billing", redis_url=redis_url, block=0.1, min_idle_time=1) as consumer:
        consumer.run(bill_then_maybe_die)


if __name__ == "__main__":
    role, redis_url, database_url, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if role == "setup":
        metadata.create_all(create_engine(database_url))
    else:
        (produce if role == "producer" else consume)(redis_url, database_url, kill_at)
