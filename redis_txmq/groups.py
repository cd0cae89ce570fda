"""Consumer groups on streams."""

from __future__ import annotations

from typing import Any

import redis

from .errors import TxMQConnectionError
from .scripts import script_source

_ENSURE_GROUP = "ensure_group"


def ensure_consumer_group(client: Any, stream: str, group: str, start_id: str = "0") -> bool:
    """Create ``group`` on ``stream`` (and the stream) unless it exists; True if it was created.

    A script rather than XGROUP CREATE so that an existing group is not an error reply: some servers
    (fakeredis' TCP server among them) drop the connection after one. Sent with EVAL, not EVALSHA, for the
    same reason (no NOSCRIPT on first use); it runs once per process start."""
    try:
        return bool(int(client.eval(script_source(_ENSURE_GROUP), 1, stream, group, start_id)))
    except redis.RedisError as exc:
        raise TxMQConnectionError(f"stream {stream!r}: could not create consumer group {group!r}: {exc}") from exc
