"""The asyncio service instance of the fault suite: :mod:`.producer_worker`'s orders, ledger and check-back answers,
sent by :class:`redis_txmq.asyncio.TransactionProducer` with an asyncio listener, several sends in flight at once.

``python -m tests.faults.async_producer_worker CONFIG SLOT``: sends orders ``SLOT-<n>`` in rounds of
:data:`IN_FLIGHT` concurrent tasks (``asyncio.gather``), paced to the slot's rate, resuming after a restart; then
touches ``<ledger>.done`` and keeps answering check-backs until SIGTERM. A share of the orders (:data:`HANDLE_SHARE`
of those of one message, ``handle_many_share`` of those of several) goes through a transaction handle instead of the
listener (``async with producer.transaction(message)``); such an order that must end UNKNOWN leaves its block
through an expired ``asyncio.timeout`` after its database work, which leaves the transaction to the check-back. An
order of several messages goes through ``send_messages_in_transaction``, or through ``async with
producer.transaction() as tx`` and a ``tx.send`` per message (tried again when it raises, as the sync service does:
:class:`~.producer_worker.Parts`), and dies after its decision when the fault ``decided`` asks (see
:mod:`.producer_worker`). The order book is used through its async methods (a thread for SQLite, the asyncio engine
for PostgreSQL), the journal from threads."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from redis_txmq import LocalTransactionState, Message, PrepareError, Settings, TransactionSendResult
from redis_txmq.asyncio import TransactionListener, TransactionProducer
from redis_txmq.asyncio.producer import AsyncTransaction, AsyncTransactionOfMany
from redis_txmq.core.sending import HandleState

from .ledger import Ledger
from .producer_worker import (
    AFTER_COMMIT,
    RETRY_PAUSE,
    START_ERRORS,
    WRITES_ROW,
    LocalTransactionFailed,
    OrderBook,
    Parts,
    handle_many_share,
    journal_of,
    kill_after_decision,
    kill_flag,
    order,
    order_book,
)

logger = logging.getLogger("faults.async_producer")

IN_FLIGHT = 4
"""Sends started together in each round: their script calls share pipelines, their local transactions overlap."""
HANDLE_SHARE = 0.4
"""Share of the orders of one message sent through a transaction handle (``raise_row`` ones excepted: a block that
raises rolls back, which a committed row must not be); of the orders of several, ``handle_many_share``."""
TIMED_OUT = AFTER_COMMIT / 2
"""When an UNKNOWN order's handle block times out: during the pause after its database work."""


class AsyncOrderService(TransactionListener):
    """The asyncio listener: the order row is the local transaction; the check-back asks the order book."""

    def __init__(self, book: OrderBook, own: Ledger) -> None:
        self.book = book
        self.own = own
        self.fenced: set[str] = set()

    async def commit_order(self, transaction: HandleState | Message) -> bool:
        """The order row; False (the transaction fenced) if a check-back aborted it first."""
        if await self.book.commit_order_async(transaction):
            return True
        message = transaction.message if isinstance(transaction, HandleState) else transaction
        self.fenced.add(message.transaction_id or "")
        return False

    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState | None:
        if arg in WRITES_ROW and not await self.commit_order(message):
            return LocalTransactionState.ROLLBACK
        await asyncio.sleep(AFTER_COMMIT)
        if arg.startswith("raise"):
            raise LocalTransactionFailed(arg)
        return {"commit": LocalTransactionState.COMMIT, "rollback": LocalTransactionState.ROLLBACK}.get(arg)

    async def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return await self.book.check_async(message)


def results_of(tx: AsyncTransaction | AsyncTransactionOfMany) -> list[TransactionSendResult]:
    """A handle's send results, one per message (none if it has no result: a finding)."""
    if isinstance(tx, AsyncTransactionOfMany):
        return tx.results
    return [] if tx.result is None else [tx.result]


class Sender:
    """Sends this slot's orders and journals each one (``(handle)`` marks the outcome of a handle's send); counts
    the sends in flight together."""

    def __init__(self, producer: TransactionProducer, service: AsyncOrderService) -> None:
        self.producer = producer
        self.service = service
        self.in_flight = 0
        self.most_in_flight = 0
        self.by_handle = 0

    async def with_handle(
        self, messages: tuple[Message, ...], behaviour: str, parts: Parts
    ) -> list[TransactionSendResult]:
        """The order as the body of a transaction handle (of its message, or of several sent with ``tx.send``, each
        tried again when it raises): COMMIT by leaving the block, ROLLBACK by ``tx.rollback()`` or by raising,
        UNKNOWN by a timeout that cancels the block."""
        loop = asyncio.get_running_loop()
        tx = self.producer.transaction(messages[0]) if len(messages) == 1 else self.producer.transaction()
        try:
            async with asyncio.timeout(None) as deadline:
                async with tx:
                    row: HandleState | Message = tx
                    if isinstance(tx, AsyncTransactionOfMany):
                        for message in messages:
                            await self.send_one(tx, message, parts)
                        row = parts.row(messages[0], tx.transaction_id)
                    if behaviour in WRITES_ROW and not await self.service.commit_order(row):
                        await tx.rollback()
                        return results_of(tx)
                    if behaviour.startswith("unknown"):
                        deadline.reschedule(loop.time() + TIMED_OUT)
                    await asyncio.sleep(AFTER_COMMIT)
                    if behaviour == "rollback":
                        await tx.rollback()
                    elif behaviour == "raise":
                        raise LocalTransactionFailed(behaviour)
        except LocalTransactionFailed:
            pass
        except asyncio.TimeoutError:
            if not deadline.expired():
                raise
        return results_of(tx)

    @staticmethod
    async def send_one(tx: AsyncTransactionOfMany, message: Message, parts: Parts) -> None:
        """``tx.send(message)``, tried again while it raises (the last :class:`PrepareError` is raised)."""
        tries = 1
        while True:
            try:
                parts.returned(await tx.send(message))
                return
            except PrepareError as exc:
                if not parts.raised(exc, tries):
                    raise
            tries += 1
            await asyncio.sleep(RETRY_PAUSE)

    async def send(self, own: Ledger, n: int, behaviour: str, messages: tuple[Message, ...], handle: bool) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        parts, mark = Parts(dict(messages[0].properties or {})["order"]), " (handle)" if handle else ""
        try:
            if handle:
                self.by_handle += 1
                results = await self.with_handle(messages, behaviour, parts)
            elif len(messages) == 1:
                results = [await self.producer.send_message_in_transaction(messages[0], behaviour)]
            else:
                results = await self.producer.send_messages_in_transaction(list(messages), behaviour)
        except PrepareError as exc:
            logger.warning("order %s: %s", messages[0].keys, exc)
            await asyncio.to_thread(own.finish_attempt, n, None, "prepare_failed" + mark, parts.failed)
            return
        except Exception as exc:  # noqa: BLE001 - anything else is a finding: journal it and keep sending
            logger.exception("order %s: send raised", messages[0].keys)
            await asyncio.to_thread(own.finish_attempt, n, None, f"raised {type(exc).__name__}", parts.failed)
            return
        finally:
            self.in_flight -= 1
        if not results:
            message = "raised nothing, but the handle has no result"
            await asyncio.to_thread(own.finish_attempt, n, None, message, parts.failed)
            return
        transaction_id, outcome = journal_of(results, self.service.fenced)
        await asyncio.to_thread(own.finish_attempt, n, transaction_id, outcome + mark, parts.failed)

    async def send_orders(self, config: dict[str, Any], slot: int, stop: asyncio.Event) -> bool:
        """Send this slot's orders in rounds of :data:`IN_FLIGHT`, ``rate`` per second; False if stopped first."""
        loop, own = asyncio.get_running_loop(), self.service.own
        interval, quota = IN_FLIGHT / config["rate"], config["quotas"][slot]
        n, next_at = await asyncio.to_thread(own.attempts_made), loop.time()
        while n < quota:
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
            except asyncio.TimeoutError:
                pass
            if stop.is_set():
                return False
            next_at = max(next_at + interval, loop.time())
            sends = []
            for k in range(n, min(n + IN_FLIGHT, quota)):
                order_id, behaviour, messages, choice = order(config, slot, k)
                share = HANDLE_SHARE if len(messages) == 1 else handle_many_share(config)
                handle = behaviour != "raise_row" and choice.random() < share
                await asyncio.to_thread(own.begin_attempt, k, order_id, behaviour)
                sends.append(self.send(own, k, behaviour, messages, handle))
            await asyncio.gather(*sends)
            n += len(sends)
        return True


async def start_producer(
    group: str, service: AsyncOrderService, settings: Settings, oneway_end: bool, stop: asyncio.Event
) -> TransactionProducer:
    """A started producer, retried while Redis cannot be reached."""
    while True:
        producer = TransactionProducer(group, service, settings=settings, oneway_end=oneway_end)
        try:
            return await producer.start()
        except START_ERRORS as exc:
            logger.warning("producer start failed: %s: %s; retrying", type(exc).__name__, exc)
            await producer.shutdown()
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                continue
            raise SystemExit(0) from exc


async def serve(config: dict[str, Any], slot: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ledgers = [Ledger(Path(path)) for path in config["ledgers"]]
    service = AsyncOrderService(order_book(config, ledgers, slot), ledgers[slot])
    settings = Settings(redis_url=config["redis_url"], **config["settings"])
    oneway_end = slot in config["oneway_slots"]
    producer = await start_producer(config["producer_group"], service, settings, oneway_end, stop)
    kill_after_decision(producer, kill_flag(config["ledgers"][slot]), config["seed"] + slot)
    logger.info("asyncio producer %s started", producer.instance_id)
    sender = Sender(producer, service)
    if await sender.send_orders(config, slot, stop):
        Path(f"{config['ledgers'][slot]}.done").touch()
        logger.info(
            "all orders sent (%d through a transaction handle this start, at most %d in flight at once); answering "
            "check-backs until SIGTERM",
            sender.by_handle,
            sender.most_in_flight,
        )
        await stop.wait()
    await producer.shutdown()


def main(config_path: str, slot_arg: str) -> None:
    config = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(config, int(slot_arg)))


if __name__ == "__main__":
    main(*sys.argv[1:3])
