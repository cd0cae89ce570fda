"""A service instance of the fault suite: sends orders in transactions, paced, its local transaction writing to its
own ledger, and answers its group's check-backs from the ledger of the service that sent the order.

``python -m tests.faults.producer_worker CONFIG SLOT``: sends orders ``SLOT-<n>`` until the slot's quota (resuming
after a restart), touches ``<ledger>.done``, then keeps answering check-backs until SIGTERM. The slots listed in
``oneway_slots`` send with ``oneway_end=True``: ends queued when the process is killed are repaired by check-back.
The asyncio producer's slot is served by :mod:`.async_producer_worker` instead, with the same orders and ledger.

A share of the orders (:data:`MANY_SHARE`) is a transaction of several messages over both topics and their
partitions (``send_messages_in_transaction``, or, for a share of them, :data:`HANDLE_MANY_SHARE`, ``with
producer.transaction() as tx`` and a ``tx.send`` per message: a send that raises is tried again, up to
:data:`SEND_TRIES` times, and the order row records which index each message took, :class:`Parts`). While the
slot's :func:`kill_flag` file exists, the next such transaction that is decided SIGKILLs its process after the
decision and a random number of its messages' ends (the fault ``decided``): the checker must finish the
roll-forward or roll-back from the decision.

Where the orders live (:func:`order_book`): each slot's SQLite ledger, or, when the config has a ``database_url``,
the service's PostgreSQL database with its transaction log (:mod:`.pg_databases`); the journal of sends stays in the
slot's ledger either way."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

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
from redis_txmq.core.clients import REDIS_ERRORS
from redis_txmq.core.sending import HandleState
from redis_txmq.sync.transaction import TransactionOfMany

from .ledger import VOID, Ledger, recorded_topics

logger = logging.getLogger("faults.producer")

BEHAVIOURS = {"commit": 55, "rollback": 15, "unknown_row": 8, "unknown": 7, "raise_row": 8, "raise": 7}
"""What a local transaction does, with its weight: ``*_row`` ones commit the order row, the others write nothing;
``unknown*`` answer UNKNOWN, ``raise*`` raise, so that only the check-back can end them."""
WRITES_ROW = {"commit", "unknown_row", "raise_row"}
AFTER_COMMIT = 0.05
"""Seconds a local transaction goes on after its database work: a kill then often falls between a committed row
and the end call, which only the check-back can repair."""


MANY_SHARE = 0.2
"""Share of the orders sent as a transaction of several messages (:data:`MANY_PARTS` of them); the config's
``many_share`` when it has one (the replica variant sends more)."""
MANY_PARTS = (2, 4)
"""How many messages such an order sends, at least and at most: each on a topic and key of its own draw."""


HANDLE_MANY_SHARE = 0.5
"""Share of the orders of several messages (not ``raise_row``: a block that raises rolls back) sent through a
transaction handle, one ``tx.send`` per message; the config's ``handle_many_share`` when it has one."""
SEND_TRIES = 4
"""How often a service tries to send one message of a transaction of several through ``tx.send`` before it gives
up the order (the block raises: ROLLBACK); a send that raised is never published, the next try takes a new index."""
RETRY_PAUSE = 0.1
"""Seconds between two tries of one message."""


class Order(NamedTuple):
    """Order ``<slot>-<n>``: what its local transaction does and the messages it sends (one, or several in one
    transaction: every one carries the order's topics in the property ``parts``, which the ground truth records;
    sent through a handle, the row records the index each message took instead, :meth:`Parts.row`)."""

    order_id: str
    behaviour: str
    messages: tuple[Message, ...]
    choice: random.Random
    """The random source the order was drawn from, for any further choice about it."""


def order(config: dict[str, Any], slot: int, n: int) -> Order:
    """Order ``<slot>-<n>`` as the seed says (the same in every run of a seed, and after a restart)."""
    choice = random.Random(f"{config['seed']}/{slot}/{n}")
    behaviour = choice.choices(list(BEHAVIOURS), weights=list(BEHAVIOURS.values()))[0]
    order_id = f"{slot}-{n}"
    properties = {"service": str(slot), "order": order_id}
    if choice.random() >= config.get("many_share", MANY_SHARE):
        body = json.dumps({"order": order_id}).encode()
        message = Message(choice.choice(config["topics"]), body, keys=order_id, properties=properties)
        return Order(order_id, behaviour, (message,), choice)
    topics = [choice.choice(config["topics"]) for _ in range(choice.randint(*MANY_PARTS))]
    properties["parts"] = " ".join(topics)
    messages = tuple(
        Message(
            topic, json.dumps({"order": order_id, "part": i}).encode(), keys=f"{order_id}/{i}", properties=properties
        )
        for i, topic in enumerate(topics)
    )
    return Order(order_id, behaviour, messages, choice)


def outcome_of(result: TransactionSendResult, fenced: set[str], transaction_id: str | None = None) -> str:
    """What the journal records for a send that returned (of a message of transaction ``transaction_id``)."""
    fence = "fenced" if (transaction_id or result.transaction_id) in fenced else result.local_transaction_state.value
    return fence + (" end_error" if result.end_error else "")


def journal_of(results: list[TransactionSendResult], fenced: set[str]) -> tuple[str, str]:
    """The transaction id and the outcome the journal records for an order's send: a transaction of several
    messages by its own id (the one its order row and the check-back use), with the end errors counted."""
    if len(results) == 1:
        return results[0].transaction_id, outcome_of(results[0], fenced)
    transaction_id = results[0].transaction_id.rpartition(".")[0]
    outcome = outcome_of(results[0], fenced, transaction_id).split()[0]
    failed = sum(1 for result in results if result.end_error)
    return transaction_id, f"{outcome} (of {len(results)})" + (f" end_error {failed}" if failed else "")


def handle_many_share(config: dict[str, Any]) -> float:
    """The share of the orders of several messages that go through a transaction handle."""
    return float(config.get("handle_many_share", HANDLE_MANY_SHARE))


class Parts:
    """The messages of an order of several sent through a handle's ``tx.send``: the index each send that returned
    took (``<transaction id>.<index>``) and how many sends raised; :meth:`row` is what the order row records."""

    def __init__(self, order_id: str) -> None:
        self.order_id = order_id
        self.topics: dict[int, str] = {}
        self.failed = 0

    def returned(self, sent: Message) -> None:
        self.topics[int((sent.transaction_id or "").rpartition(".")[2])] = sent.topic

    def raised(self, exc: PrepareError, tries: int) -> bool:
        """Note a send that raised; True if the message is to be tried again."""
        self.failed += 1
        logger.warning("order %s: a send raised (try %d of %d): %s", self.order_id, tries, SEND_TRIES, exc)
        return tries < SEND_TRIES

    def row(self, first: Message, transaction_id: str) -> Message:
        """The message the order row is written from: the transaction's id, and in ``parts`` the topic of each index
        (:data:`VOID` where the send raised)."""
        row = first.copy_for_send(transaction_id)
        indices = range(max(self.topics) + 1)
        row.properties = {**(row.properties or {}), "parts": " ".join(self.topics.get(i, VOID) for i in indices)}
        return row


class LeftToCheckBack(BaseException):
    """Leaves a sync handle's block as an interruption would (not an ``Exception``): the transaction stays UNKNOWN,
    for the check-back."""


KILL_AFTER_DECISION = ".kill-after-decision"
_armed: contextvars.ContextVar[bool] = contextvars.ContextVar("armed", default=False)
"""Set by the wrapped ``decide`` of :func:`kill_after_decision` in the send whose decision it wrote while the flag
was up. A context variable, so that the ends of the one-way flusher (its own thread or task) never see it."""


def kill_flag(ledger_path: str | Path) -> Path:
    """The file that asks a slot's producer to die right after its next decision (:func:`kill_after_decision`)."""
    return Path(f"{ledger_path}{KILL_AFTER_DECISION}")


def kill_after_decision(producer: Any, flag: Path, seed: int) -> None:
    """Wrap the producer's ``broker.decide`` and ``broker.end_transactions`` (sync or asyncio): once ``flag``
    exists, the next transaction of several messages whose decision is written ends a random number of its
    messages (none to all but one), removes the flag and SIGKILLs the process."""
    broker, rng = producer.broker, random.Random(seed)
    decide, end_transactions = broker.decide, broker.end_transactions

    def arm(decided: Any, action: Any) -> Any:
        if flag.exists() and isinstance(action, LocalTransactionState):  # a decision, not a failed send's mark
            _armed.set(True)
        return decided

    def last_ends(ends: list[Any]) -> list[Any]:
        flag.unlink(missing_ok=True)
        first = ends[: rng.randrange(len(ends))]
        logger.warning("fault: SIGKILL after the decision and %d of %d ends", len(first), len(ends))
        return first

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if inspect.iscoroutinefunction(decide):

        async def decide_async(*args: Any, **kwargs: Any) -> Any:
            return arm(await decide(*args, **kwargs), args[2])

        async def end_transactions_async(ends: list[Any]) -> Any:
            if not _armed.get():
                return await end_transactions(ends)
            if first := last_ends(ends):
                await end_transactions(first)
            die()

        broker.decide, broker.end_transactions = decide_async, end_transactions_async
    else:

        def decide_sync(*args: Any, **kwargs: Any) -> Any:
            return arm(decide(*args, **kwargs), args[2])

        def end_transactions_sync(ends: list[Any]) -> Any:
            if not _armed.get():
                return end_transactions(ends)
            if first := last_ends(ends):
                end_transactions(first)
            die()

        broker.decide, broker.end_transactions = decide_sync, end_transactions_sync


START_ERRORS: tuple[type[Exception], ...] = (TxMQError, *REDIS_ERRORS)
"""What a producer's start may raise while Redis cannot be reached: on a cluster, redis-py's cluster errors too."""


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
        return self.own.commit_order(message.transaction_id or "", order_id, recorded_topics(message))

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
    """A started producer, retried while Redis cannot be reached (a cluster client is made only once the node of
    the URL answers: the constructor raises redis-py's ``RedisClusterException`` until then)."""
    while True:
        producer = None
        try:
            producer = TransactionProducer(group, service, settings=settings, oneway_end=oneway_end)
            return producer.start()
        except START_ERRORS as exc:
            logger.warning("producer start failed: %s: %s; retrying", type(exc).__name__, exc)
            if producer is not None:
                producer.shutdown()
            if stop.wait(0.2):
                raise SystemExit(0) from exc


def send_with_handle(
    producer: TransactionProducer, service: OrderService, messages: tuple[Message, ...], behaviour: str, parts: Parts
) -> list[TransactionSendResult]:
    """An order of several messages as the body of ``with producer.transaction() as tx``, each message sent with
    ``tx.send`` (tried again when it raises); COMMIT by leaving the block, ROLLBACK by ``tx.rollback()`` or by
    raising, UNKNOWN by :class:`LeftToCheckBack`. Raises the last :class:`PrepareError` of a message that could not
    be sent (the transaction is rolled back)."""
    tx = producer.transaction()
    assert isinstance(tx, TransactionOfMany)
    try:
        with tx:
            for message in messages:
                tries = 1
                while True:
                    try:
                        parts.returned(tx.send(message))
                        break
                    except PrepareError as exc:
                        if not parts.raised(exc, tries):
                            raise
                    tries += 1
                    time.sleep(RETRY_PAUSE)
            if behaviour in WRITES_ROW and not service.book.commit_order(parts.row(messages[0], tx.transaction_id)):
                service.fenced.add(tx.transaction_id)
                tx.rollback()
                return tx.results
            time.sleep(AFTER_COMMIT)
            if behaviour == "rollback":
                tx.rollback()
            elif behaviour == "raise":
                raise LocalTransactionFailed(behaviour)
            elif behaviour.startswith("unknown"):
                raise LeftToCheckBack(behaviour)
    except (LocalTransactionFailed, LeftToCheckBack):
        pass
    return tx.results


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
        order_id, behaviour, messages, choice = order(config, slot, n)
        handle = len(messages) > 1 and behaviour != "raise_row" and choice.random() < handle_many_share(config)
        mark, parts = " (handle)" if handle else "", Parts(order_id)
        own.begin_attempt(n, order_id, behaviour)
        try:
            if handle:
                results = send_with_handle(producer, service, messages, behaviour, parts)
            elif len(messages) == 1:
                results = [producer.send_message_in_transaction(messages[0], behaviour)]
            else:
                results = producer.send_messages_in_transaction(list(messages), behaviour)
        except PrepareError as exc:
            logger.warning("order %s: %s", order_id, exc)
            own.finish_attempt(n, None, "prepare_failed" + mark, parts.failed)
            continue
        except Exception as exc:  # noqa: BLE001 - anything else is a finding: journal it and keep sending
            logger.exception("order %s: send raised", order_id)
            own.finish_attempt(n, None, f"raised {type(exc).__name__}", parts.failed)
            continue
        if not results:
            own.finish_attempt(n, None, "raised nothing, but the handle has no result", parts.failed)
            continue
        transaction_id, outcome = journal_of(results, service.fenced)
        own.finish_attempt(n, transaction_id, outcome + mark, parts.failed)
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
    kill_after_decision(producer, kill_flag(config["ledgers"][slot]), config["seed"] + slot)
    logger.info("producer %s started", producer.instance_id)
    if send_orders(producer, service, config, slot, stop):
        Path(f"{config['ledgers'][slot]}.done").touch()
        logger.info("all orders sent; answering check-backs until SIGTERM")
        stop.wait()
    producer.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
