"""The listener contract for asyncio services: ``async def`` methods, awaited on the loop.

Not generated into the sync listener (``redis_txmq/core/listener.py``), and not its source: the sync contract is the
user's plain methods, and this one adds what only asyncio needs (a sync listener's methods run in a thread)."""

from __future__ import annotations

import abc
import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from ..core.listener import state_of_answer, state_of_error
from ..core.message import LocalTransactionState, Message


class TransactionListener(abc.ABC):
    """The user's side of a transaction, as coroutines. The asyncio producer also takes a sync
    [`redis_txmq.TransactionListener`][redis_txmq.core.listener.TransactionListener]: its methods then run in a thread,
    never blocking the loop."""

    @abc.abstractmethod
    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState | None:
        """Run the local transaction; store ``message.transaction_id`` with its data. ``None`` or an exception
        means UNKNOWN."""

    @abc.abstractmethod
    async def check_local_transaction(self, message: Message) -> LocalTransactionState | None:
        """Answer a check-back for a transaction whose outcome never reached Redis."""


async def local_state(
    method: Callable[..., Any], message: Message, what: str, *args: Any
) -> tuple[LocalTransactionState, str | None]:
    """Await a listener method (a sync one runs in a thread); anything but COMMIT or ROLLBACK is UNKNOWN, an
    exception is logged and kept as the remark. Cancellation is not an answer: it propagates."""
    try:
        if inspect.iscoroutinefunction(method):
            answer = await method(*args)
        else:
            answer = await asyncio.to_thread(method, *args)
            if inspect.isawaitable(answer):  # a sync wrapper around an async checker
                answer = await answer
    except Exception as exc:  # noqa: BLE001 - the contract: an exception is UNKNOWN, logged, kept
        return state_of_error(exc, message, what)
    return state_of_answer(answer, message, what)
