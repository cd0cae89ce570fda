"""What the benchmark scripts share: a Redis to measure against, and how results are printed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis_txmq.embedded import EmbeddedRedis


def run_and_print(measure: Callable[..., dict[str, float]], redis_url: str | None, **options: Any) -> None:
    """Run ``measure(url, **options)`` on ``redis_url``, or on a redis-server of its own; print each figure."""
    if redis_url:
        result = measure(redis_url, **options)
    else:
        with EmbeddedRedis() as server:
            result = measure(server.url, **options)
    for name, value in result.items():
        print(f"{name:>16}: {value:,.2f}")
