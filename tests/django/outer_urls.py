"""Views of ``test_outer_transactions.py``: the guide's pattern (a handle around ``transaction.atomic()`` and
``log.record(tx)``), its listener and several-message forms, and the example's own ``place_order``, served by
Django's test client with ``ATOMIC_REQUESTS`` on, so that the block around the record is a savepoint of the
request's transaction. Each view notes whether its message was visible on the topic when the handle's block had
ended (before the request's transaction committed), then fails when asked to."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path

from redis_txmq import LocalTransactionState, Message, TransactionListener
from redis_txmq.core.keys import TopicKeys

TOPIC = TopicKeys("orders")
"""The topic of the guide's views; the example's own views publish on the example's topic (``orders/txmq.py``)."""

STATE: dict[str, Any] = {}
"""Set by the test: ``alias``, ``producer``, ``log``, ``client`` (a Redis client of its own); the views add to
``seen`` (transaction id -> entries on the topic when the block had ended)."""


def _visible(transaction_id: str, topic: TopicKeys) -> int:
    entries = STATE["client"].xrange(topic.topic_stream)
    return sum(1 for _, fields in entries if fields[b"transaction_id"].decode().split(".")[0] == transaction_id)


def _save(log: Any, recorded: Any, order_id: int, transaction_id: str, durable: bool = False) -> None:
    from orders.models import Order

    alias = STATE["alias"]
    with transaction.atomic(using=alias, durable=durable):
        log.record(recorded)
        Order.objects.using(alias).create(order_id=order_id, transaction_id=transaction_id, customer="ada", amount=1)


def _answer(request: HttpRequest, transaction_id: str, topic: TopicKeys = TOPIC) -> JsonResponse:
    STATE["seen"][transaction_id] = _visible(transaction_id, topic)
    STATE["last"] = transaction_id
    if request.GET.get("fail"):
        raise RuntimeError("the view fails after its order was placed: the request's transaction rolls back")
    return JsonResponse({"transaction_id": transaction_id}, status=201)


def handle(request: HttpRequest, order_id: int) -> JsonResponse:
    message = Message("orders", b"%d" % order_id, keys=f"order-{order_id}")
    with STATE["producer"].transaction(message) as tx:
        _save(STATE["log"], tx, order_id, tx.transaction_id, durable=bool(request.GET.get("durable")))
    STATE["results"][tx.transaction_id] = tx.result
    return _answer(request, tx.transaction_id)


def several(request: HttpRequest, order_id: int) -> JsonResponse:
    with STATE["producer"].transaction() as tx:
        tx.send(Message("orders", b"%d" % order_id, keys=f"order-{order_id}"))
        tx.send(Message("orders", b"%d-line" % order_id, keys=f"order-{order_id}"))
        _save(STATE["log"], tx, order_id, tx.transaction_id)
    return _answer(request, tx.transaction_id)


class OrderListener(TransactionListener):
    """RocketMQ's form: the listener runs the local transaction and records the message it receives."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        _save(STATE["log"], message, arg, message.transaction_id or "")
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return STATE["log"].check(message)


def listener(request: HttpRequest, order_id: int) -> JsonResponse:
    result = STATE["listener_producer"].send_message_in_transaction(Message("orders", b"%d" % order_id), order_id)
    STATE["results"][result.transaction_id] = result
    return _answer(request, result.transaction_id)


def example(request: HttpRequest) -> JsonResponse:
    """The example's own ``place_order`` (default database, its own producer and log)."""
    import json

    from orders.services import place_order
    from orders.txmq import TOPIC as EXAMPLE_TOPIC

    placed = place_order(json.loads(request.body))
    return _answer(request, placed.transaction_id, TopicKeys(EXAMPLE_TOPIC))


def _example_async() -> Any:
    from orders.views import place_order_async

    return place_order_async


urlpatterns = [
    path("async/orders", _example_async()),
    path("handle/<int:order_id>", handle),
    path("several/<int:order_id>", several),
    path("listener/<int:order_id>", listener),
    path("example", example),
]
