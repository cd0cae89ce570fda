"""The transaction protocol without I/O: what the scripts are sent and how their replies are read.

The sync ``redis_txmq.sync.broker.RedisBroker`` and the asyncio ``redis_txmq.asyncio.broker.AsyncRedisBroker`` only do
the I/O; arguments, reply parsing, error mapping and the results live here, once.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

import redis

from . import entries
from .batching import UnsendableCallError
from .config import Settings
from .errors import (
    CorruptEntryError,
    DurabilityError,
    PrepareError,
    ProducerGroupMismatchError,
    TransactionConflictError,
    TransactionDeadLetteredError,
    TransactionError,
    TransactionNotFoundError,
    TxMQConnectionError,
    TxMQError,
)
from .keys import PRODUCERS_CONSUMER_GROUP, SCHEDULE, GroupKeys, TopicKeys
from .message import LocalTransactionState, Message, remark_text
from .states import State

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
    wake: str = ""
    """'' or the time (server ms) to score the topic at in the checkers' schedule: the prepare could not write it
    (no ``SCHEDULE`` in its keys, Cluster) and the caller must."""


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

    @property
    def parent_transaction_id(self) -> str:
        """The transaction of several messages this one belongs to ('' for a transaction of one message)."""
        return entries.text(self.fields.get(entries.PARENT_TRANSACTION_ID)) or ""


@dataclass(frozen=True)
class GivenUp:
    """A message of a transaction of several that reached ``check_max`` or ``max_age``: ended with its transaction's
    decision when there is one, else dead-lettered (its record pinned first)."""

    transaction_id: str
    half_id: str
    reason: str
    producer_group: str
    parent_transaction_id: str


@dataclass(frozen=True)
class ClaimResult:
    to_check: list[DueCheck]
    dead_lettered: list[tuple[str, str]]
    abandoned_requests: list[tuple[str, str]] = field(default_factory=list)
    """``(producer group, request id)`` of the check requests of the dead-lettered transactions."""
    given_up: list[GivenUp] = field(default_factory=list)
    seen_ms: str = ""
    """The server time of the claim: what the checker writes to the schedule is as of then."""
    next_ms: str = ""
    """When to look at the topic next ('' for nothing to look at): see ``lua/schedule_topics.lua``."""


class DeadAction(str, enum.Enum):
    """An operator's decision on a dead-lettered transaction."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    RECHECK = "RECHECK"


RESOLVES_TO = {
    DeadAction.COMMIT: State.COMMITTED,
    DeadAction.ROLLBACK: State.ROLLED_BACK,
    DeadAction.RECHECK: State.IN_FLIGHT,
}
"""Where each action takes a dead-lettered transaction (``redis_txmq.core.states``)."""


ERRORS: dict[str, tuple[type[TransactionError], str]] = {
    "NOT_FOUND": (TransactionNotFoundError, "check the topic and transaction id"),
    "CONFLICT": (TransactionConflictError, "an end decides once; the first outcome stands"),
    "GROUP_MISMATCH": (ProducerGroupMismatchError, "end it from a producer of the group that sent it"),
    "DEAD": (TransactionDeadLetteredError, "resolve it with `txmq dead commit|rollback|recheck`"),
    "NOT_DEAD": (TransactionError, "wait for the check-back, or end it from a producer of its group"),
}


def prepare_args(
    message: Message, transaction_id: str, producer_group: str, keys: TopicKeys, parent_transaction_id: str = ""
) -> list[Any]:
    """ARGV of ``lua/prepare_half.lua``."""
    return entries.prepare_args(message, transaction_id, producer_group, keys.partition, parent_transaction_id)


class RecordAction(str, enum.Enum):
    """What a call of ``lua/decide_transaction.lua`` does to the record of a transaction of several messages."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    VOID = "VOID"
    """Sends that did not return: their messages are rolled back whatever the decision."""
    PIN = "PIN"
    """Messages the checker gives up on: the record outlives their dead letters."""
    UNPIN = "UNPIN"
    """Dead letters an operator resolved or re-checked."""
    READ = "READ"


@dataclass(frozen=True)
class TransactionRecord:
    """The record of a transaction of several messages (``txmq:decision:{X}``): the decision that stands (None while
    undecided), the indices of the messages whose send did not return, and whether this call decided."""

    transaction_id: str
    outcome: LocalTransactionState | None
    voided: frozenset[int] = frozenset()
    decided_now: bool = False
    producer_group: str = ""
    """The group that wrote the record ('' when unknown: not read, or no record)."""
    dead: frozenset[int] = frozenset()
    """The indices of its messages the checker dead-lettered (as a call of the script returns them)."""

    def outcome_of(self, message_transaction_id: str) -> LocalTransactionState | None:
        """What message ``<X>.<i>`` is ended with: ROLLBACK when its send did not return (whatever the decision),
        else the decision (None while undecided)."""
        index = message_index(self.transaction_id, message_transaction_id)
        if index is not None and index in self.voided:
            return LocalTransactionState.ROLLBACK
        return self.outcome


def message_index(transaction_id: str, message_transaction_id: str) -> int | None:
    """``i`` of message ``<transaction_id>.<i>``; None for an id of another form."""
    prefix, _, index = message_transaction_id.rpartition(".")
    return int(index) if prefix == transaction_id and index.isdigit() else None


def decide_args(
    transaction_id: str,
    producer_group: str,
    action: Any,
    source: EndSource,
    settings: Settings,
    indices: Any = (),
) -> list[Any]:
    """ARGV of ``lua/decide_transaction.lua``: the record is kept while a message of it is dead-lettered, else for
    ``transaction_record_lifetime`` (by default as long as one of its half messages may still be in flight,
    ``max_age``, and the dedupe window after that)."""
    return [
        transaction_id,
        producer_group,
        RecordAction(action.value if isinstance(action, LocalTransactionState) else action).value,
        source.value,
        settings.transaction_record_lifetime_ms,
        " ".join(str(i) for i in sorted(indices)),
    ]


def decide_call_error(exc: Exception, transaction_id: str) -> TxMQConnectionError:
    return TxMQConnectionError(f"transaction {transaction_id}: the decision could not be written ({exc})")


def record_result(reply: Any, transaction_id: str) -> TransactionRecord:
    """The record as a call of ``lua/decide_transaction.lua`` left it."""
    status, first, second, third, fourth = reply_strings(reply, 5)
    if status != "OK":
        where = f"transaction {transaction_id}"
        if first == "GROUP_MISMATCH":
            raise ProducerGroupMismatchError(
                f"{where}: {second}; decide it from a producer of that group", topic="", transaction_id=transaction_id
            )
        raise TxMQError(f"{where}: decision refused: {first} {second}")
    return TransactionRecord(
        transaction_id,
        LocalTransactionState(first) if first else None,
        frozenset(int(i) for i in second.split()),
        third == "DECIDED",
        dead=frozenset(int(i) for i in fourth.split()),
    )


def decision_not_durable(transaction_id: str, exc: DurabilityError) -> None:
    logger.warning(
        "tx=%s the record is written on the master but %s; its messages are ended by it, and if a failover loses "
        "it the check-back decides again from the local transaction",
        transaction_id,
        exc,
    )


def records_read(transaction_ids: list[str], replies: list[Any]) -> dict[str, TransactionRecord]:
    """The records read back (``HMGET outcome voided producer_group`` of each), by transaction id; absent ones are
    undecided."""
    found: dict[str, TransactionRecord] = {}
    for transaction_id, (outcome, voided, group) in zip(transaction_ids, replies, strict=True):
        name = entries.text(outcome)
        found[transaction_id] = TransactionRecord(
            transaction_id,
            LocalTransactionState(name) if name in ("COMMIT", "ROLLBACK") else None,
            frozenset(int(i) for i in (entries.text(voided) or "").split() if i.isdigit()),
            producer_group=entries.text(group) or "",
        )
    return found


def prepare_call_error(exc: Exception, message: Message, transaction_id: str) -> PrepareError:
    if isinstance(exc, UnsendableCallError):
        return PrepareError(
            f"topic {message.topic!r}, transaction {transaction_id}: the half message cannot be sent ({exc}); "
            "nothing was written and the local transaction was not run: fix the message's text"
        )
    return PrepareError(
        f"topic {message.topic!r}, transaction {transaction_id}: could not write the half message "
        f"({exc}); the local transaction was not run, retry the send"
    )


def prepare_not_durable(exc: DurabilityError, message: Message, transaction_id: str) -> PrepareError:
    return PrepareError(
        f"topic {message.topic!r}, transaction {transaction_id}: the half message is on the master but {exc}; the "
        "local transaction was not run (the check-back rolls the half message back), retry the send"
    )


def end_not_durable(exc: DurabilityError, keys: TopicKeys, transaction_id: str, outcome: Any) -> DurabilityError:
    return DurabilityError(
        f"topic {keys.topic!r}, transaction {transaction_id}: the {LocalTransactionState(outcome).value} is applied on "
        f"the master but {exc}; if a failover loses it, the check-back settles the transaction again",
        replies=exc.replies,
    )


def batch_not_durable(count: int, exc: DurabilityError) -> None:
    logger.warning(
        "%d end calls applied on the master but %s; a failover that loses them leaves those transactions to the "
        "check-back",
        count,
        exc,
    )


def refuse_topic_key(kind: Any, keys: TopicKeys, message: Message, transaction_id: str) -> None:
    """Raise when the topic stream's key holds another type (``TYPE``'s reply ``kind``).

    Checked when a process first sends to a topic stream, not in every prepare: the check cost each prepare a
    call. A key turned into another type later is caught by the end, which keeps the transaction in flight."""
    kind = entries.text(kind)
    if kind not in ("stream", "none"):
        raise PrepareError(
            f"topic {message.topic!r}, transaction {transaction_id}: prepare refused: WRONGTYPE the topic key "
            f"{keys.topic_stream} holds another type than a stream ({kind}); pick another topic or delete that key"
        )


def prepare_result(reply: Any, message: Message, transaction_id: str) -> PrepareResult:
    if type(reply) is list and len(reply) == 5 and reply[0] == b"OK":  # the common case, decoded without a detour
        half_id, state, third, wake = reply[1], reply[2], reply[3], reply[4]
        if type(half_id) is bytes and type(state) is bytes and type(wake) is bytes:
            return PrepareResult(half_id.decode(), state.decode(), third == b"DUPLICATE", wake.decode())
    status, first, second, third, wake = reply_strings(reply, 5)
    if status != "OK":
        raise PrepareError(f"topic {message.topic!r}, transaction {transaction_id}: prepare refused: {first} {second}")
    return PrepareResult(half_id=first, state=second, duplicate=third == "DUPLICATE", wake=wake)


_OUTCOME_TEXT = {state: state.value for state in LocalTransactionState}
_SOURCE_TEXT = {source: source.value for source in EndSource}


def end_args(end: EndCall, settings: Settings) -> list[Any]:
    """ARGV of ``lua/end_transaction.lua``. The remark is free text from anywhere (an exception's, a caller's of
    ``end_transaction``): sent as ``remark_text`` makes it, so that it never keeps the end from being applied."""
    return [
        end.transaction_id,
        end.producer_group,
        # a dict lookup per end: an enum's ``.value`` is a descriptor call, the constructor more than that
        _OUTCOME_TEXT.get(end.outcome) or LocalTransactionState(end.outcome).value,
        _SOURCE_TEXT.get(end.source) or EndSource(end.source).value,
        remark_text(end.remark) if end.remark else "",
        int(settings.dedupe_window * 1000),
        settings.op_stream_maxlen,
        end.half_id or "",
    ]


def end_results(ends: list[EndCall], replies: list[Any]) -> list[EndResult | TxMQError]:
    """The result (or the error) of each end of a pipeline, in order."""
    results: list[EndResult | TxMQError] = []
    for end, reply in zip(ends, replies, strict=True):
        if isinstance(reply, Exception):
            results.append(end_call_error(reply, end.keys, end.transaction_id))
            continue
        try:
            results.append(end_result(reply, end.keys, end.transaction_id))
        except TxMQError as exc:
            results.append(exc)
    return results


def batch_error(count: int, exc: Exception) -> TxMQConnectionError:
    return TxMQConnectionError(f"{count} end calls failed ({exc}); the check-back will resolve those transactions")


def retired_requests(ends: list[EndCall], results: list[EndResult | TxMQError]) -> list[tuple[str, str]]:
    """``(producer group, request id)`` of the check requests the ends retired: the caller deletes them."""
    return [
        (end.producer_group, result.check_request)
        for end, result in zip(ends, results, strict=True)
        if isinstance(result, EndResult) and result.check_request
    ]


def queue_drop_check_requests(pipe: Any, requests: list[tuple[str, str]]) -> None:
    """Queue on a (sync or asyncio) pipeline the deletion of check requests whose transaction ended."""
    for group, request_id in requests:
        stream = GroupKeys(group).check_requests
        pipe.xack(stream, PRODUCERS_CONSUMER_GROUP, request_id)
        pipe.xdel(stream, request_id)


def dead_resolve_args(transaction_id: str, action: DeadAction, remark: str, settings: Settings) -> list[Any]:
    """ARGV of ``lua/dead_resolve.lua``; the operator's remark as ``remark_text`` makes
    it."""
    return [
        transaction_id,
        DeadAction(action).value,
        int(settings.dedupe_window * 1000),
        settings.op_stream_maxlen,
        remark_text(remark) if remark else "",
    ]


def claim_args(settings: Settings, limit: int) -> list[Any]:
    """ARGV of ``lua/claim_checks.lua``."""
    return [
        int(settings.transaction_timeout * 1000),
        int(settings.check_interval * 1000),
        settings.check_max,
        int(settings.max_age * 1000),
        limit,
        int(settings.dedupe_window * 1000),
    ]


def claim_result(reply: Any, keys: TopicKeys) -> ClaimResult:
    if entries.text(reply[0]) != "OK":
        raise TxMQError(f"topic {keys.topic!r}: claim_checks refused: {reply_strings(reply, 3)[1:]}")
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
    given_up = [GivenUp(*(text(value) or "" for value in item)) for item in reply[3]]
    seen_ms, next_ms = text(reply[4]) or "", text(reply[5]) or ""
    return ClaimResult(to_check, dead, [(g, r) for g, r in abandoned if g], given_up, seen_ms, next_ms)


def due_topics_result(reply: Any) -> tuple[str, list[str]]:
    """``(now_ms, topic streams)`` of ``lua/due_topics.lua``."""
    if entries.text(reply[0]) != "OK":
        raise TxMQError(f"the checkers' schedule {SCHEDULE} could not be read: {reply_strings(reply, 3)[1:]}")
    return entries.text(reply[1]) or "", [entries.text(stream) or "" for stream in reply[2]]


def recheck_wake(reply: Any) -> str:
    """The time to wake the topic at after an applied RECHECK of ``lua/dead_resolve.lua`` ('' for none)."""
    return reply_strings(reply, 7)[6] if isinstance(reply, list) else ""


def schedule_result(reply: Any) -> None:
    """Raise what ``lua/schedule_topics.lua`` refused."""
    if entries.text(reply[0]) != "OK":
        raise TxMQError(f"the checkers' schedule {SCHEDULE} was not written: {reply_strings(reply, 3)[1:]}")


def schedule_call_error(exc: Exception, what: str) -> TxMQConnectionError:
    """A failed read or write of the checkers' schedule; the checker retries it next round."""
    return TxMQConnectionError(f"could not {what} the checkers' schedule {SCHEDULE}: {exc}; retried next round")


def bury_result(reply: Any, keys: TopicKeys) -> tuple[str, str]:
    """``(dead letter id or '', check request id or '')`` of ``lua/bury_half.lua``."""
    status, first, second = reply_strings(reply, 3)
    if status != "OK":
        raise TxMQError(f"topic {keys.topic!r}: bury_half refused: {first} {second}")
    return first, second


@dataclass(frozen=True)
class SentCheck:
    """A check request the checker just sent: ``request_id`` in its producer group's stream, and the request it
    replaced if no producer instance ever read that one (``unread_request``, '' otherwise): its check is given back,
    because ``check_max`` counts the checks that reached a producer, not those an outage swallowed."""

    transaction_id: str
    request_id: str
    unread_request: str = ""


@dataclass(frozen=True)
class NotedRequests:
    stale: list[str]
    """Ids of requests whose transaction ended between its claim and the note: the caller deletes them."""
    given_back: int
    """Checks taken off the count because the request they sent was never read."""


def note_requests_args(sent: list[SentCheck]) -> list[str]:
    """ARGV of ``lua/note_requests.lua``."""
    return [value for check in sent for value in (check.transaction_id, check.request_id, check.unread_request)]


def note_requests_result(reply: Any, keys: TopicKeys) -> NotedRequests:
    if entries.text(reply[0]) != "OK":
        raise TxMQError(f"topic {keys.topic!r}: note_requests refused: {reply_strings(reply, 3)[1:]}")
    return NotedRequests([entries.text(request_id) or "" for request_id in reply[1]], int(reply[2]))


def sweep_result(reply: Any) -> tuple[str, list[tuple[str, str]]]:
    buried = [(entries.text(entry_id) or "", entries.text(reason) or "") for entry_id, reason in reply[2]]
    return entries.text(reply[1]) or "0-0", buried


def script_call_error(exc: Exception, keys: TopicKeys, what: str, transaction_id: str = "") -> TxMQConnectionError:
    tx = f", transaction {transaction_id}" if transaction_id else ""
    return TxMQConnectionError(f"topic {keys.topic!r}{tx}: {what} failed: {exc}")


def end_call_error(exc: Exception, keys: TopicKeys, transaction_id: str) -> TxMQError:
    where = f"topic {keys.topic!r}, transaction {transaction_id}"
    if isinstance(exc, UnsendableCallError):
        return TxMQError(
            f"{where}: the end call cannot be sent ({exc}); the transaction is still in flight: the check-back "
            "resolves it"
        )
    if isinstance(exc, redis.ResponseError):
        return TxMQError(f"{where}: the end script failed ({exc}); the transaction is still in flight")
    return TxMQConnectionError(f"{where}: end call failed ({exc}); the check-back will resolve it")


def end_result(reply: Any, keys: TopicKeys, transaction_id: str) -> EndResult:
    """Map an end-like script reply to an ``EndResult`` or the matching
    [`TransactionError`][redis_txmq.core.errors.TransactionError]."""
    if type(reply) is list and len(reply) == 6 and reply[0] == b"OK":  # the common case, decoded without a detour
        committed, request = reply[3], reply[5]
        return EndResult(
            reply[1].decode(),
            reply[2].decode(),
            committed.decode() or None,
            reply[4] == b"APPLIED",
            request.decode() if request else "",
        )
    status, first, second, third, fourth, fifth = reply_strings(reply, 6)[:6]
    if status == "OK":
        return EndResult(first, second, third or None, fourth == "APPLIED", fifth)
    where = f"topic {keys.topic!r}, transaction {transaction_id}"
    if first in ("CORRUPT", "WRONGTYPE"):
        raise CorruptEntryError(f"{where}: {second}")
    if first not in ERRORS:
        raise TxMQError(f"{where}: refused: {first} {second}")
    error, advice = ERRORS[first]
    raise error(f"{where}: {second}; {advice}", topic=keys.topic, transaction_id=transaction_id)


def reply_strings(reply: Any, width: int) -> list[str]:
    # On the send path: decode inline rather than through entries.text for each value.
    values = [v.decode("utf-8", "replace") if type(v) is bytes else ("" if v is None else str(v)) for v in reply]
    return values + [""] * (width - len(values))
