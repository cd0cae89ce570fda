"""Write jobs against a model: hypothesis' stateful testing drives the Spark writer's real task and driver code
(``redis_txmq.spark.writer``: ``write_rows``, ``BatchWriter``, ``StreamWriter``, run here without Spark) and the
checker's settler on a real redis-server through random interleavings of batch jobs and the micro-batches of one
streaming sink: task attempts that stage rows (some fail, some are speculative duplicates), the driver's commit of
one attempt per partition, a commit that raises right after its decision (then Spark's abort, or the driver dies),
an abort, a driver that dies, a lease that passes (of a dead driver, or of one that stalled), check rounds, a
replayed micro-batch (also once its decision expired), a stage entry XADD would refuse, a stage that expires before
its job is decided, and a checker that pauses between setting a micro-batch's stages aside and settling it. A plain
Python model says which rows may be visible; after every step:

- no row is visible twice;
- a visible row belongs to an attempt of a job decided COMMIT, one the driver committed;
- a COMMIT naming a stage that expired is refused before it is decided: nothing of that job is published;
- a checker settling a discarded run never unlists a replay's decision (at quiescence every COMMIT is published).

and at quiescence (every driver gone, every lease passed, the settler run until nothing is due): every job all or
nothing, a committed one fully published (one with an unpublishable stage parked for an operator, nothing of it
published twice), nothing else listed, no stage left but a parked job's.

Expiry is driven, not waited for: a lease passes by setting its end in the past and listing the job as due (what
time does); a decision expires by deleting it and its published records. The checker runs with ``max_age`` and
``transaction_timeout`` near zero: a job's age must not matter, only its lease. A failing example is shrunk and
printed as a sequence of steps: make it a plain regression test.

A lease that passes comes with what meets it in the same step (its driver stalled or dead; a checker later, at once,
or at once and pausing), and as a stalled driver's commit after a round
(``a_stalled_driver_commits_after_its_lease_passed``); a replay may start long after (its batch's decision
expired). Each rule draws its choices and calls a step method; the known defect shapes are pinned programs of those
steps (``PINNED``, ``tests/model_programs.py``), run before the search in every run. The run is seeded at every
setting (the same 200 examples each time; ``TXMQ_MODEL_EXAMPLES=N`` runs N, seeded too); ``TXMQ_MODEL_RANDOM=1``
explores new ones. ``tests/README.md`` says which defects it finds, and how fast (``tests/model_defects/run.py``
re-introduces them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from redis_txmq import LocalTransactionState, Settings, TxMQError, create_topic
from redis_txmq.core.keys import JOB_REGISTRY, JobKeys
from redis_txmq.jobs import STAGE_ROWS_FIELD, WriteJob, settle_jobs

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # the driver's side is the Spark writer's code (no SparkSession)
    pytest.importorskip("pyspark", reason="the job model drives redis_txmq.spark.writer: the spark extra")

import pyarrow as pa  # noqa: E402
from pyspark.sql.types import StringType, StructField, StructType  # noqa: E402

from redis_txmq.spark.writer import BatchWriter, StreamWriter, _staged, parse_write_options, write_rows  # noqa: E402

from .model_programs import Programs, Steps  # noqa: E402

pytestmark = pytest.mark.real

TOPIC = "m"
STREAMS = ("m#0", "m#1")
SINK = "model-sink"
CHECKER = Settings(max_age=0.001, transaction_timeout=0)
"""The checker: every decided job is due at once; an undecided one only once its lease has passed."""
EXAMPLES = int(os.environ.get("TXMQ_MODEL_EXAMPLES", "200"))
RANDOM = bool(os.environ.get("TXMQ_MODEL_RANDOM"))
"""Seeded at every number of examples (the same examples on every run); ``TXMQ_MODEL_RANDOM=1`` explores new ones."""
PHASES = [p for p in Phase if os.environ.get("TXMQ_MODEL_SHRINK") != "0" or p not in (Phase.shrink, Phase.explain)]
"""``TXMQ_MODEL_SHRINK=0``: a failure is reported as found, not shrunk (to time the search alone)."""
COUNTS = st.integers(0, 4)
ENDINGS = st.sampled_from(["succeeds", "succeeds", "fails", "fails reading"])
"""How a task attempt ends: it returns its commit message, or fails after writing (its message lost), or while
reading its rows (nothing written past its stages' opening)."""
BAD_ENTRY = msgpack.packb([["transaction_id", "bad", "body", "bad row", "flag", True]])
"""A stage entry whose row XADD refuses (a boolean)."""

CLIENT: redis.Redis | None = None
URL = ""
"""The real server of the test session (set by the test before the machine runs)."""


class TaskFailed(Exception):
    """What a task attempt that fails while it reads its rows raises."""


@dataclass
class Attempt:
    name: str
    partition: int
    rows: list[str]
    """The rows it staged (none when the job was decided before it began, or it failed while reading)."""
    message: Any = None
    """Its commit message, when it succeeded."""
    corrupt: str | None = None
    """Its stage that holds an entry XADD refuses."""
    expired: bool = False
    """Its stage expired before the job was decided (nothing renewed it)."""


@dataclass
class Job:
    """One job record: a batch job, or one batch id of the sink (run by one or more incarnations)."""

    label: str
    keys: JobKeys
    micro: bool
    decided: str | None = None
    committed: set[str] = field(default_factory=set)
    """The rows of the COMMIT decision (the attempts it names)."""
    unpublishable: bool = False
    """A committed attempt holds an entry that cannot be published: the job is parked, never all of it visible."""
    lease_passed: bool = False
    set_aside: set[str] = field(default_factory=set)
    """Attempts whose stages the settler set aside (a micro-batch discarded undecided)."""
    attempts: dict[str, Attempt] = field(default_factory=dict)
    decision_expired: bool = False


@dataclass
class Run:
    """A driver running a job: a batch job's, or one run of a micro-batch by the streaming query."""

    job: Job
    partitions: int
    writer: Any
    attempts: list[str] = field(default_factory=list)


class JobModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert CLIENT is not None
        self.client = CLIENT
        self.client.flushall()
        create_topic(self.client, TOPIC, 2)
        schema = StructType([StructField("body", StringType())])
        common = {"redis.url": URL, "topic": TOPIC}
        self.batch_options = parse_write_options(common, schema, streaming=False)
        self.stream_options = parse_write_options({**common, "sinkId": SINK}, schema, streaming=True)
        self.jobs: list[Job] = []
        self.micro: dict[int, Job] = {}
        self.runs: list[Run] = []
        self.paused: list[tuple[Job, WriteJob, Any]] = []
        """Checkers paused between their look at a job (its stages set aside) and their settling of it."""
        self.checkpoint = -1
        """The last micro-batch the query's checkpoint recorded as committed (its commit returned)."""
        self.counter = 0

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def visible(self) -> list[str]:
        return [f[b"body"].decode() for stream in STREAMS for _, f in self.client.xrange(stream)]

    def _spark_call(self, action: Any, expect_raise: bool, what: str) -> bool:
        """Run a driver call; True when it raised (as the model expected: asserted)."""
        try:
            action()
        except (TxMQError, redis.ResponseError) as exc:
            assert expect_raise, f"{what} raised: {exc}"
            return True
        assert not expect_raise, f"{what} returned, but the model expected it to raise"
        return False

    def _end(self, run: Run) -> None:
        self.runs.remove(run)

    def _commit_expectation(self, run: Run, chosen: list[Attempt]) -> tuple[bool, bool]:
        """(the commit raises, it decides COMMIT now)."""
        job = run.job
        if job.decided == "ROLLBACK":
            return True, False
        if job.decided == "COMMIT":
            return job.unpublishable, False
        if any((attempt.name in job.set_aside or attempt.expired) and attempt.rows for attempt in chosen):
            return True, False  # a stage to commit is gone: refused before deciding, the job ended as an abort ends it
        if job.micro and job.decision_expired:  # REPLAYED: the sink's last batch refuses it, nothing to publish;
            return any(attempt.rows for attempt in chosen), False  # rows of its own, dropped: said, not in silence
        return any(attempt.corrupt for attempt in chosen), True

    def _decide_commit(self, job: Job, chosen: list[Attempt]) -> None:
        job.decided = "COMMIT"
        job.committed = {row for attempt in chosen for row in attempt.rows}
        job.unpublishable = any(attempt.corrupt for attempt in chosen)
        job.lease_passed = False

    def _assert_published(self, job: Job) -> None:
        if job.decided == "COMMIT" and not job.unpublishable:
            seen = {row for row in self.visible() if row.startswith(f"{job.label}/")}
            assert seen == job.committed, f"{job.label}: committed rows not all published: {job.committed - seen}"

    def _abort(self, run: Run, messages: list[Any]) -> None:
        """Spark's abort of a run: a COMMIT that stands is published, else the job ends undecided."""
        job = run.job
        expect_raise = job.decided == "COMMIT" and job.unpublishable
        if job.micro:
            self._spark_call(lambda: run.writer.abort(messages, self._batch_id(job)), expect_raise, "abort")
        else:
            self._spark_call(lambda: run.writer.abort(messages), expect_raise, "abort")
        if job.decided is None:
            if job.micro:
                job.set_aside |= set(job.attempts)
                job.lease_passed = False
            else:
                job.decided = "ROLLBACK"
        self._assert_published(job)
        self._end(run)

    def _batch_id(self, job: Job) -> int:
        return job.keys.batch_id

    def _choose(self, data: st.DataObject, run: Run) -> list[Attempt]:
        """One succeeded attempt per partition (Spark commits the first to finish: any of them)."""
        chosen = []
        for partition in range(run.partitions):
            done = [
                run.job.attempts[name]
                for name in run.attempts
                if run.job.attempts[name].partition == partition and run.job.attempts[name].message is not None
            ]
            chosen.append(data.draw(st.sampled_from(done), label=f"attempt committed for partition {partition}"))
        return chosen

    def _committable(self) -> list[Run]:
        return [
            run
            for run in self.runs
            if all(
                any(
                    run.job.attempts[name].partition == p and run.job.attempts[name].message is not None
                    for name in run.attempts
                )
                for p in range(run.partitions)
            )
        ]

    # -- rules (each draws its choices, then calls the step below it: the pinned programs call the steps) -----------

    def _plan(self, data: st.DataObject, partitions: int) -> list[tuple[int, str]]:
        """Per partition, the rows its first attempt stages and how it ends."""
        return [(data.draw(COUNTS, label="rows"), data.draw(ENDINGS, label="ending")) for _ in range(partitions)]

    @rule(data=st.data(), partitions=st.integers(1, 2))
    def start_batch_job(self, data: st.DataObject, partitions: int) -> None:
        """A batch write: the driver makes its writer, then a task attempt per partition runs."""
        self.batch_job(self._plan(data, partitions))

    def batch_job(self, plan: list[tuple[int, str]]) -> Run:
        writer = BatchWriter(self.batch_options)
        job = Job(self._name("b"), writer.keys, micro=False)
        self.jobs.append(job)
        return self._start(Run(job, len(plan), writer), plan)

    @precondition(lambda self: not any(run.job.micro for run in self.runs))
    @rule(data=st.data(), partitions=st.integers(1, 2), long_after=st.booleans())
    def start_micro_batch(self, data: st.DataObject, partitions: int, long_after: bool) -> None:
        """The query runs its next micro-batch: the one after the last its checkpoint recorded (a replay when the
        sink had committed it); ``long_after``: a restart so late that the decision of the batch it replays has
        expired."""
        if long_after and self._expirable():
            self.expire_decision(self._expirable()[0])
        self.micro_batch(self._plan(data, partitions))

    def micro_batch(self, plan: list[tuple[int, str]]) -> Run:
        assert not any(run.job.micro for run in self.runs), "one micro-batch of the query runs at a time"
        batch_id = self.checkpoint + 1
        job = self.micro.get(batch_id)
        if job is None:
            job = self.micro[batch_id] = Job(f"s{batch_id}", JobKeys.of_batch(SINK, batch_id), micro=True)
            self.jobs.append(job)
        return self._start(Run(job, len(plan), StreamWriter(self.stream_options)), plan)

    def _start(self, run: Run, plan: list[tuple[int, str]]) -> Run:
        self.runs.append(run)
        for partition, (count, ending) in enumerate(plan):
            self._attempt(run, partition, count, ending)
        return run

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), count=COUNTS, ending=ENDINGS)
    def task_attempt(self, data: st.DataObject, count: int, ending: str) -> None:
        """Another attempt of a partition: a retry, or a speculative duplicate."""
        run = data.draw(st.sampled_from(self.runs), label="run")
        self._attempt(run, data.draw(st.integers(0, run.partitions - 1), label="partition"), count, ending)

    def _attempt(self, run: Run, partition: int, count: int, ending: str) -> None:
        job = run.job
        name = self._name("a")
        rows = [f"{job.label}/{name}/{n}" for n in range(count)]

        def batches() -> Any:
            yield pa.RecordBatch.from_pydict({"body": rows})
            if ending == "fails reading":
                raise TaskFailed(name)

        options = self.stream_options if job.micro else self.batch_options
        try:
            message = write_rows(options, job.keys, batches())
        except TaskFailed:
            message = None
        staged = rows if job.decided is None and ending != "fails reading" else []
        if message is not None:
            assert bool(message.stages) == bool(staged), f"{name}: stages {message.stages} for rows {staged}"
        if job.decided is None:
            job.lease_passed = False  # the attempt renewed the lease
        attempt = Attempt(name, partition, staged, message if ending == "succeeds" else None)
        job.attempts[name] = attempt
        run.attempts.append(name)

    def first_done(self, run: Run) -> list[Attempt]:
        """The first attempt of each partition that succeeded (what a pinned program commits)."""
        return [
            next(
                run.job.attempts[name]
                for name in run.attempts
                if run.job.attempts[name].partition == partition and run.job.attempts[name].message is not None
            )
            for partition in range(run.partitions)
        ]

    @precondition(lambda self: self._committable())
    @rule(data=st.data())
    def driver_commits(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(self._committable()), label="run")
        self.commit(run, self._choose(data, run))

    def commit(self, run: Run, chosen: list[Attempt]) -> None:
        job = run.job
        messages = [attempt.message for attempt in chosen]
        raises, decides = self._commit_expectation(run, chosen)
        if job.micro:
            action = lambda: run.writer.commit(messages, self._batch_id(job))  # noqa: E731
        else:
            action = lambda: run.writer.commit(messages)  # noqa: E731
        if decides:
            self._decide_commit(job, chosen)
        if self._spark_call(action, raises, "commit"):
            self._abort(run, messages)  # Spark aborts a job whose commit raised; a micro-batch's query fails
            return
        self._assert_published(job)
        if job.micro:
            self.checkpoint = self._batch_id(job)
        self._end(run)

    def _undecided(self) -> list[Run]:
        return [run for run in self._committable() if run.job.decided is None and not run.job.decision_expired]

    @precondition(lambda self: self._undecided())
    @rule(data=st.data(), then=st.sampled_from(["abort", "driver dies"]), partial=st.booleans())
    def driver_commit_raises_after_deciding(self, data: st.DataObject, then: str, partial: bool) -> None:
        """The commit decides COMMIT, maybe publishes a stage, and raises (a durability shortfall, a dropped
        connection): Spark calls abort, or the driver dies before. (A decision that names a set aside stage is
        refused: nothing decided.)"""
        run = data.draw(st.sampled_from(self._undecided()), label="run")
        self.commit_raises_after_deciding(run, self._choose(data, run), then, partial)

    def commit_raises_after_deciding(self, run: Run, chosen: list[Attempt], then: str, partial: bool) -> None:
        job = run.job
        messages = [attempt.message for attempt in chosen]
        staged = _staged(messages)
        refused = any((attempt.name in job.set_aside or attempt.expired) and attempt.rows for attempt in chosen)

        def decide(write_job: WriteJob) -> None:
            write_job.decide(LocalTransactionState.COMMIT, staged)

        if job.micro:
            self._spark_call(lambda: run.writer._settle(self._batch_id(job), decide), refused, "deciding")
        else:
            self._spark_call(lambda: run.writer._settle(decide), refused, "deciding")
        if not refused:
            self._decide_commit(job, chosen)
        elif job.micro:  # the refusal ends the job as an abort does: its stages set aside, nothing decided
            job.set_aside |= set(job.attempts)
            job.lease_passed = False
        else:
            job.decided = "ROLLBACK"
        stages = sorted(staged) if not refused else []
        if partial and stages:  # the publishing stopped after one stage
            corrupt = any(attempt.corrupt == stages[0] for attempt in chosen)
            writing = WriteJob(self.client, job.keys)
            try:
                self._spark_call(lambda: writing.publish(stages[0]), corrupt, "publishing one stage")
            finally:
                writing.close()
        if then == "abort":
            self._abort(run, messages)
        else:
            self._end(run)

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def spark_aborts(self, data: st.DataObject) -> None:
        """A task failed for good (or the query stopped): Spark aborts with the messages it has."""
        self.spark_abort(data.draw(st.sampled_from(self.runs), label="run"))

    def spark_abort(self, run: Run) -> None:
        messages = [run.job.attempts[name].message for name in run.attempts]
        self._abort(run, [m for m in messages if m is not None])

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def driver_dies(self, data: st.DataObject) -> None:
        """It stops renewing, committing and aborting; its tasks die with it."""
        self._end(data.draw(st.sampled_from(self.runs), label="run"))

    @precondition(lambda self: any(job.decided is None and job.attempts for job in self.jobs))
    @rule(
        data=st.data(),
        driver=st.sampled_from(["stalled", "died"]),
        checker=st.sampled_from(["later", "round", "pauses"]),
    )
    def lease_passes(self, data: st.DataObject, driver: str, checker: str) -> None:
        """Time passes beyond the job's lease with no renewal: its driver stalled (it may still commit) or died;
        then a checker looks later, at once (a round), or at once and pauses between setting a micro-batch's stages
        aside and settling it."""
        job = data.draw(st.sampled_from([j for j in self.jobs if j.decided is None and j.attempts]), label="job")
        if driver == "died":
            for run in [run for run in self.runs if run.job is job]:
                self._end(run)
        self.lease_passes_for(job)
        if checker == "round":
            self.checker_round()
        elif checker == "pauses" and job.micro:
            self.pause_checker(job)

    def lease_passes_for(self, job: Job) -> None:
        self._lease_passes(job)
        job.lease_passed = True

    def _lease_passes(self, job: Job) -> None:
        """What time does to a lease: its end is past, and the job is due."""
        if self.client.hexists(job.keys.decision, "lease_ms"):
            self.client.hset(job.keys.decision, "lease_ms", 1)
        self.client.zadd(JOB_REGISTRY, {job.keys.decision: 0})

    @precondition(lambda self: self._undecided())
    @rule(data=st.data())
    def a_stalled_driver_commits_after_its_lease_passed(self, data: st.DataObject) -> None:
        """The narrow path of a lease that passes under a live driver, in one step: the driver stalls, its lease
        passes, a check round settles the job (a batch job rolled back, a micro-batch's stages set aside), then the
        driver wakes and commits: the commit must raise, nothing published."""
        run = data.draw(st.sampled_from(self._undecided()), label="run")
        self.lease_passes_for(run.job)
        self.checker_round()
        self.commit(run, self._choose(data, run))

    @precondition(lambda self: any(job.decided for job in self.jobs))
    @rule()
    def transaction_timeout_passes(self) -> None:
        """Every decision is older than transaction_timeout: due for the checker (its driver may be publishing)."""
        listed = self.client.zrange(JOB_REGISTRY, 0, -1, withscores=True)
        due = {m: 0 for m, score in listed if score != float("inf") and self.client.hexists(m, "outcome")}
        if due:
            self.client.zadd(JOB_REGISTRY, due)

    @rule()
    def checker_round(self) -> None:
        """A check round: it settles what is due, and only that."""
        now = self.client.time()
        due = set(self.client.zrangebyscore(JOB_REGISTRY, "-inf", int(now[0]) * 1000 + int(now[1]) // 1000))
        settle_jobs(self.client, CHECKER)
        for job in self.jobs:
            if job.keys.decision.encode() in due:
                self._assert_published(job)
        for job in self.jobs:
            if job.decided is None and job.lease_passed:
                if job.micro:
                    job.set_aside |= set(job.attempts)
                else:
                    job.decided = "ROLLBACK"
                job.lease_passed = False

    def _passed(self) -> list[Job]:
        return [job for job in self.jobs if job.micro and job.decided is None and job.lease_passed]

    @precondition(lambda self: self._passed())
    @rule(data=st.data())
    def a_checker_pauses_before_settling(self, data: st.DataObject) -> None:
        """A checker sets aside the stages of a micro-batch whose lease passed, then pauses before it deletes them
        and unlists the job: a replay of the batch may lease, decide COMMIT and die meanwhile."""
        self.pause_checker(data.draw(st.sampled_from(self._passed()), label="job"))

    def pause_checker(self, job: Job) -> None:
        checker = WriteJob(self.client, job.keys, CHECKER)
        status, job_decision, _ = checker.expire()
        if status != "DISCARDED" or job_decision is None:
            checker.close()
            return
        job.set_aside |= set(job.attempts)
        job.lease_passed = False
        self.paused.append((job, checker, job_decision))

    @precondition(lambda self: self.paused)
    @rule(data=st.data())
    def a_paused_checker_settles(self, data: st.DataObject) -> None:
        """It deletes the stages it set aside and unlists the job, unless another run of it is not settled."""
        self.settle_paused(data.draw(st.integers(0, len(self.paused) - 1), label="paused"))

    def settle_paused(self, index: int) -> None:
        job, checker, job_decision = self.paused.pop(index)
        try:
            checker.settle(job_decision)
        finally:
            checker.close()

    def _corruptible(self) -> list[Attempt]:
        return [
            a
            for j in self.jobs
            if j.decided is None
            for a in j.attempts.values()
            if a.rows and a.message and a.name not in j.set_aside
        ]

    @precondition(lambda self: self._corruptible())
    @rule(data=st.data())
    def a_stage_entry_xadd_would_refuse(self, data: st.DataObject) -> None:
        """Another tool (or a bug) wrote into a task attempt's stage an entry whose row cannot be published."""
        self.corrupt_stage(data.draw(st.sampled_from(self._corruptible()), label="attempt"))

    def corrupt_stage(self, attempt: Attempt) -> None:
        stage = attempt.message.stages[-1]
        if self.client.xadd(stage, {STAGE_ROWS_FIELD: BAD_ENTRY}, nomkstream=True) is not None:
            attempt.corrupt = stage

    def _live_stages(self) -> list[Attempt]:
        return [
            a
            for j in self.jobs
            if j.decided is None
            for a in j.attempts.values()
            if a.rows and a.message and a.name not in j.set_aside and not a.expired
        ]

    @precondition(lambda self: self._live_stages())
    @rule(data=st.data())
    def a_stage_expires_before_the_decision(self, data: st.DataObject) -> None:
        """A task attempt's stage expires while its job is undecided (no running task renewed it): a COMMIT naming it
        is refused before it is decided, and nothing of the job is published (never half of it)."""
        self.expire_stage(data.draw(st.sampled_from(self._live_stages()), label="attempt"))

    def expire_stage(self, attempt: Attempt) -> None:
        for stage in attempt.message.stages:
            self.client.delete(stage)
        attempt.expired = True

    def _expirable(self) -> list[Job]:
        """The micro-batch the query runs next, when it was committed and its checkpoint did not record it (its
        commit raised after deciding): the expiry of its decision is what a replay can meet. (An earlier batch's
        decision expiring changes nothing the query can see: it never runs that batch id again.)"""
        job = self.micro.get(self.checkpoint + 1)
        if job is None or job.decided != "COMMIT" or job.unpublishable or job.decision_expired:
            return []
        return [job]

    @precondition(lambda self: self._expirable())
    @rule(data=st.data())
    def a_micro_batch_decision_expires(self, data: st.DataObject) -> None:
        """Long after: the decision of a published micro-batch is gone (the sink's last batch id stays), before
        the query runs that batch again."""
        self.expire_decision(data.draw(st.sampled_from(self._expirable()), label="job"))

    def expire_decision(self, job: Job) -> None:
        if self.client.zscore(JOB_REGISTRY, job.keys.decision) is not None:
            return  # not settled yet: its decision outlives the publishing
        self._assert_published(job)
        self.client.delete(job.keys.decision)
        for key in self.client.scan_iter(match=f"txmq:*:published:{job.keys.job_id}:*"):
            self.client.delete(key)
        job.decision_expired = True
        job.decided = None

    # -- invariants ------------------------------------------------------------------------------------------------

    @invariant()
    def nothing_twice_and_nothing_uncommitted(self) -> None:
        rows = self.visible()
        assert len(rows) == len(set(rows)), f"published twice: {sorted(r for r in rows if rows.count(r) > 1)}"
        committed = {
            row for job in self.jobs if job.decided == "COMMIT" or job.decision_expired for row in job.committed
        }
        assert set(rows) <= committed, f"visible, never committed: {sorted(set(rows) - committed)}"

    def check_now(self) -> None:
        """Every invariant, as hypothesis checks them after each step (for the pinned programs)."""
        self.nothing_twice_and_nothing_uncommitted()

    def close(self) -> None:
        """Release the paused checkers' connections (a program that failed leaves them)."""
        while self.paused:
            self.paused.pop()[1].close()

    def teardown(self) -> None:
        """Quiescence: every driver gone, every paused checker done, every lease passed, the settler run until
        nothing is due."""
        while self.paused:
            _, checker, job_decision = self.paused.pop()
            try:
                checker.settle(job_decision)
            finally:
                checker.close()
        for job in self.jobs:
            if job.decided is None:
                self._lease_passes(job)
        for _ in range(5):
            listed = {m: s for m, s in self.client.zrange(JOB_REGISTRY, 0, -1, withscores=True) if s != float("inf")}
            if not listed:
                break
            self.client.zadd(JOB_REGISTRY, {m: 0 for m in listed})
            settle_jobs(self.client, CHECKER)
        self.nothing_twice_and_nothing_uncommitted()
        rows = set(self.visible())
        parked = set()
        for job in self.jobs:
            mine = {row for row in rows if row.startswith(f"{job.label}/")}
            if job.decided == "COMMIT" or job.decision_expired:
                if job.unpublishable:
                    assert mine <= job.committed
                    parked.add(job.keys.decision.encode())
                else:
                    assert mine == job.committed, f"{job.label}: {len(mine)} of {len(job.committed)} published"
            else:
                assert not mine, f"{job.label}: never committed, yet published {sorted(mine)}"
        listed = self.client.zrange(JOB_REGISTRY, 0, -1, withscores=True)
        assert {m for m, _ in listed} == parked, f"listed at quiescence: {listed}"
        assert all(score == float("inf") for _, score in listed), "a parked job is out of the checker's way"
        for pattern in ("txmq:job:*", "txmq:*:published:*"):
            for key in self.client.scan_iter(match=pattern):
                assert self.client.pttl(key) > 0, f"{key!r} kept for ever"
        kept = [(m.decode() + ":", f":stage:{JobKeys.of_decision(m.decode()).job_id}:") for m in parked]
        for pattern in ("txmq:*:stage:*", "txmq:job:*:stages", "txmq:job:*:set-aside"):
            for key in (k.decode() for k in self.client.scan_iter(match=pattern)):
                assert any(key.startswith(job) or stage in key for job, stage in kept), f"{key} left at quiescence"


PINNED = Programs()
"""The known defect shapes, as explicit programs of the model's steps: each once found a defect (the patch of
``tests/model_defects/`` it names re-introduces it), and runs in every run whatever the random search draws."""


@PINNED.pin
def a_commit_after_the_lease_passed(s: Steps) -> None:
    """A batch job's driver stalls past its lease, a check round rolls the job back, then the driver commits: the
    commit must raise, so Spark reports the job failed (07)."""
    run = s.batch_job(plan=[(1, "succeeds")])
    s.lease_passes_for(job=run.job)
    s.checker_round()
    s.commit(run=run, chosen=s.machine.first_done(run))


@PINNED.pin
def a_check_round_under_a_live_driver(s: Steps) -> None:
    """A check round while a batch job's lease holds (with max_age near zero), then the commit: the job is its
    driver's, the commit publishes every row (08)."""
    run = s.batch_job(plan=[(1, "succeeds")])
    s.checker_round()
    s.commit(run=run, chosen=s.machine.first_done(run))


@PINNED.pin
def an_abort_after_the_decision(s: Steps) -> None:
    """A micro-batch's commit decides COMMIT and raises before publishing; Spark aborts: the abort publishes the
    committed rows (09)."""
    run = s.micro_batch(plan=[(1, "succeeds")])
    s.commit_raises_after_deciding(run=run, chosen=s.machine.first_done(run), then="abort", partial=False)


@PINNED.pin
def a_stage_with_a_row_xadd_refuses(s: Steps) -> None:
    """A stage holds two good rows and then an entry XADD refuses; the commit raises (the job is parked) and Spark
    aborts: the good rows are never published twice (10)."""
    run = s.batch_job(plan=[(2, "succeeds")])
    s.corrupt_stage(attempt=s.machine.first_done(run)[0])
    s.commit(run=run, chosen=s.machine.first_done(run))


@PINNED.pin
def a_commit_naming_an_expired_stage(s: Steps) -> None:
    """One of a batch job's two stages expires before the commit: the COMMIT is refused before it is decided,
    nothing of the job published (never half of it) (11)."""
    run = s.batch_job(plan=[(1, "succeeds"), (1, "succeeds")])
    s.expire_stage(attempt=s.machine.first_done(run)[0])
    s.commit(run=run, chosen=s.machine.first_done(run))


@PINNED.pin
def a_replay_decides_while_a_checker_pauses(s: Steps) -> None:
    """A micro-batch's driver dies and its lease passes; a checker sets its stages aside and pauses; the replay
    leases, decides COMMIT and dies; the checker settles the discarded run: the replay's COMMIT must stay listed,
    and be published (12)."""
    run = s.micro_batch(plan=[(1, "succeeds")])
    s._end(run=run)
    s.lease_passes_for(job=run.job)
    s.pause_checker(job=run.job)
    replay = s.micro_batch(plan=[(1, "succeeds")])
    s.commit_raises_after_deciding(run=replay, chosen=s.machine.first_done(replay), then="driver dies", partial=False)
    s.settle_paused(index=0)


@PINNED.pin
def a_replay_with_rows_after_the_decision_expired(s: Steps) -> None:
    """A micro-batch is committed (by Spark's abort after its commit raised: the checkpoint did not record it), its
    decision expires, and the replay stages rows of its own: its commit must raise, not drop them in silence (13)."""
    run = s.micro_batch(plan=[(1, "succeeds")])
    s.commit_raises_after_deciding(run=run, chosen=s.machine.first_done(run), then="abort", partial=False)
    s.expire_decision(job=run.job)
    replay = s.micro_batch(plan=[(1, "succeeds")])
    s.commit(run=replay, chosen=s.machine.first_done(replay))


@pytest.fixture
def model_client(redis_url: str) -> Iterator[redis.Redis]:
    """The session's server, where the machine finds it."""
    global CLIENT, URL
    CLIENT, URL = redis.Redis.from_url(redis_url), redis_url
    try:
        yield CLIENT
    finally:
        CLIENT.close()
        CLIENT = None


@pytest.mark.parametrize("program", sorted(PINNED))
def test_pinned_program_holds(model_client: redis.Redis, program: str) -> None:
    PINNED.run(program, JobModel())


@pytest.mark.timeout(600)
def test_write_jobs_hold_against_their_model(model_client: redis.Redis) -> None:
    run_state_machine_as_test(
        JobModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            derandomize=not RANDOM,
            phases=PHASES,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
