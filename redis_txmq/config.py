"""Typed settings with RocketMQ's defaults (SPEC §7), readable from ``TXMQ_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import ConfigurationError
from .message import DEFAULT_MAX_MESSAGE_SIZE

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
ENV_PREFIX = "TXMQ_"


@dataclass(frozen=True)
class Settings:
    """Settings shared by the producer, the consumer and the CLI.

    ``dedupe_window`` is how long (seconds) an ended transaction's outcome is remembered so that a repeated
    or late end call gets the first answer instead of "not found"; it never affects exactly-once, because
    a transaction whose half message is gone can no longer be committed.
    """

    redis_url: str = DEFAULT_REDIS_URL
    cluster: bool = False
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    dedupe_window: float = 300.0
    op_stream_maxlen: int = 10_000

    def __post_init__(self) -> None:
        if self.max_message_size < 1:
            raise ConfigurationError(f"max_message_size must be >= 1 byte, got {self.max_message_size}")
        if self.dedupe_window < 0:
            raise ConfigurationError(f"dedupe_window must be >= 0 seconds, got {self.dedupe_window}")
        if self.op_stream_maxlen < 1:
            raise ConfigurationError(f"op_stream_maxlen must be >= 1, got {self.op_stream_maxlen}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``TXMQ_<FIELD>`` variables, then non-None ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(f.name, raw, type(getattr(cls, f.name)))
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
