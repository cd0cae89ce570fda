"""Write jobs: many rows published exactly once, or not at all (the Spark writer's core; no Spark here).

A job's task attempts write their rows to *stages*: one stream per attempt and topic stream, in the topic stream's hash
slot, invisible to consumers; a stage entry packs up to ``ROWS_PER_STAGE_ENTRY`` rows in its one field
``STAGE_ROWS_FIELD`` (MessagePack, see ``lua/publish_stage.lua``), so that writing a row costs the server a fraction of
a command. The driver then writes the *job decision* once (``lua/decide_job.lua``, the record ``txmq:job:{J}``; not the
record of a transaction of several messages, ``txmq:decision:{X}``): COMMIT with the stages of the attempts Spark
committed and the rows each staged, or ROLLBACK. Settling follows the job decision that stands: every committed stage is
moved into its topic stream chunk by chunk (``lua/publish_stage.lua``, each chunk checked, moved and trimmed in one
call, so a repeat never publishes a row twice), the rows published are compared with the rows staged, and every other
stage — failed or speculative attempts, a rolled-back job — is deleted. Once COMMIT is decided the rows are published by
whoever settles next: the driver, Spark's abort, the checker or a replay.

An undecided job is its driver's while its *lease* holds (``lua/lease_job.lua``, ``Settings.job_lease``): its task
attempts renew it while they run (``LeaseKeeper``). The checker (``settle_jobs``) settles an undecided job only once its
lease has passed (``lua/settle_job.lua``: a batch job is rolled back, a micro-batch's stages are set aside), and a
decided one once its job decision is ``transaction_timeout`` old (its driver is settling it meanwhile). A commit that
finds another job decision standing, or whose stages were set aside, raises; so does one that cannot publish every
staged row ([`UnpublishableJobError`][redis_txmq.core.errors.UnpublishableJobError]: the job is *parked* for an
operator, never retried by itself).

A micro-batch of a streaming sink is a job whose decision also moves the sink's last committed batch id, in the
same call: a batch Spark replays after a restart finds its job decision (or a later batch id) and publishes nothing
new.

With a durability level (``Settings.durability``) the job decision and every publishing call are confirmed like a
producer's scripts (``WAIT`` / ``WAITAOF`` on the same connection, ``ScriptRunner``); the writer confirms its stage
writes the same way. A shortfall raises [`DurabilityError`][redis_txmq.core.errors.DurabilityError].

The modules, by who relies on them:

- ``driver``: ``WriteJob``, one job's record and what a Spark driver and its task attempts call on it
  (lease, stage, decide, commit, abort), ``JobDecision``, ``LeaseKeeper``;
- ``stages``: what a stage holds (the writer packs its rows by these constants) and how a job decision is
  carried out on the stages: opened and listed, published chunk by chunk, the others deleted, a job whose rows
  cannot all be published parked;
- ``registry``: the job registry ``txmq:jobs``, when the checker looks at each job next;
- ``settling``: the checker's policy, ``settle_jobs`` (``checker/worker.py`` runs it every round).

Lifetimes: a job's record (its lease, then its job decision) lives ``Settings.job_decision_lifetime``, its stages
``Settings.stage_lifetime`` (both by default ``max_age`` plus the dedupe window).
"""

from __future__ import annotations

from ..core.errors import JobNotCommittedError, UnpublishableJobError, WriteJobError
from .driver import COMMIT, ROLLBACK, Decision, JobDecision, LeaseKeeper, WriteJob
from .settling import SETTLE_BATCHES, SETTLING_ERRORS, settle_jobs
from .stages import PUBLISH_CHUNK, ROWS_PER_STAGE_ENTRY, STAGE_ENTRY_BYTES, STAGE_ROWS_FIELD

__all__ = [
    "COMMIT",
    "PUBLISH_CHUNK",
    "ROLLBACK",
    "ROWS_PER_STAGE_ENTRY",
    "SETTLE_BATCHES",
    "SETTLING_ERRORS",
    "STAGE_ENTRY_BYTES",
    "STAGE_ROWS_FIELD",
    "Decision",
    "JobDecision",
    "JobNotCommittedError",
    "LeaseKeeper",
    "UnpublishableJobError",
    "WriteJob",
    "WriteJobError",
    "settle_jobs",
]
