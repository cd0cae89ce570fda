"""``POST /orders`` (sync), ``POST /async/orders`` (async, under an ASGI server), ``GET /orders/<id>``."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponseNotAllowed, JsonResponse

from redis_txmq import TxMQConnectionError

from .models import Order
from .services import OrderRefused
from .services import place_order as place
from .services import place_order_async as place_async


def _order(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    """The order in the body; a request that does not fit is refused (422) before anything is written anywhere."""
    try:
        order = json.loads(request.body)
    except ValueError:
        return JsonResponse({"detail": "the body is not JSON"}, status=422)
    problems = []
    if not isinstance(order, dict) or set(order) != {"id", "customer", "amount"}:
        return JsonResponse({"detail": "an order is {id, customer, amount}"}, status=422)
    if not isinstance(order["id"], int) or isinstance(order["id"], bool) or order["id"] <= 0:
        problems.append("id must be a positive integer")
    if not isinstance(order["customer"], str) or not 0 < len(order["customer"]) <= 100:
        problems.append("customer must be 1 to 100 characters")
    if not isinstance(order["amount"], (int, float)) or isinstance(order["amount"], bool) or not order["amount"] > 0:
        problems.append("amount must be a positive number")
    if problems:
        return JsonResponse({"detail": problems}, status=422)
    return order


def place_order(request: HttpRequest) -> Any:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    order = _order(request)
    if isinstance(order, JsonResponse):
        return order
    try:
        return JsonResponse(asdict(place(order)), status=201)
    except OrderRefused as exc:
        return JsonResponse({"detail": str(exc)}, status=exc.status)
    except TxMQConnectionError:
        # the half message could not be written: the local transaction did not run, nothing was saved
        return JsonResponse({"detail": "cannot publish orders now; nothing was saved, retry later"}, status=503)


@transaction.non_atomic_requests  # Django refuses an async view under ATOMIC_REQUESTS; its blocks are its own
async def place_order_async(request: HttpRequest) -> Any:
    if request.method != "POST":  # (Django's method decorators take async views from 5.0 on only)
        return HttpResponseNotAllowed(["POST"])
    order = _order(request)
    if isinstance(order, JsonResponse):
        return order
    try:
        return JsonResponse(asdict(await place_async(order)), status=201)
    except OrderRefused as exc:
        return JsonResponse({"detail": str(exc)}, status=exc.status)
    except TxMQConnectionError:
        return JsonResponse({"detail": "cannot publish orders now; nothing was saved, retry later"}, status=503)


def read_order(request: HttpRequest, order_id: int) -> Any:
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    row = Order.objects.filter(order_id=order_id).first()
    if row is None:
        return JsonResponse({"detail": f"order {order_id} not found"}, status=404)
    return JsonResponse({"id": row.order_id, "customer": row.customer, "amount": float(row.amount)})
