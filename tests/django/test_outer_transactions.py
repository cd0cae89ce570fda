"""A message is published when the outermost database transaction holding its log row commits, never before it
and never when it rolls back: Django's own machinery drives it — the test client with ``ATOMIC_REQUESTS`` on (every
view in the request's transaction, the guide's ``transaction.atomic()`` only a savepoint), ``durable`` blocks, nested
blocks, ``on_commit`` from a thread of ``sync_to_async`` — on SQLite, PostgreSQL and MariaDB.

Defect (issue 31, 1): leaving the handle's block sent COMMIT while the request's transaction was still open: the
message was on the topic before the order could be read, and stayed there when the view then failed and the request
rolled back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.test import AsyncClient, Client
from orders import txmq as example_txmq
from orders.models import Order

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq import asyncio as txmq_asyncio
from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys
from redis_txmq.django import TransactionLog
from redis_txmq.django.models import TransactionLogEntry

from ..helpers import check_until_settled, published_of, wait_until
from .outer_urls import STATE, OrderListener

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
CHECK_NOW = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)
KEYS = TopicKeys("orders")
EXAMPLE_KEYS = TopicKeys(example_txmq.TOPIC)
"""The example's own topic: its ``place_order`` views publish there."""

pytestmark = pytest.mark.urls("tests.django.outer_urls")


def published(client: Any, transaction_id: str, keys: TopicKeys = KEYS) -> int:
    return published_of(client, keys.topic_stream, transaction_id)


def settle_in_flight(client: Any) -> None:
    check_until_settled(client, CHECK_NOW, KEYS.inflight)


@pytest.fixture
def atomic_requests(django_database: str, real_client: Any, redis_url: str) -> Iterator[Client]:
    """Django's test client with ``ATOMIC_REQUESTS`` on for the test's database, the views' producers and log."""
    settings_dict = connections.settings[django_database]
    previous = settings_dict.get("ATOMIC_REQUESTS", False)
    settings_dict["ATOMIC_REQUESTS"] = True
    connections[django_database].settings_dict["ATOMIC_REQUESTS"] = True
    log = TransactionLog(using=django_database, local_transaction_max_seconds=0, lock_timeout_seconds=2)
    try:
        with (
            TransactionProducer("order_group", checker=log.checker(), redis_url=redis_url, settings=CHECK_NOW) as p,
            TransactionProducer("order_listener", OrderListener(), redis_url=redis_url, settings=CHECK_NOW) as lp,
        ):
            STATE.clear()
            STATE.update(alias=django_database, producer=p, listener_producer=lp, log=log, client=real_client)
            STATE.update(seen={}, results={})
            yield Client(raise_request_exception=False)
    finally:
        settings_dict["ATOMIC_REQUESTS"] = previous
        connections[django_database].settings_dict["ATOMIC_REQUESTS"] = previous


@pytest.mark.parametrize(("view", "messages"), [("handle", 1), ("several", 2), ("listener", 1)])
def test_under_atomic_requests_the_message_waits_for_the_request_to_commit(
    atomic_requests: Client, real_client: Any, django_database: str, view: str, messages: int
) -> None:
    """The view's handle (or listener) has ended while the request's transaction is open: nothing is visible yet;
    once the response is out (the request committed), the message is published, once."""
    response = atomic_requests.post(f"/{view}/1")
    assert response.status_code == 201, response.content
    transaction_id = STATE["last"]
    assert STATE["seen"][transaction_id] == 0, "published before the request's transaction committed"
    assert published(real_client, transaction_id) == messages
    assert Order.objects.using(django_database).filter(order_id=1).exists()
    if view != "several":
        assert STATE["results"][transaction_id].local_transaction_state is UNKNOWN  # as the block ended
    assert real_client.hlen(KEYS.inflight) == 0, "ended once the request committed: nothing left to check"


@pytest.mark.parametrize("view", ["handle", "several", "listener"])
def test_under_atomic_requests_a_failed_request_publishes_nothing(
    atomic_requests: Client, real_client: Any, django_database: str, view: str
) -> None:
    """The view fails after its block ended normally: the request's transaction rolls back with the order and its
    log row, and the message is never published — the check-back finds no row, fences it and rolls it back."""
    response = atomic_requests.post(f"/{view}/2?fail=1")
    assert response.status_code == 500
    transaction_id = STATE["last"]
    assert STATE["seen"][transaction_id] == 0
    assert not Order.objects.using(django_database).filter(order_id=2).exists()
    settle_in_flight(real_client)
    assert published(real_client, transaction_id) == 0
    assert TransactionLogEntry.objects.using(django_database).get(pk=transaction_id).state == "ROLLBACK", (
        "the check-back fenced the transaction"
    )


def test_a_durable_block_under_atomic_requests_is_refused_and_rolls_back(
    atomic_requests: Client, real_client: Any, django_database: str
) -> None:
    """``atomic(durable=True)`` is Django's way to insist on the outermost transaction: under ATOMIC_REQUESTS it
    raises, the handle rolls back at once, nothing is published or saved."""
    response = atomic_requests.post("/handle/3?durable=1")
    assert response.status_code == 500
    assert not real_client.xrange(KEYS.topic_stream)
    assert real_client.hlen(KEYS.inflight) == 0, "rolled back by the handle, not left to the check-back"
    assert not Order.objects.using(django_database).filter(order_id=3).exists()


def test_the_examples_own_view_under_atomic_requests(
    django_database: str, real_client: Any, txmq_redis: str, atomic_requests: Client
) -> None:
    """The example's ``place_order`` (the guide's pattern, on the default database) under ATOMIC_REQUESTS: the
    order is published only after the request commits, and not at all when the request fails afterwards."""
    if django_database != "default":
        pytest.skip("the example's service uses the default database")
    try:
        ok = atomic_requests.post(
            "/example", {"id": 7, "customer": "ada", "amount": 5}, content_type="application/json"
        )
        assert ok.status_code == 201, ok.content
        first = STATE["last"]
        failed = atomic_requests.post(
            "/example?fail=1", {"id": 8, "customer": "bob", "amount": 5}, content_type="application/json"
        )
        assert failed.status_code == 500
        second = STATE["last"]
        assert STATE["seen"] == {first: 0, second: 0}
        assert published(real_client, first, EXAMPLE_KEYS) == 1
        assert not Order.objects.filter(order_id=8).exists()
        # the example's producer answers from the example's log (30 s before it fences): end it as an operator's
        # check would, with a log that fences at once
        checker = Checker(real_client, CHECK_NOW)
        assert published(real_client, second, EXAMPLE_KEYS) == 0
        fence = TransactionLog(local_transaction_max_seconds=0)
        half = real_client.xrange(EXAMPLE_KEYS.half_stream)
        assert [f[b"transaction_id"].decode() for _, f in half] == [second]
        message = Message(example_txmq.TOPIC, b"{}", transaction_id=second)
        assert fence.check(message) is ROLLBACK
        wait_until(lambda: checker.run_round() is not None and real_client.hlen(EXAMPLE_KEYS.inflight) == 0, timeout=30)
        assert published(real_client, second, EXAMPLE_KEYS) == 0
    finally:
        example_txmq.shutdown_producer()


def test_the_examples_async_view_runs_beside_atomic_requests(
    django_database: str, real_client: Any, txmq_redis: str, atomic_requests: Client
) -> None:
    """Django refuses an async view under ATOMIC_REQUESTS unless it is marked ``non_atomic_requests`` (the
    example's is): through Django's AsyncClient its order is saved and published once."""
    if django_database != "default":
        pytest.skip("the example's service uses the default database")

    async def scenario() -> Any:
        try:
            return await AsyncClient().post(
                "/async/orders", {"id": 9, "customer": "ada", "amount": 5}, content_type="application/json"
            )
        finally:
            await example_txmq.shutdown_async_producer()

    response = asyncio.run(scenario())
    assert response.status_code == 201, response.content
    assert published(real_client, response.json()["transaction_id"], EXAMPLE_KEYS) == 1
    assert Order.objects.filter(order_id=9).exists()


def test_a_block_that_raises_after_its_database_commit_still_commits(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    """The handle's block committed its atomic block (the outermost: no ATOMIC_REQUESTS), then raised: the order
    is in the database, so the message goes with it; the exception goes on. (It was rolled back: an order saved
    and never published.)"""
    log = TransactionLog(using=django_database, local_transaction_max_seconds=30, lock_timeout_seconds=2)
    with TransactionProducer("order_group", checker=log.checker(), redis_url=redis_url, settings=CHECK_NOW) as p:
        with pytest.raises(ValueError, match="after the commit"), p.transaction(Message("orders", b"4")) as tx:
            with transaction.atomic(using=django_database):
                log.record(tx)
                Order.objects.using(django_database).create(
                    order_id=4, transaction_id=tx.transaction_id, customer="ada", amount=1
                )
            raise ValueError("something failed after the commit")
    assert tx.result.local_transaction_state is COMMIT and tx.result.committed_id
    assert published(real_client, tx.transaction_id) == 1


def test_a_rolled_back_savepoint_rolls_the_message_back(django_database: str, real_client: Any, redis_url: str) -> None:
    """Inside a caller's transaction, the block catches its savepoint's failure and ends normally: its log row was
    rolled back, so the message is rolled back at once, whatever the outer transaction does."""
    log = TransactionLog(using=django_database, local_transaction_max_seconds=30, lock_timeout_seconds=2)
    with TransactionProducer("order_group", checker=log.checker(), redis_url=redis_url, settings=CHECK_NOW) as p:
        with transaction.atomic(using=django_database):
            with p.transaction(Message("orders", b"5")) as tx:
                try:
                    with transaction.atomic(using=django_database):
                        log.record(tx)
                        raise IntegrityError("a duplicate order")
                except IntegrityError:
                    pass
            assert tx.result.local_transaction_state is ROLLBACK
    assert published(real_client, tx.transaction_id) == 0
    assert real_client.hlen(KEYS.inflight) == 0


def test_asyncio_handle_waits_for_an_outer_commit_on_another_thread(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    """The asyncio handle, the atomic blocks on ``sync_to_async``'s thread, the outer one still open when the handle
    ends: Django's ``on_commit`` runs on that thread, the COMMIT on the event loop; a second outer transaction that
    rolls back leaves its message unpublished."""
    log = TransactionLog(using=django_database, local_transaction_max_seconds=0, lock_timeout_seconds=2)

    def save(tx: Any, order_id: int) -> None:
        with transaction.atomic(using=django_database):
            log.record(tx)
            Order.objects.using(django_database).create(
                order_id=order_id, transaction_id=tx.transaction_id, customer="ada", amount=1
            )

    async def scenario() -> tuple[str, str]:
        async with txmq_asyncio.TransactionProducer(
            "order_group", checker=log.async_checker(), redis_url=redis_url, settings=CHECK_NOW
        ) as producer:
            outcomes = []
            for order_id, commit in ((11, True), (12, False)):
                outer = transaction.atomic(using=django_database)
                await sync_to_async(outer.__enter__)()
                try:
                    async with producer.transaction(Message("orders", b"%d" % order_id)) as tx:
                        await sync_to_async(save)(tx, order_id)
                    assert tx.result.local_transaction_state is UNKNOWN
                    assert published(real_client, tx.transaction_id) == 0, "published inside the outer transaction"
                finally:
                    error = None if commit else RuntimeError("the outer transaction fails")
                    await sync_to_async(outer.__exit__)(type(error) if error else None, error, None)
                outcomes.append(tx.transaction_id)
            committed = outcomes[0]
            for _ in range(500):
                if published(real_client, committed):
                    break
                await asyncio.sleep(0.02)
            await sync_to_async(connections.close_all)()
            return outcomes[0], outcomes[1]

    committed, rolled_back = asyncio.run(scenario())
    assert published(real_client, committed) == 1
    with TransactionProducer("order_group", checker=log.checker(), redis_url=redis_url, settings=CHECK_NOW):
        settle_in_flight(real_client)
    assert published(real_client, rolled_back) == 0
    assert published(real_client, committed) == 1


def test_commit_hooks_cut_short_leave_the_transaction_to_the_check_back(
    django_database: str, real_client: Any, redis_url: str
) -> None:
    """Another ``on_commit`` callback, registered first, raises after the database committed: Django runs no later
    callback, the watch's among them. The row is committed, but nothing here saw it: the transaction is in doubt,
    left to the check-back (it was rolled back: an order saved and never published)."""
    log = TransactionLog(using=django_database, local_transaction_max_seconds=30, lock_timeout_seconds=2)

    def send_welcome_email() -> None:
        raise RuntimeError("the mail server is down")

    with TransactionProducer("order_group", checker=log.checker(), redis_url=redis_url, settings=CHECK_NOW) as p:
        with pytest.raises(RuntimeError), p.transaction(Message("orders", b"13")) as tx:
            with transaction.atomic(using=django_database):
                transaction.on_commit(send_welcome_email, using=django_database)
                log.record(tx)
                Order.objects.using(django_database).create(
                    order_id=13, transaction_id=tx.transaction_id, customer="ada", amount=1
                )
        assert tx.result.local_transaction_state is UNKNOWN
        settle_in_flight(real_client)
    assert published(real_client, tx.transaction_id) == 1


def test_a_django_connection_error_leaves_the_transaction_to_the_check_back() -> None:
    """A COMMIT whose reply was lost raises Django's OperationalError (or InterfaceError) and Django drops the
    connection's commit hooks: the commit may have been applied, so the block decides nothing."""
    from django.db.utils import InterfaceError, OperationalError

    from redis_txmq.core.sending import outcome_of_block

    for error in (OperationalError("server closed the connection unexpectedly"), InterfaceError("closed")):
        assert outcome_of_block(type(error), error)[0] is UNKNOWN
    assert outcome_of_block(IntegrityError, IntegrityError("duplicate"))[0] is ROLLBACK
