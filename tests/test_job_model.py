"""Write jobs against a model: hypothesis' stateful testing drives the Spark writer's real task and driver code
(``spark_connector.writer``: ``write_rows``, ``BatchWriter``, ``StreamWriter``, run here without Spark) and the
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
printed as a sequence of steps: make it a plain regression test. The run is seeded; ``TXMQ_MODEL_EXAMPLES=500``
runs a longer exploration. ``tests/README.md`` says which defects it finds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from redis_txmq import LocalTransactionState, Settings, TxMQError, create_topic
from redis_txmq.jobs import STAGE_ROWS_FIELD, WriteJob, settle_jobs
from redis_txmq.keys import JOB_REGISTRY, JobKeys

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # the driver's side is the Spark writer's code (no SparkSession)
    pytest.importorskip("pyspark", reason="the job model drives spark_connector.writer: the spark extra")

import pyarrow as pa  # noqa: E402
from pyspark.sql.types import StringType, StructField, StructType  # noqa: E402

from spark_connector.writer import BatchWriter, StreamWriter, _staged, parse_write_options, write_rows  # noqa: E402

pytestmark = pytest.mark.real

TOPIC = "m"
STREAMS = ("m#0", "m#1")
SINK = "model-sink"
CHECKER = Settings(max_age=0.001, transaction_timeout=0)
"""The checker: every decided job is due at once; an undecided one only once its lease has passed."""
EXAMPLES = int(os.environ.get("TXMQ_MODEL_EXAMPLES", "60"))
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

    # -- rules -----------------------------------------------------------------------------------------------------

    @rule(data=st.data(), partitions=st.integers(1, 2))
    def start_batch_job(self, data: st.DataObject, partitions: int) -> None:
        """A batch write: the driver makes its writer, then a task attempt per partition runs."""
        writer = BatchWriter(self.batch_options)
        job = Job(self._name("b"), writer.keys, micro=False)
        self.jobs.append(job)
        self._start(data, Run(job, partitions, writer))

    @precondition(lambda self: not any(run.job.micro for run in self.runs))
    @rule(data=st.data(), partitions=st.integers(1, 2))
    def start_micro_batch(self, data: st.DataObject, partitions: int) -> None:
        """The query runs its next micro-batch: the one after the last its checkpoint recorded (a replay when the
        sink had committed it)."""
        batch_id = self.checkpoint + 1
        job = self.micro.get(batch_id)
        if job is None:
            job = self.micro[batch_id] = Job(f"s{batch_id}", JobKeys.of_batch(SINK, batch_id), micro=True)
            self.jobs.append(job)
        self._start(data, Run(job, partitions, StreamWriter(self.stream_options)))

    def _start(self, data: st.DataObject, run: Run) -> None:
        self.runs.append(run)
        for partition in range(run.partitions):
            self._attempt(run, partition, data.draw(COUNTS, label="rows"), data.draw(ENDINGS, label="ending"))

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

    @precondition(lambda self: self._committable())
    @rule(data=st.data())
    def driver_commits(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(self._committable()), label="run")
        job = run.job
        chosen = self._choose(data, run)
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
        job = run.job
        chosen = self._choose(data, run)
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
        run = data.draw(st.sampled_from(self.runs), label="run")
        messages = [run.job.attempts[name].message for name in run.attempts]
        self._abort(run, [m for m in messages if m is not None])

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def driver_dies(self, data: st.DataObject) -> None:
        """It stops renewing, committing and aborting; its tasks die with it."""
        self._end(data.draw(st.sampled_from(self.runs), label="run"))

    @precondition(lambda self: any(job.decided is None and job.attempts for job in self.jobs))
    @rule(data=st.data())
    def lease_passes(self, data: st.DataObject) -> None:
        """Time passes beyond the job's lease with no renewal: its driver died, or stalled (it may still commit)."""
        job = data.draw(st.sampled_from([j for j in self.jobs if j.decided is None and j.attempts]), label="job")
        self._lease_passes(job)
        job.lease_passed = True

    def _lease_passes(self, job: Job) -> None:
        """What time does to a lease: its end is past, and the job is due."""
        if self.client.hexists(job.keys.decision, "lease_ms"):
            self.client.hset(job.keys.decision, "lease_ms", 1)
        self.client.zadd(JOB_REGISTRY, {job.keys.decision: 0})

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

    @precondition(lambda self: any(job.micro and job.decided is None and job.lease_passed for job in self.jobs))
    @rule(data=st.data())
    def a_checker_pauses_before_settling(self, data: st.DataObject) -> None:
        """A checker sets aside the stages of a micro-batch whose lease passed, then pauses before it deletes them
        and unlists the job: a replay of the batch may lease, decide COMMIT and die meanwhile."""
        jobs = [job for job in self.jobs if job.micro and job.decided is None and job.lease_passed]
        job = data.draw(st.sampled_from(jobs), label="job")
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
        job, checker, job_decision = self.paused.pop(data.draw(st.integers(0, len(self.paused) - 1), label="paused"))
        try:
            checker.settle(job_decision)
        finally:
            checker.close()

    @precondition(
        lambda self: any(a.rows and a.message for j in self.jobs if j.decided is None for a in j.attempts.values())
    )
    @rule(data=st.data())
    def a_stage_entry_xadd_would_refuse(self, data: st.DataObject) -> None:
        """Another tool (or a bug) wrote into a task attempt's stage an entry whose row cannot be published."""
        attempts = [
            a
            for j in self.jobs
            if j.decided is None
            for a in j.attempts.values()
            if a.rows and a.message and a.name not in j.set_aside
        ]
        if not attempts:
            return
        attempt = data.draw(st.sampled_from(attempts), label="attempt")
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
        attempt = data.draw(st.sampled_from(self._live_stages()), label="attempt")
        for stage in attempt.message.stages:
            self.client.delete(stage)
        attempt.expired = True

    @precondition(
        lambda self: any(
            job.decided == "COMMIT" and not job.unpublishable and not job.decision_expired
            for job in self.micro.values()
        )
    )
    @rule(data=st.data())
    def a_micro_batch_decision_expires(self, data: st.DataObject) -> None:
        """Long after: the decision of a published micro-batch is gone (the sink's last batch id stays)."""
        candidates = [
            job
            for job in self.micro.values()
            if job.decided == "COMMIT" and not job.unpublishable and not job.decision_expired
        ]
        job = data.draw(st.sampled_from(candidates), label="job")
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


@pytest.mark.timeout(600)
def test_write_jobs_hold_against_their_model(redis_url: str) -> None:
    global CLIENT, URL
    CLIENT, URL = redis.Redis.from_url(redis_url), redis_url
    try:
        run_state_machine_as_test(
            JobModel,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=30,
                deadline=None,
                derandomize=not os.environ.get("TXMQ_MODEL_EXAMPLES"),
                suppress_health_check=list(HealthCheck),
                database=None,
            ),
        )
    finally:
        CLIENT.close()
        CLIENT = None
