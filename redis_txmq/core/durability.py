"""How durable a write must be before a call counts as done: the durability level (``Settings.durability``).

Redis acknowledges a script once the master has applied it; replication and the append-only file follow
asynchronously, so a failover (or a crash of the master) can lose writes already acknowledged. The level decides
what a prepare or an end waits for, in the same round trip as the script, on the same connection (``WAIT`` and
``WAITAOF`` count that connection's writes):

- ``master``: nothing (the fastest; a failover may lose what the master had not passed on yet);
- ``replica``: ``WAIT <durability_replicas> <timeout>``: that many replicas have the write;
- ``aof``: ``WAITAOF 1 0 <timeout>``: the master fsynced it to its append-only file (Redis >= 7.2 or Valkey, with
  ``appendonly yes``); survives a crash and restart of the master, not its loss.

A prepare that is not confirmed in time raises [`PrepareError`][redis_txmq.core.errors.PrepareError] (the local
transaction does not run); an end that is not confirmed is the send's end error, and the check-back settles the
transaction (the half message, confirmed at prepare, is still in flight wherever the end was lost). What is sent and how
the reply is read lives here, once, for the sync and the asyncio I/O shells."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError, DurabilityError, TxMQConnectionError

logger = logging.getLogger(__name__)

LEVELS = ("master", "replica", "aof")
WAITAOF_SINCE = (7, 2)
"""The Redis protocol version (``redis_version`` in INFO, which Valkey reports too) that has ``WAITAOF``."""


@dataclass(frozen=True)
class Durability:
    """A level other than ``master``: the command that confirms a connection's writes, and how to read its reply."""

    level: str
    replicas: int
    timeout: float
    """Seconds the server waits for the confirmation (0 would wait forever: refused)."""

    @classmethod
    def of(cls, level: str, replicas: int = 1, timeout: float = 1.0) -> Durability | None:
        """None for ``master`` (nothing to wait for); raises
        [`ConfigurationError`][redis_txmq.core.errors.ConfigurationError] for a bad setting."""
        if level not in LEVELS:
            raise ConfigurationError(f"durability must be one of {', '.join(LEVELS)}, got {level!r}")
        if level == "master":
            return None
        if not timeout > 0:
            raise ConfigurationError(f"durability_timeout must be > 0 seconds, got {timeout}")
        if level == "replica" and replicas < 1:
            raise ConfigurationError(f"durability 'replica' needs durability_replicas >= 1, got {replicas}")
        return cls(level, replicas if level == "replica" else 0, timeout)

    @property
    def command(self) -> tuple[Any, ...]:
        milliseconds = max(1, round(self.timeout * 1000))
        if self.level == "replica":
            return ("WAIT", self.replicas, milliseconds)
        return ("WAITAOF", 1, 0, milliseconds)

    def confirmed(self, reply: Any) -> bool:
        """Whether the reply of ``command`` says the writes are as durable as asked."""
        if isinstance(reply, Exception):
            return False
        if self.level == "replica":
            return isinstance(reply, int) and reply >= self.replicas
        return isinstance(reply, list | tuple) and len(reply) == 2 and int(reply[0]) >= 1

    def shortfall(self, reply: Any) -> str:
        """What the confirmation said instead, for an error message."""
        if isinstance(reply, Exception):
            return f"{' '.join(map(str, self.command[:1]))} failed: {reply}"
        if reply is None:
            return "the write could not be confirmed (it was retried, or sent through another connection)"
        if self.level == "replica":
            return f"{reply} of {self.replicas} replica(s) confirmed it within {self.timeout:g} s"
        return f"the master did not fsync its append-only file within {self.timeout:g} s"

    def error(self, confirmation: Any, replies: list[Any] | None = None) -> DurabilityError:
        """The error of writes whose confirmation (the reply of ``command``; None when none could be had)
        fell short, carrying the scripts' ``replies``."""
        return DurabilityError(
            f"not confirmed as durable ({self.level}): {self.shortfall(confirmation)}", replies=replies
        )

    def describe(self) -> str:
        if self.level == "replica":
            return f"replica (WAIT {self.replicas} replica{'s' if self.replicas > 1 else ''}, {self.timeout:g} s)"
        return f"aof (WAITAOF on the master, {self.timeout:g} s)"

    def server_problem(self, info: dict[str, Any]) -> str | None:
        """Why a server (its ``INFO`` as a dict) cannot give this level, or None. Gated on the protocol version the
        server reports, never on its name."""
        if self.level != "aof":
            return None
        if not has_waitaof(info):
            return (
                f"durability 'aof' needs WAITAOF (Redis >= 7.2 or Valkey); this server reports redis_version "
                f"{info.get('redis_version', 'unknown')}: use durability 'replica' or 'master'"
            )
        if str(info.get("aof_enabled", "0")) != "1":
            return "durability 'aof' needs the append-only file: set `appendonly yes` on the server"
        return None


def has_waitaof(info: dict[str, Any]) -> bool:
    """Whether a server (its INFO server section) has WAITAOF: gated on the Redis protocol version it reports."""
    version = tuple(int(part) for part in str(info.get("redis_version", "0")).split(".")[:2] if part.isdigit())
    return version >= WAITAOF_SINCE


def check_server(durability: Durability, address: str, info: dict[str, Any]) -> None:
    """Raise [`ConfigurationError`][redis_txmq.core.errors.ConfigurationError] when the server at ``address`` (its INFO
    server, replication and persistence sections; empty when INFO is refused) cannot give the level; log when it has
    fewer replicas connected than the level asks (prepares fail until they are back)."""
    if not info:
        logger.warning("durability %s: %s refuses INFO, the level could not be checked", durability.level, address)
        return
    problem = durability.server_problem(info)
    if problem is not None:
        raise ConfigurationError(f"{address}: {problem}")
    connected = int(info.get("connected_slaves", 0))
    if durability.level == "replica" and connected < durability.replicas:
        logger.warning(
            "durability replica: %s has %d replica(s) connected, %d asked: prepares fail until enough are back",
            address,
            connected,
            durability.replicas,
        )


def check_servers(durability: Durability, answers: Iterable[tuple[str, dict[str, Any] | Exception]]) -> None:
    """``check_server`` on each server that answered: ``(address, its INFO)``, or ``(address, the error)`` for
    one that could not be reached. An unreachable server (a cluster master that is down) is skipped with a warning, so
    one master down does not stop a producer or a checker from starting and serving the others: the level is still
    enforced on every call (its ``WAIT`` or ``WAITAOF``), on that master too once it is back. Raises
    [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when no server answered."""
    answers = list(answers)
    unreachable = [(address, answer) for address, answer in answers if isinstance(answer, Exception)]
    if unreachable and len(unreachable) == len(answers):
        address, exc = unreachable[0]
        raise durability_unchecked(durability, exc, address)
    for address, answer in answers:
        if isinstance(answer, Exception):
            logger.warning(
                "durability %s: %s cannot be reached (%s); its level was not checked: calls to its slots fail "
                "until it is back, and each call waits for its confirmation then",
                durability.level,
                address,
                answer,
            )
        else:
            check_server(durability, address, answer)


def durability_unchecked(durability: Durability, exc: Exception, address: str = "") -> TxMQConnectionError:
    """The error of a start at which no server's INFO could be read to check the level."""
    where = f" ({address})" if address else ""
    return TxMQConnectionError(
        f"durability {durability.level}: could not read the server's INFO to check the level{where}: {exc}; check "
        "that Redis is reachable"
    )


def describe(durability: Durability | None) -> str:
    """The level in use, for ``txmq status`` and logs."""
    return "master (no wait)" if durability is None else durability.describe()
