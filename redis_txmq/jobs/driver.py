"""A write job's record and what a Spark driver and its task attempts call on it: lease, stage, decide, commit,
abort (``WriteJob``), and the lease a running task attempt keeps renewing (``LeaseKeeper``).

The job decision (``lua/decide_job.lua``, in the job's record ``txmq:job:{J}``) is written once: COMMIT with the stages
of the attempts Spark committed, or ROLLBACK; what is done on the stages by the decision that stands is in ``stages``,
when the checker looks at a job in ``registry`` and ``settling``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.clients import REDIS_ERRORS
from ..core.config import Settings
from ..core.entries import text
from ..core.errors import DurabilityError, JobNotCommittedError, TxMQConnectionError, TxMQError, WriteJobError
from ..core.keys import JobKeys
from ..core.message import LocalTransactionState
from ..core.scripts import register_script
from ..sync.wire import run_scripts
from ..transport.direct import ScriptRunner
from . import registry
from .job import JobDecision
from .stages import check_stages, open_stage, publish_stage, settle_by_job_decision

logger = logging.getLogger(__name__)

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK
SCRIPTS = ("decide_job", "settle_job", "lease_job", "publish_stage", "open_stage", "note_stage", "check_stage")
"""The Lua scripts a write job runs."""


Decision = JobDecision
"""The former name of ``JobDecision``."""


class WriteJob:
    """One write job on one client (``redis.Redis`` or ``RedisCluster``); ``close`` when done with it."""

    def __init__(self, client: Any, keys: JobKeys, settings: Settings | None = None, query_id: str = "") -> None:
        self.client = client
        self.keys = keys
        self.settings = settings or Settings()
        self.query_id = query_id
        """A micro-batch's streaming query (Spark's query id, kept by its checkpoint; '' when not known): a sink
        whose batches another query committed refuses its lease and its decision."""
        self._scripts = {name: register_script(client, name) for name in SCRIPTS}
        self._runner = ScriptRunner(client, run_scripts, direct=False, durability=self.settings.durability_level())
        self.plain_runner = ScriptRunner(client, run_scripts, direct=False)
        """Runs the calls that are not confirmed at the durability level. On a cluster each call goes to the master
        of its key, and a script that master does not hold yet is loaded there (redis-py's own fallback loads it on
        every master, and fails when one of them is down)."""

    def close(self) -> None:
        """Release the connections the script calls made their own (on a cluster); the client stays open."""
        self._runner.close()
        self.plain_runner.close()

    def script(self, name: str) -> Any:
        """The registered script ``lua/<name>.lua`` (one of ``SCRIPTS``)."""
        return self._scripts[name]

    @classmethod
    def new(cls, client: Any, settings: Settings | None = None) -> WriteJob:
        """A batch job with a new id."""
        return cls(client, JobKeys(os.urandom(16).hex()), settings)

    @classmethod
    def micro_batch(
        cls, client: Any, sink_id: str, batch_id: int, settings: Settings | None = None, query_id: str = ""
    ) -> WriteJob:
        return cls(client, JobKeys.of_batch(sink_id, batch_id), settings, query_id)

    @property
    def job_id(self) -> str:
        return self.keys.job_id

    @property
    def kind(self) -> str:
        """``micro`` (a micro-batch of a streaming sink) or ``batch``, as ``lua/settle_job.lua`` takes it."""
        return "micro" if self.keys.sink else "batch"

    def lease(self) -> int | None:
        """Take or renew the job's lease for ``job_lease`` (``lua/lease_job.lua``) and list the job for the checker
        at the lease's end; returns that end (server ms), or None when the job is decided (nothing to write)."""
        args = [
            int(self.settings.job_lease * 1000),
            self.settings.job_decision_lifetime_ms,
            self.settings.stage_lifetime_ms,
        ]
        keys = [self.keys.decision, self.keys.stages]
        if self.keys.sink:
            keys.append(self.keys.sink)
            args.append(self.query_id)
        reply = self.call("renew its lease", "lease_job", keys, args)
        status = text(reply[0])
        if status == "DECIDED":
            return None
        if status == "ERR" and text(reply[1]) == "OTHER_QUERY":
            raise self._other_query(text(reply[2]) or "")
        if status != "OK":
            raise WriteJobError(f"write job {self.job_id}: lease refused: {text(reply[1])} {text(reply[2])}")
        ends = int(reply[1])
        registry.list_job(self, ends)
        return ends

    def keep_stages(self) -> None:
        """Renew the time to live of every stage the job lists (``stages.check_stages``)."""
        listed = self._do("read its stages", lambda: self.client.smembers(self.keys.stages))
        if listed:
            check_stages(self, sorted(text(stage) or "" for stage in listed), {})

    def register(self) -> None:
        """Lease the job and list it for the checker (done by ``stage`` anyway, before any task writes)."""
        self.lease()

    def stage(self, stream: str, attempt: str) -> str | None:
        """The stage of task attempt ``attempt`` for ``stream`` (``stages.open_stage``), or None when the job
        is already decided: the attempt writes nothing."""
        return open_stage(self, stream, attempt)

    def decide(self, outcome: LocalTransactionState, stages: Iterable[str] | Mapping[str, int]) -> JobDecision:
        """Write the job decision (``lua/decide_job.lua``) unless one stands; ``stages`` may map each stage to the
        rows its attempt staged, which the publishing then checks. A COMMIT first checks every stage it names
        (``stages.check_stages``: the stages live in their topic streams' slots, out of ``decide_job``'s reach); one
        missing (expired, deleted after the lease passed) or holding other rows than staged ends the job as ``abort``
        does and raises [`JobNotCommittedError`][redis_txmq.core.errors.JobNotCommittedError], nothing published. Raises
        it too when a stage to commit is no longer the job's (set aside after its lease passed): nothing is decided."""
        rows = {str(stage): int(count) for stage, count in stages.items()} if isinstance(stages, Mapping) else {}
        listed = sorted(rows) if isinstance(stages, Mapping) else sorted(stages)
        if LocalTransactionState(outcome) is COMMIT and listed:
            failures = check_stages(self, listed, rows)
            if failures:
                return self._refused(failures)
        keys = [self.keys.decision, self.keys.stages] + ([self.keys.sink] if self.keys.sink else [])
        batch = str(self.keys.batch_id) if self.keys.sink else ""
        args = [
            LocalTransactionState(outcome).value,
            json.dumps(listed),
            self.settings.job_decision_lifetime_ms,
            batch,
            json.dumps(rows, sort_keys=True),
            self.query_id,
        ]
        try:
            reply = self.call("decide", "decide_job", keys, args, confirmed=True)
        except DurabilityError as exc:
            stands: Any = exc.replies[0] if exc.replies else None
            if stands and text(stands[0]) == "OK":  # it stands on the master: the checker finishes it
                registry.list_decided(self, self._job_decision(stands))
            raise
        job_decision = self._job_decision(reply)
        registry.list_decided(self, job_decision)
        return job_decision

    def _refused(self, failures: list[str]) -> JobDecision:
        """A COMMIT refused before it was decided, because a stage to commit is missing (expired, set aside after
        the lease passed) or holds other rows than its attempt staged: the job is ended as ``abort`` ends it, nothing of
        it published. Returns the job decision that stood before (a COMMIT is published by now); raises
        [`JobNotCommittedError`][redis_txmq.core.errors.JobNotCommittedError] when the job had none."""
        reason = "; ".join(failures)
        logger.warning("write job %s: COMMIT refused, the job is ended: %s", self.job_id, reason)
        ended = self.abort()
        if ended.status == "DUPLICATE":  # decided before this call: it stands (a COMMIT is published by now)
            return ended
        if ended.status == "DISCARDED":
            what = "its stages are deleted and its batch id stays free: Spark runs it again"
        else:
            what = f"{ended.outcome.value} stands: run it again"
        raise JobNotCommittedError(
            f"write job {self.job_id}: not committed, nothing of it was published: {reason}; {what}"
        )

    def _other_query(self, owner: str) -> WriteJobError:
        return WriteJobError(
            f"sink {self.keys.sink_id!r}: its micro-batches were committed by streaming query {owner}, and this is "
            f"query {self.query_id} (a new checkpoint with the same sinkId?): its batch {self.keys.batch_id} would be "
            "taken for one already committed and its rows dropped. Give this query a sinkId of its own, or restart "
            "the query from its own checkpoint"
        )

    def _job_decision(self, reply: Any) -> JobDecision:
        """The job decision in a ``decide_job`` reply."""
        status, first, second, third, rows, decided = (text(part) or "" for part in [*reply, "", "", "", "", ""][:6])
        if status == "ERR" and first == "OTHER_QUERY":
            raise self._other_query(second)
        if status != "OK":
            error = JobNotCommittedError if first == "MISSING" else WriteJobError
            raise error(f"write job {self.job_id}: job decision refused: {first}: {second}; run the job again")
        return JobDecision(
            LocalTransactionState(first), json.loads(second), third, json.loads(rows or "{}"), int(decided or 0) or None
        )

    def commit(self, stages: Iterable[str] | Mapping[str, int]) -> JobDecision:
        """Decide COMMIT for these stages (unless another job decision stands), then settle by the one that stands;
        returns it (a caller that needs its COMMIT checks ``outcome``: the checker may have rolled the job back once its
        lease passed). Raises [`JobNotCommittedError`][redis_txmq.core.errors.JobNotCommittedError] when a stage was set
        aside (nothing decided), and [`UnpublishableJobError`][redis_txmq.core.errors.UnpublishableJobError] when a
        committed row cannot be published."""
        job_decision = self.decide(COMMIT, stages)
        self.settle(job_decision)
        staged = dict(stages) if isinstance(stages, Mapping) else dict.fromkeys(stages, 1)
        if self.keys.sink and any(staged.values()) and job_decision.status in ("REPLAYED", "DUPLICATE"):
            if job_decision.status == "REPLAYED" or set(staged) - set(job_decision.stages):
                raise WriteJobError(
                    f"sink {self.keys.sink_id!r}: micro-batch {self.keys.batch_id} was committed before "
                    f"({job_decision.status}), yet this run staged rows of its own, which are not published (they "
                    "were deleted): a new query writing under the sinkId of another one, or a replay whose first "
                    "run's decision expired. Give a new query a sinkId of its own"
                )
        return job_decision

    def abort(self) -> JobDecision:
        """End the job without a new COMMIT (``lua/settle_job.lua``), then settle: a COMMIT that stands is published
        (the driver's commit raised after deciding); an undecided batch job is rolled back; an undecided micro-batch's
        stages are deleted without deciding, so Spark can run it again under the same id. A rollback the durability
        level did not confirm is settled all the same: lost in a failover, it leaves an undecided job, which is
        ended too once its lease passes; nothing is published either way."""
        job_decision = self._ended(self._end("abort", "abort", [0, 0]))
        if job_decision is None:  # GONE: nothing left
            job_decision = JobDecision(ROLLBACK, [], "DISCARDED")
        self.settle(job_decision)
        return job_decision

    def expire(self) -> tuple[str, JobDecision | None, int | None]:
        """The checker's look at this listed job (``lua/settle_job.lua`` in mode expire; what the checker does with
        it is ``settling``): ``(status, job decision to settle by or None, when to look again or None)``."""
        extra = [int(self.settings.job_lease * 1000), int(self.settings.transaction_timeout * 1000)]
        reply = self._end("settle", "expire", extra)
        status = text(reply[0]) or ""
        if status in ("WAIT", "LEASED"):
            return status, None, int(reply[4])
        return status, self._ended(reply), None

    def _end(self, what: str, mode: str, extra: list[Any]) -> Any:
        """Run ``lua/settle_job.lua`` in ``mode`` (abort: the driver; expire: the checker) with the ARGV after
        ``keep_ms``, confirmed at the durability level; its reply. A reply the level did not confirm is the
        master's all the same: logged, and returned to settle by."""
        args = [mode, self.kind, self.settings.job_decision_lifetime_ms, *extra]
        try:
            return self.call(what, "settle_job", self.keys.settle_keys, args, confirmed=True)
        except DurabilityError as exc:
            if not exc.replies:
                raise
            logger.warning("%s; settling by the job decision on the master", exc)
            return exc.replies[0]

    def _ended(self, reply: Any) -> JobDecision | None:
        """The job decision in a ``settle_job`` reply, or None when nothing is left of the job (GONE)."""
        status, outcome, staged, rows, ms = (text(part) or "" for part in [*reply, "", "", "", "", ""][:5])
        if status == "ERR":
            raise WriteJobError(f"write job {self.job_id}: settling refused: {outcome} {staged}")
        if status == "GONE":
            return None
        if status == "DISCARDED":
            return JobDecision(ROLLBACK, [], "DISCARDED")
        return JobDecision(
            LocalTransactionState(outcome), json.loads(staged), status, json.loads(rows), int(ms or 0) or None
        )

    def settle(self, job_decision: JobDecision) -> int:
        """Carry out the job decision on the stages (``stages.settle_by_job_decision``); returns the rows this
        call published. Raises [`UnpublishableJobError`][redis_txmq.core.errors.UnpublishableJobError] (after parking
        the job) when a committed row cannot be published."""
        return settle_by_job_decision(self, job_decision)

    def publish(self, stage: str) -> int:
        """Move a stage into its topic stream, chunk by chunk; returns the rows this call moved."""
        return publish_stage(self, stage)[0]

    def park(self, reason: str) -> None:
        """Keep the job listed out of the checker's way, for an operator (``registry.park``)."""
        registry.park(self, reason)

    def call(self, what: str, script: str, keys: list[str], args: list[Any], confirmed: bool = False) -> Any:
        """Run one of the job's scripts: ``confirmed`` at the durability level (a job decision, a publishing call),
        else as is (a lease, a stage opened: the writer's confirmation of its stage writes covers those)."""
        runner, registered = self._runner if confirmed else self.plain_runner, self._scripts[script]
        return self._do(what, lambda: runner.run(registered, keys, args))

    def _do(self, what: str, action: Any) -> Any:
        """Every Redis call of a job goes through here: its errors name the job and what to do."""
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
    (``start`` ... ``stop``): the job stays its driver's however long it runs. Every quarter of ``stage_lifetime`` it
    also renews the time to live of every stage the job lists, those of attempts that ended long ago too: a live job's
    stages never expire, however long its last task runs after its first. Stops by itself once the job is decided. A
    failed renewal is logged and tried again; the lease has two more thirds to run."""

    def __init__(self, job: WriteJob) -> None:
        self.job = job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"txmq-lease-{job.job_id}", daemon=True)
        self._stages_kept = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (also when never started)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        every = self.job.settings.stage_lifetime_ms / 4000
        while not self._stop.wait(self.job.settings.job_lease / 3):
            try:
                if self.job.lease() is None:
                    return
                if time.monotonic() - self._stages_kept >= every:
                    self.job.keep_stages()
                    self._stages_kept = time.monotonic()
            except TxMQError as exc:
                logger.warning("write job %s: lease not renewed, trying again: %s", self.job.job_id, exc)
