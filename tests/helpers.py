"""Listeners and small waits shared by the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from redis_txmq import LocalTransactionState, Message, TransactionListener


class ScriptedListener(TransactionListener):
    """Executes by calling ``arg`` (a callable) or returning it; records what it saw."""

    def __init__(self, check_answer: Any = LocalTransactionState.UNKNOWN) -> None:
        self.executed: list[Message] = []
        self.checked: list[Message] = []
        self.check_answer = check_answer

    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        self.executed.append(message)
        return arg(message) if callable(arg) else arg

    def check_local_transaction(self, message: Message) -> Any:
        self.checked.append(message)
        return self.check_answer(message) if callable(self.check_answer) else self.check_answer


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it is truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def wait_through_errors(condition: Callable[[], Any], what: str, timeout: float) -> None:
    """Poll ``condition`` every 0.1 s, a Redis error counting as "not yet" (a server restarting, a failover under
    way); fail the test with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def pending(client: Any, stream: str, group: str) -> int:
    """Entries read through ``group`` and not acknowledged (0 when the group does not exist)."""
    if not client.exists(stream) or not any(g["name"].decode() == group for g in client.xinfo_groups(stream)):
        return 0
    return int(client.xpending(stream, group)["pending"])


def server_ms(client: Any) -> int:
    """The Redis server's clock in ms: ages are measured on it, never on a client's."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def published_of(client: Any, stream: str, transaction_id: str) -> int:
    """How many entries of the topic stream ``stream`` belong to ``transaction_id`` (its messages ``<id>.<i>``
    included)."""
    entries = client.xrange(stream)
    return sum(1 for _, fields in entries if fields[b"transaction_id"].decode().split(".")[0] == transaction_id)


def check_until_settled(client: Any, settings: Any, inflight_key: str, timeout: float = 30) -> None:
    """Check rounds until nothing is in flight in ``inflight_key``: what is left there is asked about."""
    from redis_txmq.checker import Checker

    checker = Checker(client, settings)
    wait_until(lambda: checker.run_round() is not None and client.hlen(inflight_key) == 0, timeout=timeout)
