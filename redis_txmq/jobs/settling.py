"""The checker's settling policy for write jobs (``checker/worker.py`` calls ``settle_jobs`` every round).

A job is the driver's while its lease holds, and its driver settles its own job decision right after writing it: the
checker only takes a job once ``registry`` says it is due, and confirms that in the job's record
(``driver.WriteJob.expire``). An undecided job whose lease passed (its driver is gone) is ended: a batch job rolled
back, a micro-batch's stages set aside (its batch id stays free for Spark's rerun); a decided one is settled by its job
decision once it is ``transaction_timeout`` old (a repeat of the driver's settling is harmless).
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.clients import REDIS_ERRORS
from ..core.config import Settings
from ..core.errors import TxMQError, UnpublishableJobError
from ..core.keys import JobKeys
from . import registry
from .driver import ROLLBACK, JobDecision, WriteJob

logger = logging.getLogger(__name__)

SETTLE_BATCHES = 10
"""Batches of due jobs one ``settle_jobs`` call takes at most: each job it looks at leaves the due range
(settled, parked, or rescheduled), so the next batch holds the next due ones, wherever they were listed."""
SETTLING_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, TxMQError)
"""What the checker logs and tries again later when settling a job fails."""


def settle_jobs(client: Any, settings: Settings, limit: int = 100) -> int:
    """Settle the write jobs that are due (``txmq:jobs`` score up to now, server clock), wherever they are listed:
    a decided one once its job decision is ``transaction_timeout`` old (a live driver is settling it meanwhile; a
    repeat is harmless), an undecided one once its lease has passed (its driver is gone: a batch job is rolled back,
    a micro-batch's stages deleted, its batch id left free). A job still leased or decided too recently is listed
    again for then; one whose rows cannot all be published is parked; one whose settling failed otherwise is tried
    again after ``check_interval``. Returns the number of jobs settled."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    settled = 0
    for _ in range(SETTLE_BATCHES):
        due = registry.due(client, now_ms, limit)
        for job_key in due:
            settled += _settle_due(client, job_key, settings, now_ms)
        if len(due) < limit:
            break
    return settled


def _settle_due(client: Any, job_key: str, settings: Settings, now_ms: int) -> int:
    """Settle one due job (1), or list it for later (0)."""
    try:
        keys = JobKeys.of_decision(job_key)
    except ValueError:
        registry.drop(client, job_key)
        return 0
    job = WriteJob(client, keys, settings)
    try:
        status, job_decision, later = job.expire()
        if later is not None:
            registry.list_job(job, later)
            return 0
        if job_decision is None:  # nothing left of it (GONE)
            registry.unlist(job, JobDecision(ROLLBACK, [], "GONE"))
            return 0
        if status == "DECIDED":
            logger.warning("write job %s: its lease passed with no job decision: rolled back", keys.job_id)
        elif status == "DISCARDED":
            logger.warning("write job %s: its lease passed with no job decision: its stages are deleted", keys.job_id)
        job.settle(job_decision)
        logger.info("write job %s settled by the checker: %s", keys.job_id, job_decision.outcome.value)
        return 1
    except UnpublishableJobError:
        return 0  # parked, and logged
    except SETTLING_ERRORS as exc:
        logger.error(
            "write job %s: settling failed, tried again in %s s: %s", keys.job_id, settings.check_interval, exc
        )
        registry.list_job(job, now_ms + int(settings.check_interval * 1000))
        return 0
    finally:
        job.close()
