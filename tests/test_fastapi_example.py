"""The example service (``examples/fastapi_orders.py``) end to end, on a real Redis and a SQLite file: every order
it saves is received once by a consumer, a refused order never; an order whose end call was lost is published by
the check-back because its row exists, and a transaction without a row is rolled back by it for good."""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

for extra in ("fastapi", "sqlalchemy.ext.asyncio", "aiosqlite", "httpx"):
    pytest.importorskip(extra, reason="the example service needs the `example` extra: pip install -e '.[example]'")

import httpx  # noqa: E402 - after the skips: the extra may be missing
from sqlalchemy import select  # noqa: E402
from sqlalchemy.exc import IntegrityError  # noqa: E402

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer  # noqa: E402
from redis_txmq.asyncio import Consumer  # noqa: E402
from redis_txmq.checker import Checker  # noqa: E402
from redis_txmq.core.keys import TopicKeys  # noqa: E402
from tests.helpers import pending  # noqa: E402

CHECK_NOW = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)
"""The checker's settings: a transaction in flight is due for its check-back at once."""


def load_example() -> ModuleType:
    """The example is a script, not a package: load it by path (registered, so that its annotations resolve)."""
    path = Path(__file__).resolve().parent.parent / "examples" / "fastapi_orders.py"
    spec = importlib.util.spec_from_file_location("fastapi_orders", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


example = load_example()
KEYS = TopicKeys(example.TOPIC)


@asynccontextmanager
async def serving(redis_url: str, tmp_path: Path, **options: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The app on a fresh SQLite file, its lifespan entered as a server would (database and producer started), and
    an HTTP client that calls it in process."""
    app = example.create_app(redis_url, f"sqlite+aiosqlite:///{tmp_path / 'orders.db'}", **options)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://orders") as http:
            yield app.state.orders, http


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    """Poll an async condition until it holds; fail at the deadline."""

    async def poll() -> None:
        while not await condition():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


async def checker_round_until(checker: Checker, condition: Callable[[], bool]) -> None:
    """Checker rounds (in a thread: the service answers the check requests on this loop) until ``condition``."""

    async def done() -> bool:
        await asyncio.to_thread(checker.run_round)
        return condition()

    await until(done)


async def consume(redis_url: str, expected: int) -> list[Any]:
    """Read the example's topic through a new consumer group until ``expected`` messages came, acking each; then
    nothing more is there to read."""
    received: list[Any] = []
    async with Consumer(example.TOPIC, "audit", redis_url=redis_url) as consumer:

        async def read() -> None:
            while len(received) < expected:
                for message in await consumer.poll(timeout=1):
                    received.append(message)
                    await consumer.ack(message)

        await asyncio.wait_for(read(), 15)
        assert await consumer.poll(timeout=0) == [], "no message beyond the committed orders"
    return received


def topic_transactions(client: Any) -> list[str]:
    return [fields[b"transaction_id"].decode() for _, fields in client.xrange(KEYS.topic_stream)]


def test_each_saved_order_is_received_once_and_refused_ones_never(real_client, redis_url, tmp_path):
    unique = [{"id": i, "customer": f"c{i}", "amount": 10.0 + i} for i in range(1, 11)]
    duplicates = [{"id": i, "customer": f"again{i}", "amount": 1.0} for i in (2, 5, 7)]
    invalid = [
        {"id": 20, "customer": "zero", "amount": 0},
        {"id": 21, "customer": "negative", "amount": -5.0},
        {"id": 22, "amount": 3.0},
        {"id": 0, "customer": "no id", "amount": 3.0},
    ]

    async def scenario() -> None:
        async with serving(redis_url, tmp_path) as (_, http):
            posted = unique + duplicates + invalid
            responses = await asyncio.gather(*(http.post("/orders", json=order) for order in posted))
            by_status = collections.defaultdict(list)
            for order, response in zip(posted, responses, strict=True):
                by_status[response.status_code].append((order, response.json()))

            assert sorted(set(by_status)) == [201, 409, 422], {k: len(v) for k, v in by_status.items()}
            assert [order for order, _ in by_status[422]] == invalid, "refused before anything was written"
            accepted = {reply["order"]["id"]: reply for _, reply in by_status[201]}
            assert sorted(accepted) == list(range(1, 11)) and len(by_status[201]) == 10
            assert sorted(order["id"] for order, _ in by_status[409]) == [2, 5, 7], "one of each pair is refused"
            assert all(reply["committed_id"] for reply in accepted.values()), "every end call was applied"

            for order_id, reply in accepted.items():
                stored = await http.get(f"/orders/{order_id}")
                assert stored.status_code == 200 and stored.json() == reply["order"]
            assert (await http.get("/orders/20")).status_code == 404

        assert real_client.hlen(KEYS.inflight) == 0, "every transaction ended: committed or rolled back"
        assert real_client.xlen(KEYS.topic_stream) == 10

        received = await consume(redis_url, expected=10)
        counts = collections.Counter(message.transaction_id for message in received)
        assert counts == collections.Counter(reply["transaction_id"] for reply in accepted.values())
        for message in received:
            body = json.loads(message.body)
            reply = accepted[body["id"]]
            assert body == reply["order"], "the body is the saved order, never the refused duplicate"
            assert message.transaction_id == reply["transaction_id"] and message.id == reply["committed_id"]
            assert message.keys == [f"order-{body['id']}"]

    asyncio.run(scenario())


def test_an_order_whose_end_call_was_lost_is_published_by_the_check_back(real_client, redis_url, tmp_path):
    """The order is saved, then its COMMIT never reaches Redis: the check-back finds its row and commits it, once."""

    async def scenario() -> None:
        async with serving(redis_url, tmp_path) as (service, http):
            broker = service.producer.broker
            real_run = broker.runner.run
            lost: list[Any] = []

            async def lost_end(script: Any, *args: Any) -> Any:
                if script is broker._end and not lost:
                    lost.append(script)
                    raise redis.exceptions.ConnectionError("connection lost before the end call reached Redis")
                return await real_run(script, *args)

            broker.runner.run = lost_end
            response = await http.post("/orders", json={"id": 7, "customer": "fay", "amount": 42.0})
            assert response.status_code == 201 and response.json()["committed_id"] is None, "saved, not published"
            assert lost, "the end call was attempted once"
            transaction_id = response.json()["transaction_id"]
            assert (await http.get("/orders/7")).status_code == 200
            assert topic_transactions(real_client) == [] and real_client.hlen(KEYS.inflight) == 1

            checker = Checker(real_client, CHECK_NOW)
            await checker_round_until(checker, lambda: real_client.hlen(KEYS.inflight) == 0)
            assert topic_transactions(real_client) == [transaction_id]
            assert await service.check(Message(example.TOPIC, b"", transaction_id=transaction_id)) is (
                LocalTransactionState.COMMIT
            )
            await asyncio.to_thread(checker.run_round)
            assert topic_transactions(real_client) == [transaction_id], "published once"

        (message,) = await consume(redis_url, expected=1)
        assert message.transaction_id == transaction_id and json.loads(message.body)["id"] == 7

    asyncio.run(scenario())


def test_a_transaction_without_its_row_is_rolled_back_and_can_no_longer_commit(real_client, redis_url, tmp_path):
    """The service died between writing the half message and saving the order (here: the block is cancelled before
    the insert). Once the transaction is older than the service's bound on a local transaction, the check-back finds
    no log row, fences it and answers ROLLBACK; the fence refuses the order should its local transaction still try to
    commit."""

    async def scenario() -> None:
        async with serving(redis_url, tmp_path, local_transaction_max_seconds=0.5) as (service, _):
            half_written, handle = asyncio.Event(), service.producer.transaction(Message(example.TOPIC, b"{}"))

            async def dies_before_the_insert() -> None:
                async with handle:
                    half_written.set()
                    await asyncio.Event().wait()

            task = asyncio.create_task(dies_before_the_insert())
            await half_written.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert real_client.hlen(KEYS.inflight) == 1, "left in flight, for the check-back"

            checker = Checker(real_client, CHECK_NOW)
            await checker_round_until(checker, lambda: real_client.hlen(KEYS.inflight) == 0)
            assert topic_transactions(real_client) == [], "rolled back"

            with pytest.raises(IntegrityError):
                async with service.sessions.begin() as session:
                    await session.execute(service.log.record(handle.transaction_id, topic=example.TOPIC))
                    session.add(
                        example.OrderRow(order_id=8, transaction_id=handle.transaction_id, customer="x", amount=1)
                    )
            ghost = Message(example.TOPIC, b"", transaction_id=handle.transaction_id)
            assert await service.check(ghost) is LocalTransactionState.ROLLBACK, "asked again, the same answer"

    asyncio.run(scenario())


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'orders.db'}"
    return request.getfixturevalue("postgres_engine").url.render_as_string(hide_password=False)


def test_billing_invoices_each_order_once_through_a_redelivery(real_client, redis_url, database_url):
    """The service and its billing consumer on one database (SQLite, PostgreSQL): the first billing instance commits
    an invoice and dies before its ack; the next one is handed that order again and invoices only the others."""

    async def scenario() -> None:
        app = example.create_app(redis_url, database_url)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://o") as http:
                for i in (1, 2, 3):
                    response = await http.post("/orders", json={"id": i, "customer": f"c{i}", "amount": 10.0 * i})
                    assert response.status_code == 201
        dying = example.Billing(redis_url, database_url, block=0.05, min_idle_time=0.2)
        async with dying.engine.begin() as connection:
            await connection.run_sync(example.Base.metadata.create_all)
        async with dying.consumer:
            (first, *_) = await dying.consumer.poll(timeout=1)
            await dying.handler(first)  # invoiced and committed; the process dies before the ack
        await dying.close()
        billing = example.Billing(redis_url, database_url, block=0.05, min_idle_time=0.2)
        try:
            assert await asyncio.wait_for(billing.run(max_messages=3), 15) == 3
            async with billing.sessions() as session:
                invoices = (await session.execute(select(example.InvoiceRow.order_id))).scalars().all()
        finally:
            await billing.close()
        assert sorted(invoices) == [1, 2, 3], "each order invoiced once"

    asyncio.run(scenario())


NOT_ORDERS = [b"{not json", json.dumps({"order_id": 1, "amount": 25.0, "customer": "ada"}).encode()]
"""A body that is not JSON, and one shaped as ``txmq demo`` writes its orders (``order_id``: no ``id``)."""


def publish_raw(redis_url: str, bodies: list[bytes]) -> list[str]:
    """Commit ``bodies`` on the example's topic as another writer would; their transaction ids."""
    committed = []
    with TransactionProducer(
        "another-writer", checker=lambda message: LocalTransactionState.COMMIT, redis_url=redis_url
    ) as producer:
        for body in bodies:
            with producer.transaction(Message(example.TOPIC, body)) as tx:
                pass
            committed.append(tx.transaction_id)
    return committed


def test_billing_dead_letters_what_is_not_an_order_says_so_once_and_goes_on(real_client, redis_url, tmp_path, caplog):
    """Two messages billing cannot parse, then an order: each of the two is logged once (topic, entry id,
    transaction id, what to do) and dead-lettered, never handed out again; the order behind them is invoiced."""
    caplog.set_level(logging.INFO)
    bad = publish_raw(redis_url, NOT_ORDERS)
    entry_of = {
        fields[b"transaction_id"].decode(): entry_id.decode()
        for entry_id, fields in real_client.xrange(KEYS.topic_stream)
    }
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'orders.db'}"

    async def scenario() -> list[int]:
        async with serving(redis_url, tmp_path) as (_, http):
            response = await http.post("/orders", json={"id": 1, "customer": "ada", "amount": 25.0})
            assert response.status_code == 201
        billing = example.Billing(redis_url, database_url, block=0.05, min_idle_time=0.2)
        try:
            assert await asyncio.wait_for(billing.run(max_messages=3), 15) == 3
            async with billing.sessions() as session:
                return list((await session.execute(select(example.InvoiceRow.order_id))).scalars().all())
        finally:
            await billing.close()

    assert asyncio.run(scenario()) == [1], "the order behind the two is invoiced"
    said = [r for r in caplog.records if r.name == "fastapi_orders"]
    assert [r.levelno for r in said] == [logging.WARNING] * 2, [r.getMessage() for r in said]
    for record, transaction_id in zip(said, bad, strict=True):
        line = record.getMessage()
        assert f"topic={example.TOPIC} entry={entry_of[transaction_id]} tx={transaction_id}" in line
        assert "is not an order" in line and "dead-lettered" in line and "place the order again" in line
    assert "(body: Invalid JSON: " in said[0].getMessage()
    assert "(id: Field required)" in said[1].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no handler failure, no traceback"
    assert pending(real_client, KEYS.topic_stream, example.BILLING_GROUP) == 0, "nothing left to deliver again"
    letters = real_client.xrange(KEYS.consumer_dead_stream(example.BILLING_GROUP))
    assert [fields[b"transaction_id"].decode() for _, fields in letters] == bad
    assert all(fields[b"dead_reason"].startswith(b"not an order: ") for _, fields in letters)
