"""The fields of stream entries, and their conversion to and from Python objects.

Topic stream entries (what any consumer reads; documented in the README):
``transaction_id``, ``body`` (bytes, unchanged), and when set ``keys`` (space-separated), ``tags`` and
``properties`` (a JSON object of strings). Half stream entries carry the same plus ``producer_group``,
``topic``, ``partition``, ``born_ms``, when the message has its own ``check_immunity_ms`` and, for one message of
a transaction of several, ``parent_transaction_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CorruptEntryError
from .message import Message

TRANSACTION_ID = "transaction_id"
BODY = "body"
KEYS = "keys"
TAGS = "tags"
PROPERTIES = "properties"
PRODUCER_GROUP = "producer_group"
TOPIC = "topic"
PARTITION = "partition"
BORN_MS = "born_ms"
CHECK_IMMUNITY_MS = "check_immunity_ms"
PARENT_TRANSACTION_ID = "parent_transaction_id"
"""On each half message of a transaction of several messages: that transaction's id (the id of its decision)."""

# check requests (checker -> producers of a group) carry the half message's fields plus these
STREAM = "stream"
HALF_ID = "half_id"
CHECK_TIMES = "check_times"
REQUESTED_MS = "requested_ms"
# replies (producer -> checkers)
STATE = "state"
REMARK = "remark"
PRODUCER = "producer"


def text(value: bytes | str | None) -> str | None:
    """Decode a reply value; ids and names are ASCII/UTF-8."""
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "replace")


def encode_properties(properties: Mapping[str, str] | None) -> str:
    """'' for none, so that an empty mapping costs nothing in the entry. Any Mapping is encoded as a JSON object
    (``json`` itself only takes a ``dict``)."""
    if not properties:
        return ""
    if type(properties) is not dict:
        properties = dict(properties)
    return json.dumps(properties, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def prepare_args(
    message: Message, transaction_id: str, producer_group: str, partition: int, parent_transaction_id: str = ""
) -> list[Any]:
    """ARGV of ``lua/prepare_half.lua`` for a validated message."""
    immunity = message.check_immunity_seconds
    args = [
        transaction_id,
        producer_group,
        message.topic,
        partition,
        bytes(message.body),
        " ".join(message.keys_list),
        message.tags or "",
        encode_properties(message.properties),
        "" if immunity is None else int(immunity * 1000) or 1,
    ]
    if parent_transaction_id:
        args.append(parent_transaction_id)
    return args


def field_map(raw: dict[Any, Any] | list[Any]) -> dict[str, bytes]:
    """Entry fields as ``{name: bytes}``, from a redis-py dict or a flat list from a script reply."""
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    return {text(k) or "": v if isinstance(v, bytes) else str(v).encode() for k, v in raw.items()}


def message_from_fields(fields: dict[str, bytes], where: str) -> Message:
    """The [`Message`][redis_txmq.core.message.Message] stored in a half message, check request or dead letter (not
    re-validated)."""
    missing = [name for name in (TOPIC, BODY, TRANSACTION_ID) if name not in fields]
    if missing:
        raise CorruptEntryError(f"{where}: missing field(s) {', '.join(missing)}")
    keys = text(fields.get(KEYS))
    immunity = fields.get(CHECK_IMMUNITY_MS)
    try:
        immunity_seconds = int(immunity) / 1000 if immunity else None
    except ValueError:
        raise CorruptEntryError(f"{where}: field 'check_immunity_ms' is not a number") from None
    return Message(
        topic=text(fields[TOPIC]) or "",
        body=fields[BODY],
        keys=keys or None,
        tags=text(fields.get(TAGS)),
        properties=decode_properties(fields.get(PROPERTIES), where) or None,
        check_immunity_seconds=immunity_seconds,
        transaction_id=text(fields[TRANSACTION_ID]),
    )


def decode_properties(raw: bytes | None, entry_id: str) -> dict[str, str]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise CorruptEntryError(f"entry {entry_id}: field 'properties' is not JSON") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise CorruptEntryError(f"entry {entry_id}: field 'properties' is not an object of strings")
    return value


@dataclass(frozen=True)
class ConsumedMessage:
    """A committed message as a consumer receives it."""

    topic: str
    stream: str
    id: str
    body: bytes
    transaction_id: str | None
    keys: list[str] = field(default_factory=list)
    tags: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    delivery_count: int = 1
    partition: int = 0

    @property
    def timestamp_ms(self) -> int:
        """Commit time (server clock), from the entry id."""
        return int(self.id.split("-", 1)[0])


def decode_topic_entry(
    topic: str,
    stream: str,
    entry_id: bytes | str,
    raw: dict[Any, Any] | list[Any],
    delivery_count: int = 1,
    partition: int = 0,
) -> ConsumedMessage:
    """A topic stream entry as a [`ConsumedMessage`][redis_txmq.core.entries.ConsumedMessage];
    [`CorruptEntryError`][redis_txmq.core.errors.CorruptEntryError] if it has no body."""
    eid = text(entry_id) or ""
    values = field_map(raw)
    if BODY not in values:
        raise CorruptEntryError(f"entry {eid} of stream {stream!r} has no 'body' field")
    keys = text(values.get(KEYS))
    return ConsumedMessage(
        topic=topic,
        stream=stream,
        id=eid,
        body=values[BODY],
        transaction_id=text(values.get(TRANSACTION_ID)),
        keys=keys.split() if keys else [],
        tags=text(values.get(TAGS)),
        properties=decode_properties(values.get(PROPERTIES), eid),
        delivery_count=delivery_count,
        partition=partition,
    )


def stream_batches(reply: Any) -> list[tuple[Any, list[Any]]]:
    """``(stream, [(entry id, fields), ...])`` pairs of an XREAD/XREADGROUP reply: redis-py gives a list of pairs
    under RESP2 and ``{stream: [entries]}`` under RESP3."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [
            (stream, batch[0] if batch and isinstance(batch[0], list) else batch) for stream, batch in reply.items()
        ]
    return [(stream, batch) for stream, batch in reply]


def entry_ms(entry_id: Any) -> int:
    """The milliseconds part of a stream entry id (bytes or str; 0 for none): when the entry was added."""
    return int((text(entry_id) or "0").split("-")[0])


@dataclass(frozen=True)
class EndedRecord:
    """A remembered outcome, as the topic's ``ended`` hash holds it for the dedupe window (written by
    ``lua/include/outcome_record.lua``: ``<outcome>|<committed id or ->|<half id>|<producer group>``)."""

    outcome: str
    """``COMMIT`` or ``ROLLBACK``."""
    committed_id: str | None
    """The topic stream entry of a commit (None for a rollback)."""
    half_id: str | None
    producer_group: str | None

    @property
    def state(self) -> str:
        """``COMMITTED`` or ``ROLLED_BACK``."""
        return "COMMITTED" if self.outcome == "COMMIT" else "ROLLED_BACK"


def ended_record(raw: bytes | str) -> EndedRecord:
    """The ``EndedRecord`` of a value of ``ended`` (fields a record of an older release lacks are None)."""
    outcome, committed, half_id, group = ((text(raw) or "").split("|", 3) + ["", "", "", ""])[:4]
    return EndedRecord(outcome, committed if committed not in ("", "-") else None, half_id or None, group or None)
