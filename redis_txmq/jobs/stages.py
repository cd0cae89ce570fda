"""A write job's stages, and how a job decision is carried out on them (what Spark's sink relies on).

A stage is a stream beside a topic stream (same hash slot), one per task attempt and topic stream, invisible to
consumers. The writer (``spark_connector/writer.py``) packs its rows into stage entries by the constants here; a task
attempt's stage is opened empty with a time to live and listed in its job before any row goes in (``open_stage``),
refused once the job is decided. Settling by the job decision that stands (``settle_by_job_decision``): a COMMIT's
stages are published into their topic streams chunk by chunk (``publish_stage``), each stage's rows published compared
with the rows its attempt staged; every other stage is deleted; a job whose committed rows cannot all be published is
parked for an operator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from ..core.entries import text
from ..core.errors import UnpublishableJobError, WriteJobError
from ..core.keys import JOB_REGISTRY, published_key, stage_key, stream_of_stage
from ..core.message import LocalTransactionState
from . import registry
from .job import Job, JobDecision

logger = logging.getLogger(__name__)

STAGE_ROWS_FIELD = "rows"
ROWS_PER_STAGE_ENTRY = 100
"""Rows a writer packs into one stage entry at most (fewer when they reach ``STAGE_ENTRY_BYTES``)."""
STAGE_ENTRY_BYTES = 1 << 20
"""Body bytes after which a writer closes a stage entry early: one call never moves much more than a few MiB."""
PUBLISH_CHUNK = 10
"""Stage entries one ``publish_stage`` call moves (about 1,000 rows): large enough to cost little per row, small
enough to keep the server responsive between calls."""

COMMIT = LocalTransactionState.COMMIT
STAGE_ALREADY_WRITTEN = "equal or smaller than the target stream top item"
"""Redis' refusal of an XADD whose counted id the stage already holds: that entry was written (a repeat after a
lost reply), nothing is appended twice."""


def stage_entry_id(number: int, rows: int) -> str:
    """The counted id of a stage's entry ``number`` (from 1), ``rows`` the rows staged up to it: ids increase, so a
    repeated XADD is refused, and the last one says how many rows the stage holds (``lua/check_stage.lua``)."""
    return f"{number}-{rows}"


def check_stages(job: Job, stages: Iterable[str], rows: Mapping[str, int]) -> list[str]:
    """What is wrong with the stages before any of their rows is published (``lua/check_stage.lua``, one call per
    stage in one pipeline, which also renews each stage's time to live): one line per stage that is missing or holds
    other rows than its attempt staged; empty when all can be published."""
    keep = job.settings.stage_lifetime_ms
    calls = []
    listed = list(stages)
    script = job.script("check_stage")
    for stage in listed:
        staged = rows.get(stage)
        calls.append((script, [stage, published_key(stage)], ["" if staged is None else staged, keep]))
    replies = job._do("check its stages", lambda: job.plain_runner.run_many(calls, raise_on_error=True))
    failures = []
    for stage, reply in zip(listed, replies, strict=True):
        if text(reply[0]) != "OK":
            failures.append(f"stage {stage}: {text(reply[1])}: {text(reply[2])}")
    return failures


def open_stage(job: Job, stream: str, attempt: str) -> str | None:
    """The stage of task attempt ``attempt`` for ``stream``: the job leased (and listed) first, then the stage
    listed in the job's stages (``lua/note_stage.lua``) and only then opened empty with a time to live
    (``lua/open_stage.lua``; rows go in with ``XADD NOMKSTREAM``): a stage exists only once listed, so the
    settling deletes it whatever fails between the two (a stage opened first and not listed, its note's connection
    reset, would be left until its time to live); the lease renewed after the open tells a job decided meanwhile,
    whose settling may have passed the stage: the attempt deletes it. None when the job is already decided (a late
    or speculative attempt, a micro-batch replayed after a restart): the attempt writes nothing."""
    key = stage_key(stream, job.job_id, attempt)
    if job.lease() is None:
        logger.info("write job %s: decided before task attempt %s began to write for %s", job.job_id, attempt, stream)
        return None
    lifetime = job.settings.stage_lifetime_ms
    # not confirmed here: the writer's confirmation of its stage writes covers these earlier writes too
    noted = job.call("note a stage", "note_stage", job.keys.note_keys, [key, lifetime])
    if text(noted[0]) == "OK":
        job.call("open a stage", "open_stage", [key], [lifetime])
        if job.lease() is not None:
            return key
        # decided between the note and the open: its settling may have deleted the listed stages before this one
        # was opened, so this attempt deletes its own
        job._do("delete a stage", lambda: job.client.delete(key))
        logger.info("write job %s: decided while task attempt %s opened its stage for %s", job.job_id, attempt, stream)
        return None
    if text(noted[0]) != "DECIDED":
        raise WriteJobError(f"write job {job.job_id}: stage {key} refused: {text(noted[1])} {text(noted[2])}")
    logger.info(
        "write job %s: already decided %s when task attempt %s began to write for %s: it writes nothing",
        job.job_id,
        text(noted[1]),
        attempt,
        stream,
    )
    return None


def settle_by_job_decision(job: Job, job_decision: JobDecision) -> int:
    """Publish the job decision's stages (a COMMIT), delete every other stage of the job, unlist it; returns the
    rows this call published. Raises [`UnpublishableJobError`][redis_txmq.core.errors.UnpublishableJobError] (after
    parking the job) when a committed stage is missing or holds other rows than staged (found before any row is
    published: nothing is), cannot be published or published other than its staged rows (a stage that cannot be counted
    before: the others are published)."""
    published, failures = 0, []
    if job_decision.outcome is COMMIT and job_decision.status != "DISCARDED":
        # every stage is checked before the first row is published: a stage missing or holding other rows than its
        # attempt staged parks the job with nothing of it published (never half of it, never a row twice)
        failures = check_stages(job, job_decision.stages, job_decision.rows)
    if job_decision.outcome is COMMIT and job_decision.status != "DISCARDED" and not failures:
        for stage in job_decision.stages:
            try:
                moved, total = publish_stage(job, stage)
            except UnpublishableJobError as exc:
                failures.append(str(exc))
                continue
            published += moved
            staged = job_decision.rows.get(stage)
            if staged is not None and total != staged:
                failures.append(f"stage {stage}: {total} rows published of the {staged} its attempt staged")
    if failures:
        reason = "; ".join(failures)
        registry.park(job, reason)
        raise UnpublishableJobError(
            f"write job {job.job_id}: committed, but not every row can be published: {reason}. The job is "
            f"parked: fix or delete what is named, then list it again (ZADD {JOB_REGISTRY} 0 "
            f"{job.keys.decision}) for txmq checker to publish the rest"
        )
    keep = set(job_decision.stages) if job_decision.outcome is COMMIT else set()
    delete_stages(job, keep, aside_only=job_decision.status == "DISCARDED")
    registry.unlist(job, job_decision)
    return published


def delete_stages(job: Job, keep: set[str], aside_only: bool) -> None:
    """Delete the stage streams of the job that are not to be published, then their lists. A discarded
    micro-batch deletes only its set aside stages: its stage list may already be a replay's."""
    client, keys = job.client, job.keys
    lists = [keys.set_aside] if aside_only else [keys.stages, keys.set_aside]
    for listed in lists:
        members = [text(m) or "" for m in job._do("read its stages", lambda k=listed: client.smembers(k))]
        for stage in members:
            if stage not in keep:
                job._do("delete a stage", lambda stage=stage: client.delete(stage))
        if members and listed == keys.set_aside:
            job._do("forget deleted stages", lambda m=members: client.srem(keys.set_aside, *m))
    if not aside_only:
        job._do("delete its stage list", lambda: client.delete(keys.stages))


def publish_stage(job: Job, stage: str) -> tuple[int, int]:
    """Move a stage into its topic stream, chunk by chunk (``lua/publish_stage.lua``, confirmed at the durability
    level): the rows this call moved, and the rows published from it in all (by any caller)."""
    stream = stream_of_stage(stage)
    keys = [stage, stream, published_key(stage)]
    args = [PUBLISH_CHUNK, job.settings.job_decision_lifetime_ms]  # the published count lives as long as the decision
    moved = 0
    while True:
        reply = job.call("publish", "publish_stage", keys, args, confirmed=True)
        status = text(reply[0])
        if status != "OK":
            code, detail = text(reply[1]), text(reply[2])
            if code in ("MISSING", "CORRUPT"):
                raise UnpublishableJobError(f"stage {stage}: {code}: {detail}")
            raise WriteJobError(f"write job {job.job_id}: stage {stage}: {code}: {detail}; it stays for a retry")
        moved += int(reply[1])
        if int(reply[2]) == 0:
            return moved, int(reply[3])
