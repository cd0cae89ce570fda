"""The transaction log on Redis: every state change of a transaction is one call of one Lua script.

Producer, checker and operator commands all end transactions through :meth:`RedisBroker.end_transaction`
(``lua/end_transaction.lua``), so there is one commit path to read and to trust.
"""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass
from typing import Any

import redis

from . import entries
from .config import Settings
from .errors import (
    CorruptEntryError,
    PrepareError,
    ProducerGroupMismatchError,
    TransactionConflictError,
    TransactionDeadLetteredError,
    TransactionError,
    TransactionNotFoundError,
    TxMQConnectionError,
    TxMQError,
)
from .keys import TOPIC_REGISTRY, TopicKeys
from .message import LocalTransactionState, Message
from .scripts import preload, register_topic_script

logger = logging.getLogger(__name__)


class EndSource(str, enum.Enum):
    """Who ended a transaction; kept in the op record."""

    PRODUCER = "producer"
    CHECKER = "checker"
    OPERATOR = "operator"


@dataclass(frozen=True)
class PrepareResult:
    half_id: str
    state: str
    duplicate: bool


@dataclass(frozen=True)
class EndResult:
    """``state`` is PREPARED (UNKNOWN recorded), COMMIT or ROLLBACK; ``applied`` is False for a repeat."""

    state: str
    half_id: str
    committed_id: str | None
    applied: bool


_ERRORS: dict[str, type[TxMQError]] = {
    "NOT_FOUND": TransactionNotFoundError,
    "CONFLICT": TransactionConflictError,
    "GROUP_MISMATCH": ProducerGroupMismatchError,
    "DEAD": TransactionDeadLetteredError,
}

_ADVICE = {
    "NOT_FOUND": "check the topic and transaction id",
    "CONFLICT": "an end decides once; the first outcome stands",
    "GROUP_MISMATCH": "end it from a producer of the group that sent it",
    "DEAD": "resolve it with `txmq dead commit|rollback|recheck`",
}


class RedisBroker:
    """Calls the transaction scripts on one client (``redis.Redis`` or ``redis.cluster.RedisCluster``)."""

    def __init__(self, client: Any, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or Settings()
        self._prepare = register_topic_script(client, "prepare_half")
        self._end = register_topic_script(client, "end_transaction")
        self._registered: set[str] = set()
        self._registry_lock = threading.Lock()

    def load_scripts(self) -> None:
        """Load the scripts into Redis; raises :class:`TxMQConnectionError` when Redis cannot be reached."""
        try:
            preload(self._prepare, self._end)
        except redis.RedisError as exc:
            raise TxMQConnectionError(f"could not load the transaction scripts into Redis: {exc}") from exc

    def register_topic(self, keys: TopicKeys) -> None:
        """Add the topic stream to the registry the checker walks; once per process and stream."""
        stream = keys.topic_stream
        if stream in self._registered:
            return
        with self._registry_lock:
            if stream not in self._registered:
                self.client.sadd(TOPIC_REGISTRY, stream)
                self._registered.add(stream)

    def prepare_half(
        self, keys: TopicKeys, message: Message, transaction_id: str, producer_group: str
    ) -> PrepareResult:
        """Write the half message (``lua/prepare_half.lua``); safe to retry with the same transaction id."""
        args = entries.prepare_args(message, transaction_id, producer_group, keys.partition)
        try:
            self.register_topic(keys)
            reply = self._prepare(keys=keys.script_keys(), args=args)
        except redis.RedisError as exc:
            raise PrepareError(
                f"topic {message.topic!r}, transaction {transaction_id}: could not write the half message "
                f"({exc}); the local transaction was not run, retry the send"
            ) from exc
        status, first, second, third = _reply(reply, 4)
        if status != "OK":
            raise PrepareError(
                f"topic {message.topic!r}, transaction {transaction_id}: prepare refused: {first} {second}"
            )
        return PrepareResult(half_id=first, state=second, duplicate=third == "DUPLICATE")

    def end_transaction(
        self,
        keys: TopicKeys,
        transaction_id: str,
        producer_group: str,
        outcome: LocalTransactionState,
        *,
        source: EndSource,
        remark: str | None = None,
        half_id: str | None = None,
    ) -> EndResult:
        """Apply COMMIT / ROLLBACK (or record the remark of UNKNOWN) in one atomic script call."""
        args = [
            transaction_id,
            producer_group,
            LocalTransactionState(outcome).value,
            source.value,
            remark or "",
            int(self.settings.dedupe_window * 1000),
            self.settings.op_stream_maxlen,
            half_id or "",
        ]
        where = f"topic {keys.topic!r}, transaction {transaction_id}"
        try:
            reply = self._end(keys=keys.script_keys(), args=args)
        except redis.RedisError as exc:
            raise TxMQConnectionError(f"{where}: end call failed ({exc}); the check-back will resolve it") from exc
        status, first, second, third, fourth = _reply(reply, 5)
        if status == "OK":
            return EndResult(state=first, half_id=second, committed_id=third or None, applied=fourth == "APPLIED")
        if first == "CORRUPT":
            raise CorruptEntryError(f"{where}: {second}")
        error = _ERRORS.get(first)
        if error is None or not issubclass(error, TransactionError):
            raise TxMQError(f"{where}: end refused: {first} {second}")
        raise error(f"{where}: {second}; {_ADVICE[first]}", topic=keys.topic, transaction_id=transaction_id)


def _reply(reply: Any, width: int) -> list[str]:
    values = [entries.text(v) or "" for v in reply]
    return values + [""] * (width - len(values))
