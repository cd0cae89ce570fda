"""The job registry ``txmq:jobs``: per write job not settled yet, when the checker looks at it next.

An index in its own hash slot, written after the job's own scripts (a job listed late, or listed still after it was
settled, is only looked at once too often): every reader confirms what it says in the job's record. The score is
the end of the job's lease while it is undecided, the time of its job decision plus ``transaction_timeout`` once
decided (its driver is settling it meanwhile), ``+inf`` for a job parked for an operator.
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.entries import text
from ..core.errors import TxMQConnectionError
from ..core.keys import JOB_REGISTRY
from .job import Job, JobDecision

logger = logging.getLogger(__name__)


def due(client: Any, now_ms: int, limit: int) -> list[str]:
    """The record keys of the first ``limit`` jobs due by ``now_ms`` (server ms), wherever they are listed."""
    return [text(member) or "" for member in client.zrangebyscore(JOB_REGISTRY, "-inf", now_ms, start=0, num=limit)]


def list_job(job: Job, due_ms: int) -> None:
    """List the job for the checker at ``due_ms`` (server ms); best effort: on a cluster whose master of
    ``txmq:jobs`` is unreachable the job goes on without it (logged). The listing is only for the checker, which
    settles what a dead driver left: a live driver settles its job itself (commit, abort), every lease renewal of a
    running task lists the job again, and the driver lists it again after its decision."""
    try:
        job._do("list", lambda: job.client.zadd(JOB_REGISTRY, {job.keys.decision: due_ms}))
    except TxMQConnectionError as exc:
        logger.warning(
            "write job %s: not listed in %s for now (its driver settles it): %s", job.job_id, JOB_REGISTRY, exc
        )


def list_decided(job: Job, job_decision: JobDecision) -> None:
    """A decided job is due for the checker ``transaction_timeout`` after its job decision."""
    if job_decision.decided_ms is not None:
        list_job(job, job_decision.decided_ms + int(job.settings.transaction_timeout * 1000))


def unlist(job: Job, settled: JobDecision) -> None:
    """Unlist the job settled by ``settled``; list it again when its record says another run of it is not settled:
    a lease (a micro-batch that a replay leased meanwhile) or a job decision other than ``settled`` (a replay that
    decided COMMIT meanwhile, its driver maybe gone), for when the checker should look at it.

    The registry and the record are in different hash slots (one script cannot judge both on a cluster), so the
    record is read after the removal: a run that changed the record before the read is listed again here, and one
    that changes it after lists itself after its own script (a lease, a job decision), so neither is ever left
    unlisted."""
    try:
        job._do("unlist", lambda: job.client.zrem(JOB_REGISTRY, job.keys.decision))
    except TxMQConnectionError as exc:  # listed still: the checker looks at the settled job once too often
        logger.warning("write job %s: settled, not unlisted from %s: %s", job.job_id, JOB_REGISTRY, exc)
        return
    lease, decided = job._do("read its record", lambda: job.client.hmget(job.keys.decision, "lease_ms", "decided_ms"))
    if lease is not None:  # only an undecided job holds one
        list_job(job, int(lease))
    elif decided is not None and int(decided) != settled.decided_ms:
        list_job(job, int(decided) + int(job.settings.transaction_timeout * 1000))


def park(job: Job, reason: str) -> None:
    """Keep the job listed, out of the checker's way (score ``+inf``), its reason in its record's ``parked``
    field, and say so in the log: its rows need an operator."""
    logger.error("write job %s parked (%s): %s", job.job_id, job.keys.decision, reason)
    job._do("park", lambda: job.client.hset(job.keys.decision, "parked", reason))
    job._do("park", lambda: job.client.zadd(JOB_REGISTRY, {job.keys.decision: "+inf"}))


def drop(client: Any, member: str) -> None:
    """Remove a member that names no write job (written by another tool)."""
    logger.warning("%s lists %r, which is not a write job: removed", JOB_REGISTRY, member)
    client.zrem(JOB_REGISTRY, member)
