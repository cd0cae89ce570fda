"""The listener contract: what the user's code answers, and how an answer becomes a state."""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from typing import Any

from .message import LocalTransactionState, Message, exception_text, remark_text

logger = logging.getLogger(__name__)


class TransactionListener(abc.ABC):
    """The user's side of a transaction: run it, and later say what became of it."""

    @abc.abstractmethod
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState | None:
        """Run the local transaction. ``message`` is the send's own copy of the caller's message, with
        ``transaction_id`` set: store the id with your data so that
        [`check_local_transaction`][redis_txmq.core.listener.TransactionListener.check_local_transaction] can find the
        outcome. ``None`` or an exception means UNKNOWN."""

    @abc.abstractmethod
    def check_local_transaction(self, message: Message) -> LocalTransactionState | None:
        """Answer a check-back for a transaction whose outcome never reached Redis."""


def local_state(
    method: Callable[..., Any], message: Message, what: str, *args: Any
) -> tuple[LocalTransactionState, str | None]:
    """Call a listener method with ``args``; anything but COMMIT or ROLLBACK is UNKNOWN, with a remark saying why.

    An exception is logged with the transaction id and kept as the remark; it never escapes, so a throwing
    listener cannot wedge a producer or a check worker (apache/rocketmq #9500)."""
    try:
        answer = method(*args)
    except Exception as exc:  # noqa: BLE001 - the contract: an exception is UNKNOWN, logged, kept
        return state_of_error(exc, message, what)
    return state_of_answer(answer, message, what)


def state_of_error(exc: Exception, message: Message, what: str) -> tuple[LocalTransactionState, str]:
    """A listener method raised: UNKNOWN, logged with the transaction id, the exception kept as the remark."""
    logger.error("tx=%s topic=%s %s raised; state UNKNOWN", message.transaction_id, message.topic, what, exc_info=exc)
    return LocalTransactionState.UNKNOWN, remark_text(f"{what} raised {exception_text(exc)}")


def state_of_answer(answer: Any, message: Message, what: str) -> tuple[LocalTransactionState, str | None]:
    """A listener method's answer as a state: ``None`` and anything but a state are UNKNOWN."""
    if answer is None:
        return LocalTransactionState.UNKNOWN, None
    try:
        return LocalTransactionState(answer), None
    except ValueError:
        logger.error(
            "tx=%s topic=%s %s returned %r; state UNKNOWN", message.transaction_id, message.topic, what, answer
        )
        return LocalTransactionState.UNKNOWN, remark_text(f"{what} returned {_answer_text(answer)}")


def _answer_text(answer: Any) -> str:
    """``repr`` of an answer that is not a state; a ``__repr__`` that raises names the type instead."""
    try:
        return repr(answer)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not escape the listener's contract
        return f"a {type(answer).__name__}"
