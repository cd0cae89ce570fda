"""The transaction log on Redis: every state change of a transaction is one call of one Lua script.

Producer, checker and operator commands all end transactions through :meth:`RedisBroker.end_transaction`
(``lua/end_transaction.lua``), so there is one commit path to read and to trust.
"""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import redis

from . import entries
from .config import Settings
from .connection import REDIS_ERRORS
from .direct import ScriptRunner
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
from .keys import PRODUCERS_CONSUMER_GROUP, TOPIC_REGISTRY, GroupKeys, TopicKeys
from .message import LocalTransactionState, Message
from .scripts import preload, register_topic_script

logger = logging.getLogger(__name__)


class EndSource(str, enum.Enum):
    """Who ended a transaction; kept in the op record."""

    PRODUCER = "producer"
    CHECKER = "checker"
    OPERATOR = "operator"


@dataclass(slots=True)
class PrepareResult:
    half_id: str
    state: str
    duplicate: bool


@dataclass(slots=True)
class EndResult:
    """``state`` is PREPARED (UNKNOWN recorded), COMMIT or ROLLBACK; ``applied`` is False for a repeat.
    ``check_request`` is the pending check request the end retired ('' for none); the broker deletes it."""

    state: str
    half_id: str
    committed_id: str | None
    applied: bool
    check_request: str = ""


@dataclass(slots=True)
class EndCall:
    """One end of a transaction, as queued by a one-way producer or applied from a check answer.

    Not frozen: these are made per send, and a frozen dataclass costs five times as much to build."""

    keys: TopicKeys
    transaction_id: str
    producer_group: str
    outcome: LocalTransactionState
    source: EndSource
    remark: str | None = None
    half_id: str | None = None


@dataclass(frozen=True)
class DueCheck:
    """A transaction the checker claimed for a check-back; ``fields`` are its half message's fields;
    ``previous_request`` is its check request still pending from an earlier check ('' for none)."""

    transaction_id: str
    half_id: str
    check_times: int
    fields: dict[str, bytes]
    previous_request: str = ""

    @property
    def producer_group(self) -> str:
        return entries.text(self.fields.get(entries.PRODUCER_GROUP)) or ""


@dataclass(frozen=True)
class ClaimResult:
    to_check: list[DueCheck]
    dead_lettered: list[tuple[str, str]]
    abandoned_requests: list[tuple[str, str]] = field(default_factory=list)
    """``(producer group, request id)`` of the check requests of the dead-lettered transactions."""


class DeadAction(str, enum.Enum):
    """An operator's decision on a dead-lettered transaction."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    RECHECK = "RECHECK"


_ERRORS: dict[str, tuple[type[TransactionError], str]] = {
    "NOT_FOUND": (TransactionNotFoundError, "check the topic and transaction id"),
    "CONFLICT": (TransactionConflictError, "an end decides once; the first outcome stands"),
    "GROUP_MISMATCH": (ProducerGroupMismatchError, "end it from a producer of the group that sent it"),
    "DEAD": (TransactionDeadLetteredError, "resolve it with `txmq dead commit|rollback|recheck`"),
    "NOT_DEAD": (TransactionError, "wait for the check-back, or end it from a producer of its group"),
}


class RedisBroker:
    """Calls the transaction scripts on one client (``redis.Redis`` or ``redis.cluster.RedisCluster``)."""

    def __init__(self, client: Any, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or Settings()
        self._prepare = register_topic_script(client, "prepare_half")
        self._end = register_topic_script(client, "end_transaction")
        self._claim_checks = register_topic_script(client, "claim_checks")
        self._sweep_half = register_topic_script(client, "sweep_half")
        self._dead_resolve = register_topic_script(client, "dead_resolve")
        self._note_requests = register_topic_script(client, "note_requests")
        self._registered: set[str] = set()
        self._registry_lock = threading.Lock()
        self.runner = ScriptRunner(client)
        self._dedupe_window_ms = int(self.settings.dedupe_window * 1000)

    def close(self) -> None:
        """Close the connections of the send path's fast lane (the client itself stays open)."""
        self.runner.close()

    def load_scripts(self) -> None:
        """Load the scripts into Redis; raises :class:`TxMQConnectionError` when Redis cannot be reached."""
        try:
            preload(
                self._prepare, self._end, self._claim_checks, self._sweep_half, self._dead_resolve, self._note_requests
            )
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(f"could not load the transaction scripts into Redis: {exc}") from exc

    def registered_streams(self) -> frozenset[str]:
        """The topic streams this process registered: re-asserted with the heartbeat, so the registry heals
        after Redis lost its data."""
        return frozenset(self._registered)

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
            reply = self.runner.run(self._prepare, keys.script_keys(), args)
        except REDIS_ERRORS as exc:
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
        end = EndCall(keys, transaction_id, producer_group, outcome, source, remark, half_id)
        try:
            reply = self.runner.run(self._end, keys.script_keys(), self._end_args(end))
        except REDIS_ERRORS as exc:
            raise _end_call_error(exc, keys, transaction_id) from exc
        result = _end_result(reply, keys, transaction_id)
        if result.check_request:
            self.drop_check_requests([(producer_group, result.check_request)])
        return result

    def end_transactions(self, ends: list[EndCall]) -> list[EndResult | TxMQError]:
        """Apply many ends in one pipeline (a one-way producer's flusher, a checker's batch of answers); each
        script stays atomic.

        Returns, in order, the :class:`EndResult` or the :class:`TxMQError` of each end; a connection
        failure of the whole pipeline is raised as :class:`TxMQConnectionError`."""
        calls = [(self._end, end.keys.script_keys(), self._end_args(end)) for end in ends]
        try:
            replies = self.runner.run_many(calls)
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(
                f"{len(ends)} end calls failed ({exc}); the check-back will resolve those transactions"
            ) from exc
        results: list[EndResult | TxMQError] = []
        for end, reply in zip(ends, replies, strict=True):
            if isinstance(reply, redis.RedisError):
                results.append(_end_call_error(reply, end.keys, end.transaction_id))
                continue
            try:
                results.append(_end_result(reply, end.keys, end.transaction_id))
            except TxMQError as exc:
                results.append(exc)
        self.drop_check_requests(
            [
                (end.producer_group, result.check_request)
                for end, result in zip(ends, results, strict=True)
                if isinstance(result, EndResult) and result.check_request
            ]
        )
        return results

    def drop_check_requests(self, requests: list[tuple[str, str]]) -> None:
        """Delete check requests ``(producer group, request id)`` whose transaction ended or was dead-lettered.

        Best effort: a request left behind is answered by a producer and applied as a repeat, or found stale by
        the checker's next claim of the same transaction (which deletes it)."""
        if not requests:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for group, request_id in requests:
                stream = GroupKeys(group).check_requests
                pipe.xack(stream, PRODUCERS_CONSUMER_GROUP, request_id)
                pipe.xdel(stream, request_id)
            pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            logger.warning("could not delete %d answered check requests: %s", len(requests), exc)

    def note_check_requests(self, keys: TopicKeys, sent: list[tuple[str, str]]) -> list[str]:
        """Remember ``(transaction id, request id)`` of the check requests just sent (``lua/note_requests.lua``);
        returns the ids of requests whose transaction ended meanwhile (the caller deletes them)."""
        args = [value for pair in sent for value in pair]
        reply = self._call(self._note_requests, keys, args, "note check requests")
        if entries.text(reply[0]) != "OK":
            raise TxMQError(f"topic {keys.topic!r}: note_requests refused: {_reply(reply, 3)[1:]}")
        return [entries.text(request_id) or "" for request_id in reply[1]]

    def _end_args(self, end: EndCall) -> list[Any]:
        return [
            end.transaction_id,
            end.producer_group,
            LocalTransactionState(end.outcome).value,
            end.source.value,
            end.remark or "",
            self._dedupe_window_ms,
            self.settings.op_stream_maxlen,
            end.half_id or "",
        ]

    def resolve_dead(self, keys: TopicKeys, transaction_id: str, action: DeadAction, remark: str = "") -> EndResult:
        """Commit, roll back or re-check a dead-lettered transaction (``lua/dead_resolve.lua``)."""
        args = [
            transaction_id,
            DeadAction(action).value,
            self._dedupe_window_ms,
            self.settings.op_stream_maxlen,
            remark,
        ]
        reply = self._call(self._dead_resolve, keys, args, f"dead-letter {action.value}", transaction_id)
        return _end_result(reply, keys, transaction_id)

    def claim_checks(self, keys: TopicKeys, limit: int) -> ClaimResult:
        """Claim up to ``limit`` transactions due for a check-back (``lua/claim_checks.lua``)."""
        s = self.settings
        args = [
            int(s.transaction_timeout * 1000),
            int(s.check_interval * 1000),
            s.check_max,
            int(s.max_age * 1000),
            limit,
            self._dedupe_window_ms,
        ]
        reply = self._call(self._claim_checks, keys, args, "claim checks")
        if entries.text(reply[0]) != "OK":
            raise TxMQError(f"topic {keys.topic!r}: claim_checks refused: {_reply(reply, 3)[1:]}")
        text = entries.text
        to_check = [
            DueCheck(
                transaction_id=text(txid) or "",
                half_id=text(half_id) or "",
                check_times=int(check_times),
                fields=entries.field_map(flat),
                previous_request=text(previous) or "",
            )
            for txid, half_id, check_times, flat, previous in reply[1]
        ]
        dead = [(text(txid) or "", text(reason) or "") for txid, reason, _, _ in reply[2]]
        abandoned = [(text(group) or "", text(request) or "") for _, _, group, request in reply[2] if text(request)]
        return ClaimResult(to_check, dead, [(g, r) for g, r in abandoned if g])

    def sweep_half(self, keys: TopicKeys, cursor: str, count: int) -> tuple[str, list[tuple[str, str]]]:
        """Dead-letter half entries that no transaction owns; returns the next cursor ('0-0' at the end)."""
        reply = self._call(self._sweep_half, keys, [cursor, count], "sweep half stream")
        buried = [(entries.text(entry_id) or "", entries.text(reason) or "") for entry_id, reason in reply[2]]
        return entries.text(reply[1]) or "0-0", buried

    def _call(self, script: Any, keys: TopicKeys, args: list[Any], what: str, transaction_id: str = "") -> Any:
        try:
            return script(keys=keys.script_keys(), args=args)
        except REDIS_ERRORS as exc:
            tx = f", transaction {transaction_id}" if transaction_id else ""
            raise TxMQConnectionError(f"topic {keys.topic!r}{tx}: {what} failed: {exc}") from exc


def _end_call_error(exc: Exception, keys: TopicKeys, transaction_id: str) -> TxMQError:
    where = f"topic {keys.topic!r}, transaction {transaction_id}"
    if isinstance(exc, redis.ResponseError):
        return TxMQError(f"{where}: the end script failed ({exc}); the transaction is still in flight")
    return TxMQConnectionError(f"{where}: end call failed ({exc}); the check-back will resolve it")


def _end_result(reply: Any, keys: TopicKeys, transaction_id: str) -> EndResult:
    """Map an end-like script reply to an :class:`EndResult` or the matching :class:`TransactionError`."""
    if type(reply) is list and len(reply) == 6 and reply[0] == b"OK":  # the common case, decoded without a detour
        committed, request = reply[3], reply[5]
        return EndResult(
            reply[1].decode(),
            reply[2].decode(),
            committed.decode() or None,
            reply[4] == b"APPLIED",
            request.decode() if request else "",
        )
    status, first, second, third, fourth, fifth = _reply(reply, 6)
    if status == "OK":
        return EndResult(first, second, third or None, fourth == "APPLIED", fifth)
    where = f"topic {keys.topic!r}, transaction {transaction_id}"
    if first in ("CORRUPT", "WRONGTYPE"):
        raise CorruptEntryError(f"{where}: {second}")
    if first not in _ERRORS:
        raise TxMQError(f"{where}: refused: {first} {second}")
    error, advice = _ERRORS[first]
    raise error(f"{where}: {second}; {advice}", topic=keys.topic, transaction_id=transaction_id)


def _reply(reply: Any, width: int) -> list[str]:
    # On the send path: decode inline rather than through entries.text for each value.
    values = [v.decode("utf-8", "replace") if type(v) is bytes else ("" if v is None else str(v)) for v in reply]
    return values + [""] * (width - len(values))
