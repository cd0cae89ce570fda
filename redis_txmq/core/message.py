"""The message model and its validation (SPEC §4.1).

Validation runs before anything is written to Redis, so a refused message leaves no trace.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import (
    ConfigurationError,
    DelayNotSupportedError,
    InvalidMessageError,
    InvalidPropertyError,
    InvalidTopicError,
    MessageTooLargeError,
    ReservedPropertyError,
)

TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,126}$")
"""Topic names, also used for producer and consumer group names. No braces: they would break hash tags.
Use ``fullmatch``: with ``match`` the ``$`` lets a trailing newline through."""

DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
MAX_CHECK_IMMUNITY_SECONDS = 365 * 24 * 3600
"""A message's own check immunity is at most a year (and never NaN or infinite)."""

DELAY_PROPERTIES = frozenset({"DELAY", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_DELIVER_MS", "__STARTDELIVERTIME"})
"""RocketMQ's delay properties: refused on a transactional message instead of silently dropped."""

RESERVED_PROPERTIES = frozenset(
    {
        "KEYS",
        "TAGS",
        "TRAN_MSG",
        "PGROUP",
        "UNIQ_KEY",
        "TRANSACTION_ID",
        "TRANSACTION_CHECK_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "REAL_TOPIC",
        "REAL_QID",
    }
)
"""RocketMQ system property names that have a typed field here instead (keys, tags, check immunity...)."""

RESERVED_PREFIX = "txmq."


class LocalTransactionState(str, enum.Enum):
    """What the local transaction decided. ``None`` or an exception from a listener counts as UNKNOWN."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class SendStatus(str, enum.Enum):
    """Outcome of writing the half message; a failed write raises instead of returning a status."""

    SEND_OK = "SEND_OK"


def validate_name(name: object, what: str) -> str:
    """Check a topic or group name against ``TOPIC_PATTERN``."""
    if not isinstance(name, str) or not TOPIC_PATTERN.fullmatch(name):
        error = InvalidTopicError if what == "topic" else ConfigurationError
        raise error(
            f"invalid {what} name {name!r}: use 1-127 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit (no braces, no spaces)"
        )
    return name


REMARK_LIMIT = 1024
"""The most characters a remark keeps (the op record, the remarks hash, a send result): an exception's text can be
of any length."""


def remark_text(text: str) -> str:
    """``text`` as a remark Redis can always take: at most ``REMARK_LIMIT`` characters, and every character
    UTF-8 cannot encode (a lone surrogate, as a file name or an argv decoded with ``surrogateescape`` holds) written
    as its escape (``\\udcff``). A remark is made from foreign text (an exception's, an operator's): that text must
    never be what fails the end it goes with, nor the other calls of the same write."""
    text = text[:REMARK_LIMIT]
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")[:REMARK_LIMIT]
    return text


def exception_text(exc: BaseException) -> str:
    """``Name: text`` of an exception (``Name`` alone when its text is empty) for a remark; an exception whose
    ``__str__`` itself raises is named without its text instead of replacing the exception being described."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the exception it belongs to
        return f"{name} (its text could not be read)"
    return f"{name}: {text}" if text else name


def _is_utf8(text: str) -> bool:
    """Redis receives str as UTF-8, which a lone surrogate (``"\\ud800"``) cannot be: refuse it before any write.
    Callers test ``str.isascii()`` first, which is instant, and call this for the rest."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Message:
    """A message to publish.

    ``properties`` may be any ``Mapping`` of str to str (a ``dict``, ``MappingProxyType``, ``UserDict``...). A send
    works on its own copy of the message ([`copy_for_send`][redis_txmq.core.message.Message.copy_for_send]), whose
    ``properties`` is a plain ``dict``: the caller's object is never changed, so one ``Message`` can be sent by many
    threads at once. ``transaction_id`` is set on that copy, which the listener receives, so it can store the id with
    its own data and answer checks by it; the send result carries the id too."""

    topic: str
    body: bytes
    keys: str | list[str] | None = None
    tags: str | None = None
    properties: Mapping[str, str] | None = None
    delay_seconds: float | None = None
    check_immunity_seconds: float | None = None
    transaction_id: str | None = field(default=None, compare=False)
    prepared_at: float | None = field(default=None, compare=False)
    """When the half message was written (seconds since the epoch, Redis's clock, from its stream entry id): set on the
    message a listener receives, so a check can tell a young transaction, which may still be running, from an old
    one."""

    @property
    def keys_list(self) -> list[str]:
        """The keys as a list (RocketMQ joins several keys with a space)."""
        if not self.keys:
            return []
        if isinstance(self.keys, str):
            return self.keys.split()
        return list(self.keys)

    def copy_for_send(self, transaction_id: str | None = None) -> Message:
        """A shallow copy that one send owns, with ``transaction_id`` set: a ``properties`` Mapping becomes a new
        ``dict`` and a keys list a new list, so nothing the send or its listener does reaches the caller's object, and
        what is validated is what is written. Invalid values are copied as they are, for
        [`validate`][redis_txmq.core.message.Message.validate]."""
        cls = type(self)
        copy = cls.__new__(cls)
        state = self.__dict__.copy()
        properties = state["properties"]
        if type(properties) is dict or (properties is not None and isinstance(properties, Mapping)):
            state["properties"] = dict(properties)
        if type(state["keys"]) is list:
            state["keys"] = state["keys"][:]
        state["transaction_id"] = transaction_id
        state["prepared_at"] = None
        copy.__dict__ = state
        return copy

    def validate(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        """Raise an [`InvalidMessageError`][redis_txmq.core.errors.InvalidMessageError] subclass naming what is wrong;
        return ``None`` if valid.

        Every str (keys, tags, property names and values) must encode to UTF-8, as Redis stores it: a lone
        surrogate is refused here rather than failing half-way through a send."""
        validate_name(self.topic, "topic")
        where = f"message for topic {self.topic!r}"
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            hint = " (encode it first, e.g. body=text.encode())" if isinstance(self.body, str) else ""
            raise InvalidMessageError(f"{where}: body must be bytes, not {type(self.body).__name__}{hint}")
        size = len(self.body) if not isinstance(self.body, memoryview) else self.body.nbytes
        if size > max_message_size:
            raise MessageTooLargeError(
                f"{where}: body is {size} bytes, over max_message_size {max_message_size}; "
                "send a reference to the payload instead, or raise max_message_size"
            )
        if self.delay_seconds:
            raise DelayNotSupportedError(
                f"{where}: a transactional message cannot be delayed (delay_seconds={self.delay_seconds}); "
                "send it without a delay"
            )
        self._validate_keys(where)
        if self.tags is not None:
            if not isinstance(self.tags, str) or not self.tags or "||" in self.tags or self.tags.isspace():
                raise InvalidMessageError(f"{where}: tags must be a non-empty str without '||', got {self.tags!r}")
            if not self.tags.isascii() and not _is_utf8(self.tags):
                raise InvalidMessageError(f"{where}: tags {self.tags!r} cannot be encoded as UTF-8 (lone surrogate?)")
        self._validate_properties(where)
        if self.check_immunity_seconds is not None:
            immunity = self.check_immunity_seconds
            if (
                isinstance(immunity, bool)
                or not isinstance(immunity, (int, float))
                or not 0 < immunity <= MAX_CHECK_IMMUNITY_SECONDS
            ):
                raise InvalidMessageError(
                    f"{where}: check_immunity_seconds must be a number of seconds in (0, "
                    f"{MAX_CHECK_IMMUNITY_SECONDS}], got {immunity!r}"
                )

    def _validate_keys(self, where: str) -> None:
        if self.keys is None:
            return
        keys = [self.keys] if isinstance(self.keys, str) else self.keys
        if not isinstance(keys, (list, tuple)) or not keys:
            raise InvalidMessageError(f"{where}: keys must be a str or a non-empty list of str, got {self.keys!r}")
        for key in keys:
            if not isinstance(key, str) or not key.strip():
                raise InvalidMessageError(f"{where}: every key must be a non-empty str, got {key!r}")
            if not isinstance(self.keys, str) and any(c.isspace() for c in key):
                raise InvalidMessageError(f"{where}: key {key!r} contains whitespace, which separates keys")
            if not key.isascii() and not _is_utf8(key):
                raise InvalidMessageError(f"{where}: key {key!r} cannot be encoded as UTF-8 (lone surrogate?)")

    def _validate_properties(self, where: str) -> None:
        if self.properties is None:
            return
        if not isinstance(self.properties, Mapping):
            raise InvalidPropertyError(
                f"{where}: properties must be a Mapping of str to str (e.g. a dict), "
                f"got {type(self.properties).__name__}"
            )
        for name, value in self.properties.items():
            if not isinstance(name, str) or not name:
                raise InvalidPropertyError(f"{where}: property names must be non-empty str, got {name!r}")
            if not isinstance(value, str):
                raise InvalidPropertyError(
                    f"{where}: property {name!r} must have a str value, got {type(value).__name__} "
                    "(convert it with str() or json.dumps())"
                )
            if not name.isascii() and not _is_utf8(name):
                raise InvalidPropertyError(
                    f"{where}: property name {name!r} cannot be encoded as UTF-8 (lone surrogate?)"
                )
            if not value.isascii() and not _is_utf8(value):
                raise InvalidPropertyError(
                    f"{where}: property {name!r} has a value that cannot be encoded as UTF-8 (lone surrogate?): "
                    f"{value!r}"
                )
            upper = name.upper()
            if upper in DELAY_PROPERTIES:
                raise DelayNotSupportedError(
                    f"{where}: property {name!r} asks for a delay, which a transactional message cannot have"
                )
            if upper in RESERVED_PROPERTIES or name.lower().startswith(RESERVED_PREFIX):
                raise ReservedPropertyError(
                    f"{where}: property name {name!r} is reserved; use the Message fields "
                    "(keys, tags, check_immunity_seconds) or another name"
                )


def time_of_entry_id(entry_id: str) -> float | None:
    """The time a Redis stream entry id carries (its milliseconds part), in seconds; None for an id that has none."""
    millis, _, _ = entry_id.partition("-")
    return int(millis) / 1000 if millis.isdigit() else None


@dataclass(frozen=True)
class TransactionSendResult:
    """What ``send_message_in_transaction`` did. ``committed_id`` is the topic stream entry id, set only when
    the commit was applied; ``end_error`` says why an end call failed (the check-back resolves it).
    ``end_queued`` is True when a one-way producer queued the end for its flusher: the outcome is applied
    by ``flush()`` at the latest (or, if the process dies first, by the check-back), and ``committed_id``
    stays None."""

    transaction_id: str
    topic: str
    half_id: str
    local_transaction_state: LocalTransactionState
    send_status: SendStatus = SendStatus.SEND_OK
    partition: int = 0
    committed_id: str | None = None
    remark: str | None = None
    end_error: str | None = None
    end_queued: bool = False
