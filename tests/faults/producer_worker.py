"""A service instance of the fault suite: sends orders in transactions, paced, its local transaction writing to its
own ledger, and answers its group's check-backs from the ledger of the service that sent the order.

``python -m tests.faults.producer_worker CONFIG SLOT``: sends orders ``SLOT-<n>`` until the slot's quota (resuming
after a restart), touches ``<ledger>.done``, then keeps answering check-backs until SIGTERM. The slots listed in
``oneway_slots`` send with ``oneway_end=True``: ends queued when the process is killed are repaired by check-back.
The asyncio producer's slot is served by :mod:`.async_producer_worker` instead, with the same orders and ledger.

Where the orders live (:func:`order_book`): each slot's SQLite ledger, or, when the config has a ``database_url``,
the service's PostgreSQL database with its transaction log (:mod:`.pg_databases`); the journal of sends stays in the
slot's ledger either way."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import redis

from redis_txmq import (
    LocalTransactionState,
    Message,
    PrepareError,
    Settings,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
    TxMQError,
)
from redis_txmq.sending import HandleState

from .ledger import Ledger

logger = logging.getLogger("faults.producer")

BEHAVIOURS = {"commit": 55, "rollback": 15, "unknown_row": 8, "unknown": 7, "raise_row": 8, "raise": 7}
"""What a local transaction does, with its weight: ``*_row`` ones commit the order row, the others write nothing;
``unknown*`` answer UNKNOWN, ``raise*`` raise, so that only the check-back can end them."""
WRITES_ROW = {"commit", "unknown_row", "raise_row"}
AFTER_COMMIT = 0.05
"""Seconds a local transaction goes on after its database work: a kill then often falls between a committed row
and the end call, which only the check-back can repair."""


class Order(NamedTuple):
    """Order ``<slot>-<n>``: what its local transaction does and the message it sends."""

    order_id: str
    behaviour: str
    message: Message
    choice: random.Random
    """The random source the order was drawn from, for any further choice about it."""


def order(config: dict[str, Any], slot: int, n: int) -> Order:
    """Order ``<slot>-<n>`` as the seed says (the same in every run of a seed, and after a restart)."""
    choice = random.Random(f"{config['seed']}/{slot}/{n}")
    behaviour = choice.choices(list(BEHAVIOURS), weights=list(BEHAVIOURS.values()))[0]
    topic, order_id = choice.choice(config["topics"]), f"{slot}-{n}"
    body, properties = json.dumps({"order": order_id}).encode(), {"service": str(slot), "order": order_id}
    return Order(order_id, behaviour, Message(topic, body, keys=order_id, properties=properties), choice)


def outcome_of(result: TransactionSendResult, fenced: set[str]) -> str:
    """What the journal records for a send that returned."""
    outcome = "fenced" if result.transaction_id in fenced else result.local_transaction_state.value
    return outcome + (" end_error" if result.end_error else "")


class LocalTransactionFailed(Exception):
    """What a ``raise*`` local transaction raises."""


class OrderBook(Protocol):
    """Where a service keeps its orders: the local transaction writes one, the check-back reads them."""

    def commit_order(self, transaction: HandleState | Message) -> bool:
        """The order row of ``transaction``; False when a check-back aborted the transaction first."""

    async def commit_order_async(self, transaction: HandleState | Message) -> bool: ...

    def check(self, message: Message) -> LocalTransactionState: ...

    async def check_async(self, message: Message) -> LocalTransactionState: ...


class LedgerBook:
    """The SQLite variant: each slot's own ledger; a check-back asks the ledger of the slot that sent the order.
    The async methods use a thread: SQLite may wait for another process' lock, never on the loop."""

    def __init__(self, ledgers: list[Ledger], slot: int) -> None:
        self.ledgers = ledgers
        self.own = ledgers[slot]

    def commit_order(self, transaction: HandleState | Message) -> bool:
        message = transaction.message if isinstance(transaction, HandleState) else transaction
        order_id = dict(message.properties or {})["order"]
        return self.own.commit_order(message.transaction_id or "", order_id, message.topic)

    async def commit_order_async(self, transaction: HandleState | Message) -> bool:
        return await asyncio.to_thread(self.commit_order, transaction)

    def check(self, message: Message) -> LocalTransactionState:
        owner = self.ledgers[int(dict(message.properties or {})["service"])]
        committed = owner.decide(message.transaction_id or "")
        return LocalTransactionState.COMMIT if committed else LocalTransactionState.ROLLBACK

    async def check_async(self, message: Message) -> LocalTransactionState:
        return await asyncio.to_thread(self.check, message)


def order_book(config: dict[str, Any], ledgers: list[Ledger], slot: int) -> OrderBook:
    if config.get("database_url"):
        from .pg_databases import OrderDatabase

        return OrderDatabase(config["database_url"])
    return LedgerBook(ledgers, slot)


class OrderService(TransactionListener):
    """The listener: the order row is the local transaction; the check-back asks the order book."""

    def __init__(self, book: OrderBook, own: Ledger) -> None:
        self.book = book
        self.own = own
        self.fenced: set[str] = set()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState | None:
        if arg in WRITES_ROW and not self.book.commit_order(message):
            self.fenced.add(message.transaction_id or "")
            return LocalTransactionState.ROLLBACK
        time.sleep(AFTER_COMMIT)
        if arg.startswith("raise"):
            raise LocalTransactionFailed(arg)
        return {"commit": LocalTransactionState.COMMIT, "rollback": LocalTransactionState.ROLLBACK}.get(arg)

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return self.book.check(message)


def start_producer(
    group: str, service: OrderService, settings: Settings, oneway_end: bool, stop: threading.Event
) -> TransactionProducer:
    """A started producer, retried while Redis cannot be reached."""
    while True:
        producer = TransactionProducer(group, service, settings=settings, oneway_end=oneway_end)
        try:
            return producer.start()
        except (TxMQError, redis.RedisError) as exc:
            logger.warning("producer start failed: %s; retrying", exc)
            producer.shutdown()
            if stop.wait(0.2):
                raise SystemExit(0) from exc


def send_orders(
    producer: TransactionProducer, service: OrderService, config: dict[str, Any], slot: int, stop: threading.Event
) -> bool:
    """Send this slot's orders, ``rate`` per second, each behaving as the seed says; journal every send.
    False if stopped first."""
    own, interval = service.own, 1.0 / config["rate"]
    next_at = time.monotonic()
    for n in range(own.attempts_made(), config["quotas"][slot]):
        if stop.wait(max(0.0, next_at - time.monotonic())):
            return False
        next_at = max(next_at + interval, time.monotonic())
        order_id, behaviour, message, _ = order(config, slot, n)
        own.begin_attempt(n, order_id, behaviour)
        try:
            result = producer.send_message_in_transaction(message, behaviour)
        except PrepareError as exc:
            logger.warning("order %s: %s", order_id, exc)
            own.finish_attempt(n, None, "prepare_failed")
            continue
        except Exception as exc:  # noqa: BLE001 - anything else is a finding: journal it and keep sending
            logger.exception("order %s: send raised", order_id)
            own.finish_attempt(n, None, f"raised {type(exc).__name__}")
            continue
        own.finish_attempt(n, result.transaction_id, outcome_of(result, service.fenced))
    return True


def main(config_path: str, slot_arg: str) -> None:
    config, slot = json.loads(Path(config_path).read_text()), int(slot_arg)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ledgers = [Ledger(Path(path)) for path in config["ledgers"]]
    service = OrderService(order_book(config, ledgers, slot), ledgers[slot])
    settings = Settings(redis_url=config["redis_url"], **config["settings"])
    oneway_end = slot in config["oneway_slots"]
    producer = start_producer(config["producer_group"], service, settings, oneway_end, stop)
    logger.info("producer %s started", producer.instance_id)
    if send_orders(producer, service, config, slot, stop):
        Path(f"{config['ledgers'][slot]}.done").touch()
        logger.info("all orders sent; answering check-backs until SIGTERM")
        stop.wait()
    producer.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
