"""Typed settings with RocketMQ's defaults (SPEC §7), readable from ``TXMQ_*`` environment variables."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .durability import Durability
from .errors import ConfigurationError
from .message import DEFAULT_MAX_MESSAGE_SIZE

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
ENV_PREFIX = "TXMQ_"
REDIS_URL_VARIABLE = ENV_PREFIX + "REDIS_URL"
MIN_DEDUPE_WINDOW = 60.0
"""An end retried after a lost reply must get the first answer: the outcome outlives redis-py's retries."""
MAX_SCRIPT_NUMBER = 2**53
"""The largest whole number a Lua script reads exactly (a double): the scripts refuse larger ones."""
LIFETIMES = ("transaction_record_lifetime", "job_decision_lifetime", "stage_lifetime")
"""Settings in seconds that default to None: ``max_age`` plus ``dedupe_window``."""


@dataclass(frozen=True)
class Settings:
    """Settings shared by the producer, the consumer and the CLI.

    ``dedupe_window`` is how long (seconds) an ended transaction's outcome is remembered so that a repeated
    or late end call gets the first answer instead of "not found"; it never affects exactly-once, because
    a transaction whose half message is gone can no longer be committed.

    Check-back (RocketMQ's defaults): a half message is first checked ``transaction_timeout`` seconds after it was
    born (or after its own ``check_immunity_seconds``), then every ``check_interval``; after ``check_max`` checks
    that a producer read (a request no instance read is given back) or ``max_age`` seconds it is dead-lettered. A
    producer answers checks on ``check_threads`` workers with at most ``check_queue_size`` requests in hand;
    instances heartbeat every ``heartbeat_interval`` and count as live for three of them. Work read by an instance
    that died (a producer's check requests, a checker's replies) is taken over by a live one once idle for
    ``claim_idle`` seconds.

    One-way end (``TransactionProducer(oneway_end=True)``): a background flusher sends queued end calls in
    pipelines of at most ``end_batch_size``, waiting at most ``end_batch_delay`` seconds to fill one; a send
    waits while ``end_queue_size`` ends are queued (back-pressure instead of unbounded memory).

    A transaction of several messages (``tx.send``, ``send_messages_in_transaction``) holds at most
    ``max_transaction_messages`` of them.

    A write job (the Spark writer, ``redis_txmq.jobs``) is its driver's while its lease holds: the task attempts that
    write for it renew it as they run, and the checker settles an undecided job only once ``job_lease`` seconds passed
    without a renewal (its driver died). It must outlast the longest time a job runs no writing task (the gap between
    its tasks and the driver's commit, a wait for executors); independent of ``max_age``.

    Lifetimes (seconds; each None by default, meaning ``max_age`` plus ``dedupe_window``, as long as a half message
    may be in flight and an end be repeated after it): ``transaction_record_lifetime`` keeps the record of a
    transaction of several messages (``txmq:decision:{X}``, its decision) once none of its messages is
    dead-lettered, and must not be shorter than that default (a record gone while a half message of it is in flight
    would let the other outcome be decided); ``job_decision_lifetime`` keeps a write job's record (its lease, then
    its decision, ``txmq:job:{J}``), the stages it set aside and the counts of rows its stages published;
    ``stage_lifetime`` keeps a write job's stages and their list, and must not be longer than
    ``job_decision_lifetime`` (a decision outlives the stages it names).

    ``redis_url`` left out reads ``TXMQ_REDIS_URL`` (the default when it is unset or empty), as the CLI does: a service
    that tunes its settings in code and names its server in the environment must not go to ``localhost:6379``. The other
    ``TXMQ_*`` variables apply only through [`from_env`][redis_txmq.core.config.Settings.from_env].

    Durability (``redis_txmq.core.durability``): ``master`` acknowledges a prepare or an end once the master applied it;
    ``replica`` once ``durability_replicas`` replicas have it; ``aof`` once the master fsynced it to its append-only
    file; each waits at most ``durability_timeout`` seconds.
    """

    redis_url: str = field(default_factory=lambda: os.environ.get(REDIS_URL_VARIABLE) or DEFAULT_REDIS_URL)
    cluster: bool = False
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    dedupe_window: float = 300.0
    op_stream_maxlen: int = 10_000
    transaction_timeout: float = 6.0
    check_interval: float = 30.0
    check_max: int = 15
    max_age: float = 72 * 3600.0
    check_threads: int = 1
    check_queue_size: int = 2000
    heartbeat_interval: float = 5.0
    claim_idle: float = 30.0
    end_batch_size: int = 256
    end_batch_delay: float = 0.002
    end_queue_size: int = 10_000
    durability: str = "master"
    durability_replicas: int = 1
    durability_timeout: float = 1.0
    max_transaction_messages: int = 1000
    job_lease: float = 300.0
    transaction_record_lifetime: float | None = None
    job_decision_lifetime: float | None = None
    stage_lifetime: float | None = None

    def __post_init__(self) -> None:
        # before the bounds, which a NaN passes (every comparison with it is false): a number that reaches a script
        # must be one it can write
        for setting in fields(self):
            value = getattr(self, setting.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigurationError(f"{setting.name} must be a finite number, got {value}")
            if setting.type == "int" and isinstance(value, float) and not value.is_integer():
                raise ConfigurationError(f"{setting.name} must be a whole number, got {value}")
        positive = ("check_interval", "max_age", "heartbeat_interval", "claim_idle", "job_lease")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if not 0 <= self.end_batch_delay <= 10:
            raise ConfigurationError(f"end_batch_delay must be from 0 to 10 seconds, got {self.end_batch_delay}")
        if self.transaction_timeout < 0:
            raise ConfigurationError(f"transaction_timeout must be >= 0 seconds, got {self.transaction_timeout}")
        for name in (
            "check_max",
            "check_threads",
            "check_queue_size",
            "end_batch_size",
            "end_queue_size",
            "max_transaction_messages",
        ):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_message_size < 1:
            raise ConfigurationError(f"max_message_size must be >= 1 byte, got {self.max_message_size}")
        if self.dedupe_window < MIN_DEDUPE_WINDOW:
            raise ConfigurationError(
                f"dedupe_window must be >= {MIN_DEDUPE_WINDOW} seconds (longer than redis-py's retries of a command "
                f"whose reply was lost), got {self.dedupe_window}"
            )
        if self.dedupe_window * 1000 > MAX_SCRIPT_NUMBER:
            raise ConfigurationError(f"dedupe_window must be at most 2^53 ms, got {self.dedupe_window} seconds")
        if not 1 <= self.op_stream_maxlen <= MAX_SCRIPT_NUMBER:
            raise ConfigurationError(f"op_stream_maxlen must be from 1 to 2^53, got {self.op_stream_maxlen}")
        self.durability_level()
        for name in LIFETIMES:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigurationError(f"{name} must be > 0 seconds (or None for the default), got {value}")
        if self.transaction_record_lifetime_ms < self.kept_ms:
            raise ConfigurationError(
                f"transaction_record_lifetime must be at least max_age plus dedupe_window "
                f"({self.kept_ms / 1000:g} seconds), got {self.transaction_record_lifetime}: the record of a "
                "transaction of several messages must outlive its half messages"
            )
        if self.stage_lifetime_ms > self.job_decision_lifetime_ms:
            raise ConfigurationError(
                f"stage_lifetime ({self.stage_lifetime_ms / 1000:g} seconds) must not be longer than "
                f"job_decision_lifetime ({self.job_decision_lifetime_ms / 1000:g} seconds): a write job's decision "
                "must outlive the stages it names (and the counts of rows they published)"
            )

    @property
    def kept_ms(self) -> int:
        """The default of each lifetime, in ms: as long as a half message may still be in flight (``max_age``), and
        the dedupe window. (It was the one lifetime of them all; use the named ones.)"""
        return int((self.max_age + self.dedupe_window) * 1000)

    @property
    def transaction_record_lifetime_ms(self) -> int:
        """How long the record of a transaction of several messages is kept once none of its messages is
        dead-lettered (``lua/decide_transaction.lua``)."""
        return self._lifetime_ms(self.transaction_record_lifetime)

    @property
    def job_decision_lifetime_ms(self) -> int:
        """How long a write job's record (its lease, then its decision), its set aside stages and its stages'
        published counts are kept (``lua/lease_job.lua``, ``decide_job.lua``, ``settle_job.lua``,
        ``publish_stage.lua``)."""
        return self._lifetime_ms(self.job_decision_lifetime)

    @property
    def stage_lifetime_ms(self) -> int:
        """How long a write job's stage and its list of stages live (``lua/open_stage.lua``, ``note_stage.lua``):
        a job never settled leaves nothing for ever."""
        return self._lifetime_ms(self.stage_lifetime)

    def _lifetime_ms(self, seconds: float | None) -> int:
        return self.kept_ms if seconds is None else int(seconds * 1000)

    def durability_level(self) -> Durability | None:
        """The durability level as the command that confirms it (None for ``master``)."""
        return Durability.of(self.durability, self.durability_replicas, self.durability_timeout)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``TXMQ_<FIELD>`` variables of ``environ`` (``os.environ`` when None), then non-None
        ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {"redis_url": DEFAULT_REDIS_URL}  # of ``environ`` only, not of os.environ
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            kind = float if f.name in LIFETIMES else type(values.get(f.name, getattr(cls, f.name, None)))
            values[f.name] = _parse(f.name, raw, kind)
        settings = cls(**values)
        return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def _parse(name: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise ConfigurationError(
            f"environment variable {ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind.__name__}"
        ) from None
