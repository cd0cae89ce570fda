"""A write job as the registry and the stages use it (``Job``: ``WriteJob`` is
one), and the job decision that stands for it (``JobDecision``): apart from the driver, which imports the registry and
the stages, so that they import nothing of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.config import Settings
from ..core.keys import JobKeys
from ..core.message import LocalTransactionState


class Job(Protocol):
    """What ``registry`` and ``stages`` call on a write job."""

    client: Any
    keys: JobKeys
    settings: Settings
    plain_runner: Any

    @property
    def job_id(self) -> str: ...

    def lease(self) -> int | None: ...

    def script(self, name: str) -> Any: ...

    def call(self, what: str, script: str, keys: list[str], args: list[Any], confirmed: bool = False) -> Any: ...

    def _do(self, what: str, action: Callable[[], Any]) -> Any: ...


@dataclass(frozen=True)
class JobDecision:
    """The job decision that stands for a write job (``txmq:job:{J}``), and whether this call made it."""

    outcome: LocalTransactionState
    stages: list[str]
    status: str
    """DECIDED (this call), DUPLICATE (an earlier job decision stands), REPLAYED (the sink committed this batch
    before and its job decision is gone: nothing to publish) or DISCARDED (a micro-batch's stages set aside, nothing
    decided)."""
    rows: dict[str, int] = field(default_factory=dict)
    """Rows each committed stage holds, as its attempt counted them (empty when the committer did not say)."""
    decided_ms: int | None = None
