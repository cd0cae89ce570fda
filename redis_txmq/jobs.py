"""Write jobs: many rows published exactly once, or not at all (the Spark writer's core; no Spark here).

A job's task attempts write their rows to *stages*: one stream per attempt and topic stream, in the topic stream's
hash slot, invisible to consumers; a stage entry packs up to :data:`ROWS_PER_STAGE_ENTRY` rows in its one field
:data:`STAGE_ROWS_FIELD` (MessagePack, see ``lua/publish_stage.lua``), so that writing a row costs the server a
fraction of a command. The driver then decides once (``lua/decide_job.lua``): COMMIT with the stages of the
attempts Spark committed and the rows each staged, or ROLLBACK. Settling follows the decision that stands: every
committed stage is moved into its topic stream chunk by chunk (``lua/publish_stage.lua``, each chunk checked, moved
and trimmed in one call, so a repeat never publishes a row twice), the rows published are compared with the rows
staged, and every other stage — failed or speculative attempts, a rolled-back job — is deleted. Once COMMIT is
decided the rows are published by whoever settles next: the driver, Spark's abort, the checker or a replay.

An undecided job is its driver's while its *lease* holds (``lua/lease_job.lua``, ``Settings.job_lease``): its task
attempts renew it while they run (:class:`LeaseKeeper`). The checker (:func:`settle_jobs`) settles an undecided job
only once its lease has passed (``lua/settle_job.lua``: a batch job is rolled back, a micro-batch's stages are set
aside), and a decided one once its decision is ``transaction_timeout`` old (its driver is settling it meanwhile). A
commit that finds another decision standing, or whose stages were set aside, raises; so does one that cannot
publish every staged row (:class:`UnpublishableJobError`: the job is *parked* for an operator, never retried by
itself).

The job registry ``txmq:jobs`` holds, per job, when the checker looks at it next; it is an index in its own hash
slot, written after the job's own scripts, and every reader confirms what it says in the job's record.

A micro-batch of a streaming sink is a job whose decision also moves the sink's last committed batch id, in the
same call: a batch Spark replays after a restart finds its decision (or a later batch id) and publishes nothing new.

With a durability level (``Settings.durability``) the decision and every publishing call are confirmed like a
producer's scripts (``WAIT`` / ``WAITAOF`` on the same connection, :class:`~redis_txmq.direct.ScriptRunner`); the
writer confirms its stage writes the same way. A shortfall raises :class:`~redis_txmq.errors.DurabilityError`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import Settings
from .connection import REDIS_ERRORS
from .direct import ScriptRunner
from .entries import text
from .errors import (
    DurabilityError,
    JobNotCommittedError,
    TxMQConnectionError,
    TxMQError,
    UnpublishableJobError,
    WriteJobError,
)
from .keys import JOB_REGISTRY, JobKeys, published_key, stage_key, stream_of_stage
from .message import LocalTransactionState
from .scripts import register_script

logger = logging.getLogger(__name__)

STAGE_ROWS_FIELD = "rows"
ROWS_PER_STAGE_ENTRY = 100
"""Rows a writer packs into one stage entry at most (fewer when they reach :data:`STAGE_ENTRY_BYTES`)."""
STAGE_ENTRY_BYTES = 1 << 20
"""Body bytes after which a writer closes a stage entry early: one call never moves much more than a few MiB."""
PUBLISH_CHUNK = 10
"""Stage entries one ``publish_stage`` call moves (about 1,000 rows): large enough to cost little per row, small
enough to keep the server responsive between calls."""
SETTLE_BATCHES = 10
"""Batches of due jobs one :func:`settle_jobs` call takes at most: each job it looks at leaves the due range
(settled, parked, or rescheduled), so the next batch holds the next due ones, wherever they were listed."""

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK
SETTLING_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, TxMQError)
"""What the checker logs and tries again later when settling a job fails."""


@dataclass(frozen=True)
class Decision:
    """The decision that stands for a job, and whether this call made it."""

    outcome: LocalTransactionState
    stages: list[str]
    status: str
    """DECIDED (this call), DUPLICATE (an earlier decision stands), REPLAYED (the sink committed this batch
    before and its decision is gone: nothing to publish) or DISCARDED (a micro-batch's stages set aside, nothing
    decided)."""
    rows: dict[str, int] = field(default_factory=dict)
    """Rows each committed stage holds, as its attempt counted them (empty when the committer did not say)."""
    decided_ms: int | None = None


class WriteJob:
    """One write job on one client (``redis.Redis`` or ``RedisCluster``); :meth:`close` when done with it."""

    def __init__(self, client: Any, keys: JobKeys, settings: Settings | None = None) -> None:
        self.client = client
        self.keys = keys
        self.settings = settings or Settings()
        self._decide = register_script(client, "decide_job")
        self._settle = register_script(client, "settle_job")
        self._lease = register_script(client, "lease_job")
        self._publish = register_script(client, "publish_stage")
        self._open_stage = register_script(client, "open_stage")
        self._note_stage = register_script(client, "note_stage")
        self._runner = ScriptRunner(client, direct=False, durability=self.settings.durability_level())

    def close(self) -> None:
        """Release the connections the script calls made their own (on a cluster); the client stays open."""
        self._runner.close()

    @classmethod
    def new(cls, client: Any, settings: Settings | None = None) -> WriteJob:
        """A batch job with a new id."""
        return cls(client, JobKeys(os.urandom(16).hex()), settings)

    @classmethod
    def micro_batch(cls, client: Any, sink_id: str, batch_id: int, settings: Settings | None = None) -> WriteJob:
        return cls(client, JobKeys.of_batch(sink_id, batch_id), settings)

    @property
    def job_id(self) -> str:
        return self.keys.job_id

    @property
    def _kind(self) -> str:
        return "micro" if self.keys.sink else "batch"

    def lease(self) -> int | None:
        """Take or renew the job's lease for ``job_lease`` (``lua/lease_job.lua``) and list the job for the checker
        at the lease's end; returns that end (server ms), or None when the job is decided (nothing to write)."""
        args = [int(self.settings.job_lease * 1000), self.settings.kept_ms]
        reply = self._do("renew its lease", lambda: self._lease(keys=[self.keys.decision], args=args))
        status = text(reply[0])
        if status == "DECIDED":
            return None
        if status != "OK":
            raise WriteJobError(f"write job {self.job_id}: lease refused: {text(reply[1])} {text(reply[2])}")
        ends = int(reply[1])
        self._list(ends)
        return ends

    def register(self) -> None:
        """Lease the job and list it for the checker (done by :meth:`stage` anyway, before any task writes)."""
        self.lease()

    def stage(self, stream: str, attempt: str) -> str | None:
        """The stage of task attempt ``attempt`` for ``stream``: the job leased (and listed) first, then the stage
        opened empty with a time to live (``lua/open_stage.lua``; rows go in with ``XADD NOMKSTREAM``) and listed in
        the job's stages (``lua/note_stage.lua``). None when the job is already decided (a late or speculative
        attempt, a micro-batch replayed after a restart): the attempt writes nothing."""
        key = stage_key(stream, self.job_id, attempt)
        if self.lease() is None:
            logger.info(
                "write job %s: decided before task attempt %s began to write for %s", self.job_id, attempt, stream
            )
            return None
        # not confirmed here: the writer's confirmation of its stage writes covers these earlier writes too
        self._do("open a stage", lambda: self._open_stage(keys=[key], args=[self.settings.kept_ms]))
        args = [key, self.settings.kept_ms]
        noted = self._do("note a stage", lambda: self._note_stage(keys=self.keys.note_keys, args=args))
        if text(noted[0]) == "OK":
            return key
        self._do("delete a stage", lambda: self.client.delete(key))
        if text(noted[0]) != "DECIDED":
            raise WriteJobError(f"write job {self.job_id}: stage {key} refused: {text(noted[1])} {text(noted[2])}")
        logger.info(
            "write job %s: already decided %s when task attempt %s began to write for %s: it writes nothing",
            self.job_id,
            text(noted[1]),
            attempt,
            stream,
        )
        return None

    def decide(self, outcome: LocalTransactionState, stages: Iterable[str] | Mapping[str, int]) -> Decision:
        """Write the decision (``lua/decide_job.lua``) unless one stands; ``stages`` may map each stage to the rows
        its attempt staged, which the publishing then checks. Raises :class:`JobNotCommittedError` when a stage to
        commit is no longer the job's (set aside after its lease passed): nothing is decided."""
        rows = {str(stage): int(count) for stage, count in stages.items()} if isinstance(stages, Mapping) else {}
        listed = sorted(rows) if isinstance(stages, Mapping) else sorted(stages)
        keys = [self.keys.decision, self.keys.stages] + ([self.keys.sink] if self.keys.sink else [])
        batch = str(self.keys.batch_id) if self.keys.sink else ""
        args = [
            LocalTransactionState(outcome).value,
            json.dumps(listed),
            self.settings.kept_ms,
            batch,
            json.dumps(rows, sort_keys=True),
        ]
        try:
            reply = self._do("decide", lambda: self._runner.run(self._decide, keys, args))
        except DurabilityError as exc:
            stands: Any = exc.replies[0] if exc.replies else None
            if stands and text(stands[0]) == "OK":  # it stands on the master: the checker finishes it
                self._list_decided(self._decision(stands))
            raise
        decision = self._decision(reply)
        self._list_decided(decision)
        return decision

    def _decision(self, reply: Any) -> Decision:
        status, first, second, third, rows, decided = (text(part) or "" for part in [*reply, "", "", "", "", ""][:6])
        if status != "OK":
            error = JobNotCommittedError if first == "MISSING" else WriteJobError
            raise error(f"write job {self.job_id}: decision refused: {first}: {second}; run the job again")
        return Decision(
            LocalTransactionState(first), json.loads(second), third, json.loads(rows or "{}"), int(decided or 0) or None
        )

    def _list_decided(self, decision: Decision) -> None:
        """A decided job is due for the checker ``transaction_timeout`` after its decision."""
        if decision.decided_ms is not None:
            self._list(decision.decided_ms + int(self.settings.transaction_timeout * 1000))

    def commit(self, stages: Iterable[str] | Mapping[str, int]) -> Decision:
        """Decide COMMIT for these stages (unless another decision stands), then settle by the decision that stands;
        returns it (a caller that needs its COMMIT checks ``outcome``: the checker may have rolled the job back once
        its lease passed). Raises :class:`JobNotCommittedError` when a stage was set aside (nothing decided), and
        :class:`UnpublishableJobError` when a committed row cannot be published."""
        decision = self.decide(COMMIT, stages)
        self.settle(decision)
        return decision

    def abort(self) -> Decision:
        """End the job without a new COMMIT (``lua/settle_job.lua``), then settle: a COMMIT that stands is published
        (the driver's commit raised after deciding); an undecided batch job is rolled back; an undecided micro-batch's
        stages are deleted without deciding, so Spark can run it again under the same id. A rollback the durability
        level did not confirm is settled all the same: lost in a failover, it leaves an undecided job, which is
        ended too once its lease passes; nothing is published either way."""
        args = [self._kind, self.settings.kept_ms, 0, 0]
        try:
            reply = self._do("abort", lambda: self._runner.run(self._settle, self.keys.settle_keys, ["abort", *args]))
        except DurabilityError as exc:
            if not exc.replies:
                raise
            reply = exc.replies[0]
            logger.warning("%s; settling by the decision on the master", exc)
        decision = self._ended(reply)
        if decision is None:  # GONE: nothing left
            decision = Decision(ROLLBACK, [], "DISCARDED")
        self.settle(decision)
        return decision

    def _ended(self, reply: Any) -> Decision | None:
        """The decision in a ``settle_job`` reply, or None when nothing is left of the job (GONE)."""
        status, outcome, stages, rows, ms = (text(part) or "" for part in [*reply, "", "", "", "", ""][:5])
        if status == "ERR":
            raise WriteJobError(f"write job {self.job_id}: settling refused: {outcome} {stages}")
        if status == "GONE":
            return None
        if status == "DISCARDED":
            return Decision(ROLLBACK, [], "DISCARDED")
        return Decision(
            LocalTransactionState(outcome), json.loads(stages), status, json.loads(rows), int(ms or 0) or None
        )

    def settle(self, decision: Decision) -> int:
        """Publish the decision's stages (a COMMIT), delete every other stage of the job, unlist it; returns the rows
        this call published. Raises :class:`UnpublishableJobError` (after parking the job) when a committed stage is
        missing, cannot be published or published fewer rows than staged; the other stages are published first."""
        published, failures = 0, []
        if decision.outcome is COMMIT and decision.status != "DISCARDED":
            for stage in decision.stages:
                try:
                    moved, total = self._publish_all(stage)
                except UnpublishableJobError as exc:
                    failures.append(str(exc))
                    continue
                published += moved
                staged = decision.rows.get(stage)
                if staged is not None and total != staged:
                    failures.append(f"stage {stage}: {total} rows published of the {staged} its attempt staged")
        if failures:
            reason = "; ".join(failures)
            self.park(reason)
            raise UnpublishableJobError(
                f"write job {self.job_id}: committed, but not every row can be published: {reason}. The job is "
                f"parked: fix or delete what is named, then list it again (ZADD {JOB_REGISTRY} 0 "
                f"{self.keys.decision}) for txmq checker to publish the rest"
            )
        keep = set(decision.stages) if decision.outcome is COMMIT else set()
        self._delete_stages(keep, aside_only=decision.status == "DISCARDED")
        self._unlist()
        return published

    def _delete_stages(self, keep: set[str], aside_only: bool) -> None:
        """Delete the stage streams of the job that are not to be published, then their lists. A discarded
        micro-batch deletes only its set aside stages: its stage list may already be a replay's."""
        lists = [self.keys.set_aside] if aside_only else [self.keys.stages, self.keys.set_aside]
        for listed in lists:
            members = [text(m) or "" for m in self._do("read its stages", lambda k=listed: self.client.smembers(k))]
            for stage in members:
                if stage not in keep:
                    self._do("delete a stage", lambda stage=stage: self.client.delete(stage))
            if members and listed == self.keys.set_aside:
                self._do("forget deleted stages", lambda m=members: self.client.srem(self.keys.set_aside, *m))
        if not aside_only:
            self._do("delete its stage list", lambda: self.client.delete(self.keys.stages))

    def publish(self, stage: str) -> int:
        """Move a stage into its topic stream, chunk by chunk; returns the rows this call moved."""
        return self._publish_all(stage)[0]

    def _publish_all(self, stage: str) -> tuple[int, int]:
        """Rows this call moved from ``stage``, and rows published from it in all (by any caller)."""
        stream = stream_of_stage(stage)
        keys = [stage, stream, published_key(stage)]
        args = [PUBLISH_CHUNK, self.settings.kept_ms]
        moved = 0
        while True:
            reply = self._do("publish", lambda: self._runner.run(self._publish, keys, args))
            status = text(reply[0])
            if status != "OK":
                code, detail = text(reply[1]), text(reply[2])
                if code in ("MISSING", "CORRUPT"):
                    raise UnpublishableJobError(f"stage {stage}: {code}: {detail}")
                raise WriteJobError(f"write job {self.job_id}: stage {stage}: {code}: {detail}; it stays for a retry")
            moved += int(reply[1])
            if int(reply[2]) == 0:
                return moved, int(reply[3])

    def park(self, reason: str) -> None:
        """Keep the job listed, out of the checker's way (score ``+inf``), its reason in its record's ``parked``
        field, and say so in the log: its rows need an operator."""
        logger.error("write job %s parked (%s): %s", self.job_id, self.keys.decision, reason)
        self._do("park", lambda: self.client.hset(self.keys.decision, "parked", reason))
        self._do("park", lambda: self.client.zadd(JOB_REGISTRY, {self.keys.decision: "+inf"}))

    def _list(self, due_ms: int) -> None:
        self._do("list", lambda: self.client.zadd(JOB_REGISTRY, {self.keys.decision: due_ms}))

    def _unlist(self) -> None:
        """Unlist the settled job; a micro-batch that a replay leased meanwhile is listed again with its lease."""
        self._do("unlist", lambda: self.client.zrem(JOB_REGISTRY, self.keys.decision))
        lease = self._do("read its lease", lambda: self.client.hget(self.keys.decision, "lease_ms"))
        if lease is not None:  # only an undecided job holds one
            self._list(int(lease))

    def expire(self) -> tuple[str, Decision | None, int | None]:
        """The checker's look at this listed job (``lua/settle_job.lua`` in mode expire): ``(status, decision to
        settle by or None, when to look again or None)``."""
        args = [
            "expire",
            self._kind,
            self.settings.kept_ms,
            int(self.settings.job_lease * 1000),
            int(self.settings.transaction_timeout * 1000),
        ]
        try:
            reply = self._do("settle", lambda: self._runner.run(self._settle, self.keys.settle_keys, args))
        except DurabilityError as exc:
            if not exc.replies:
                raise
            reply = exc.replies[0]
            logger.warning("%s; settling by the decision on the master", exc)
        status = text(reply[0]) or ""
        if status in ("WAIT", "LEASED"):
            return status, None, int(reply[4])
        return status, self._ended(reply), None

    def _do(self, what: str, action: Any) -> Any:
        try:
            return action()
        except DurabilityError as exc:
            raise DurabilityError(
                f"write job {self.job_id}: {what}: {exc}; it was applied on the master, the job stays listed and "
                "txmq checker settles it",
                replies=exc.replies,
            ) from exc
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(f"write job {self.job_id}: could not {what} ({exc}); retry the job") from exc


class LeaseKeeper:
    """Renews a job's lease from a daemon thread every third of ``job_lease`` while a task attempt writes for it
    (:meth:`start` ... :meth:`stop`): the job stays its driver's however long it runs. Stops by itself once the job
    is decided. A failed renewal is logged and tried again; the lease has two more thirds to run."""

    def __init__(self, job: WriteJob) -> None:
        self.job = job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"txmq-lease-{job.job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (also when never started)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.job.settings.job_lease / 3):
            try:
                if self.job.lease() is None:
                    return
            except TxMQError as exc:
                logger.warning("write job %s: lease not renewed, trying again: %s", self.job.job_id, exc)


def settle_jobs(client: Any, settings: Settings, limit: int = 100) -> int:
    """Settle the write jobs that are due (``txmq:jobs`` score up to now, server clock), wherever they are listed:
    a decided one once its decision is ``transaction_timeout`` old (a live driver is settling it meanwhile; a repeat
    is harmless), an undecided one once its lease has passed (its driver is gone: a batch job is rolled back, a
    micro-batch's stages deleted, its batch id left free). A job still leased or decided too recently is listed
    again for then; one whose rows cannot all be published is parked; one whose settling failed otherwise is tried
    again after ``check_interval``. Returns the number of jobs settled."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    settled = 0
    for _ in range(SETTLE_BATCHES):
        due = client.zrangebyscore(JOB_REGISTRY, "-inf", now_ms, start=0, num=limit)
        for member in due:
            settled += _settle_due(client, text(member) or "", settings, now_ms)
        if len(due) < limit:
            break
    return settled


def _settle_due(client: Any, decision_key: str, settings: Settings, now_ms: int) -> int:
    """Settle one due job (1), or list it for later (0)."""
    try:
        keys = JobKeys.of_decision(decision_key)
    except ValueError:
        logger.warning("txmq:jobs lists %r, which is not a write job: removed", decision_key)
        client.zrem(JOB_REGISTRY, decision_key)
        return 0
    job = WriteJob(client, keys, settings)
    try:
        status, decision, later = job.expire()
        if later is not None:
            job._list(later)
            return 0
        if decision is None:
            job._unlist()
            return 0
        if status == "DECIDED":
            logger.warning("write job %s: its lease passed with no decision: rolled back", keys.job_id)
        elif status == "DISCARDED":
            logger.warning("write job %s: its lease passed with no decision: its stages are deleted", keys.job_id)
        job.settle(decision)
        logger.info("write job %s settled by the checker: %s", keys.job_id, decision.outcome.value)
        return 1
    except UnpublishableJobError:
        return 0  # parked, and logged
    except SETTLING_ERRORS as exc:
        logger.error(
            "write job %s: settling failed, tried again in %s s: %s", keys.job_id, settings.check_interval, exc
        )
        job._list(now_ms + int(settings.check_interval * 1000))
        return 0
    finally:
        job.close()
