"""Write jobs (the Spark writer's core, :mod:`redis_txmq.jobs`): staged rows are published exactly once when the
job commits, never when it rolls back or came from a failed attempt, and a micro-batch replayed after a restart
publishes nothing new. The checker settles what a dead driver left."""

from __future__ import annotations

import collections
import time

import msgpack
import pytest

from redis_txmq import LocalTransactionState, Settings, TxMQError
from redis_txmq.checker import Checker
from redis_txmq.core.keys import JOB_REGISTRY
from redis_txmq.jobs import (
    ROWS_PER_STAGE_ENTRY,
    STAGE_ROWS_FIELD,
    JobNotCommittedError,
    LeaseKeeper,
    UnpublishableJobError,
    WriteJob,
    WriteJobError,
    settle_jobs,
)
from redis_txmq.jobs.stages import stage_entry_id
from redis_txmq.ops.admin import write_jobs

from .helpers import wait_until

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK


@pytest.fixture
def client(real_client):
    """A real Redis: publishing unpacks the stage entries' MessagePack (Redis' cmsgpack), which fakeredis lacks."""
    return real_client


def stage_rows(client, job: WriteJob, stream: str, attempt: str, count: int) -> str:
    """``count`` rows staged as the writer stages them: packed, :data:`ROWS_PER_STAGE_ENTRY` per entry, each entry
    with its counted id."""
    stage = job.stage(stream, attempt)
    assert stage is not None
    rows = [["transaction_id", f"{job.job_id}.{attempt}.{n}", "body", f"{attempt}-{n}"] for n in range(count)]
    pipe = client.pipeline(transaction=False)
    for number, start in enumerate(range(0, count, ROWS_PER_STAGE_ENTRY), 1):
        chunk = rows[start : start + ROWS_PER_STAGE_ENTRY]
        packed = msgpack.packb(chunk, use_bin_type=False)
        pipe.xadd(stage, {STAGE_ROWS_FIELD: packed}, id=stage_entry_id(number, start + len(chunk)), nomkstream=True)
    pipe.execute()
    return stage


def bodies(client, stream: str) -> list[str]:
    return [fields[b"body"].decode() for _, fields in client.xrange(stream)]


def test_a_commit_publishes_the_committed_attempts_once_and_drops_the_others(client):
    job = WriteJob.new(client)
    job.register()
    winner = stage_rows(client, job, "orders", "p0-winner", 2500)  # more than one chunk
    other = stage_rows(client, job, "audit#1", "p1", 3)
    loser = stage_rows(client, job, "orders", "p0-failed-attempt", 7)
    decision = job.commit([winner, other])
    assert (decision.outcome, decision.status) == (COMMIT, "DECIDED")
    assert bodies(client, "orders") == [f"p0-winner-{n}" for n in range(2500)]
    assert bodies(client, "audit#1") == ["p1-0", "p1-1", "p1-2"]
    assert not client.exists(winner, other, loser, job.keys.stages), "no stage is left"
    assert client.zscore(JOB_REGISTRY, job.keys.decision) is None and client.pttl(job.keys.decision) > 0

    again = job.commit([loser])
    assert (again.outcome, again.stages, again.status) == (COMMIT, sorted([winner, other]), "DUPLICATE")
    assert len(bodies(client, "orders")) == 2500, "a repeated commit publishes nothing new"


def test_an_attempt_that_writes_after_the_job_is_settled_leaves_nothing(client):
    """A failed or cancelled attempt still writing when the driver aborts: its stage is deleted by the settling,
    and its later writes (XADD NOMKSTREAM, as the writer sends them) create nothing; an attempt that begins after
    the decision writes nothing at all. A stage never settled expires after max_age and the dedupe window."""
    settings = Settings(max_age=60, dedupe_window=60)
    job = WriteJob.new(client, settings)
    job.register()
    late = job.stage("orders", "p0-late")
    assert late is not None and 0 < client.pttl(late) <= 120_000
    job.abort()
    assert client.xadd(late, {STAGE_ROWS_FIELD: b"\x90"}, nomkstream=True) is None
    assert job.stage("orders", "p1-after") is None
    assert not list(client.scan_iter(match="txmq:*:stage:*")) and not client.exists(job.keys.stages)


def test_a_rolled_back_job_publishes_nothing_and_leaves_nothing(client):
    job = WriteJob.new(client)
    job.register()
    staged = stage_rows(client, job, "orders", "p0", 5)
    assert job.abort().outcome is ROLLBACK
    assert bodies(client, "orders") == [] and not client.exists(staged, job.keys.stages)
    assert job.commit([staged]).outcome is ROLLBACK, "the first decision stands"
    assert bodies(client, "orders") == []


def test_a_replayed_micro_batch_publishes_nothing_new(client):
    first = WriteJob.micro_batch(client, "orders-sink", 7)
    first.register()
    published = stage_rows(client, first, "orders", "run1", 4)
    first.commit([published])
    replay = WriteJob.micro_batch(client, "orders-sink", 7)  # the query restarted before its checkpoint recorded 7
    replay.register()
    assert replay.stage("orders", "run2") is None, "its tasks write nothing: the batch is decided"
    decision = replay.commit([])
    assert decision.status == "DUPLICATE" and decision.stages == [published]
    assert bodies(client, "orders") == [f"run1-{n}" for n in range(4)]
    assert not list(client.scan_iter(match="txmq:*:stage:*")), "no stage was left"

    client.delete(first.keys.decision)  # long after: the decision expired, the sink's last batch remains
    late = WriteJob.micro_batch(client, "orders-sink", 6)
    late_stage = stage_rows(client, late, "orders", "run3", 2)
    with pytest.raises(WriteJobError, match=r"micro-batch 6 was committed before \(REPLAYED\), yet this run staged"):
        late.commit([late_stage])  # its rows are not published: said, not silently dropped
    assert not client.exists(late_stage)
    nxt = WriteJob.micro_batch(client, "orders-sink", 8)
    assert nxt.commit([stage_rows(client, nxt, "orders", "run4", 1)]).status == "DECIDED"
    assert collections.Counter(bodies(client, "orders")) == {**{f"run1-{n}": 1 for n in range(4)}, "run4-0": 1}


def test_the_checker_settles_a_job_whose_driver_died_after_deciding(client):
    settings = Settings(transaction_timeout=0)
    job = WriteJob.new(client, settings)
    job.register()
    staged = stage_rows(client, job, "orders", "p0", 3)
    dropped = stage_rows(client, job, "orders", "p0-speculative", 3)
    other = WriteJob.new(client, settings)
    other.register()  # its driver is still writing
    job.decide(COMMIT, [staged])  # the driver dies here
    assert bodies(client, "orders") == []
    now_ms = int(time.time() * 1000)
    seen = write_jobs(client, now_ms)
    assert (seen["unsettled"], seen["decided"]) == (2, 1) and seen["oldest_age_seconds"] >= 0, "txmq status shows it"
    Checker(client, settings).run_round()
    assert bodies(client, "orders") == ["p0-0", "p0-1", "p0-2"] and not client.exists(staged, dropped)
    assert client.zrange(JOB_REGISTRY, 0, -1) == [other.keys.decision.encode()]
    assert write_jobs(client, now_ms)["decided"] == 0


def test_a_job_whose_lease_passed_is_rolled_back(client):
    """Its driver died (nothing renews the lease): the checker rolls the job back, and a driver that comes back
    finds the rollback."""
    settings = Settings(job_lease=0.2)
    job = WriteJob.new(client, settings)
    job.register()
    staged = stage_rows(client, job, "orders", "p0", 3)
    assert settle_jobs(client, settings) == 0, "a leased job is left to its driver"
    wait_until(lambda: settle_jobs(client, settings) == 1)
    assert bodies(client, "orders") == [] and not client.exists(staged)
    assert job.commit([staged]).outcome is ROLLBACK, "a driver that comes back finds the rollback"
    assert client.zcard(JOB_REGISTRY) == 0


def test_a_stage_that_cannot_be_published_stays_for_a_retry(client):
    job = WriteJob.new(client)
    staged = stage_rows(client, job, "orders", "p0", 3)
    client.set("orders", "not a stream")
    with pytest.raises(Exception, match="refused a row"):
        job.commit([staged])
    assert client.xlen(staged) == 1, "its one entry of three rows stays"
    client.delete("orders")
    job.settle(job.decide(COMMIT, []))
    assert bodies(client, "orders") == ["p0-0", "p0-1", "p0-2"]


@pytest.mark.parametrize(
    "bad, error",
    [
        (b"not messagepack \xc1", "holds no MessagePack rows"),
        (msgpack.packb([["transaction_id", "x", "body"]], use_bin_type=False), "not a list of field names and values"),
    ],
)
def test_a_stage_entry_that_is_not_rows_is_refused_and_nothing_moves(client, bad, error):
    job = WriteJob.new(client)
    job.register()
    stage = stage_rows(client, job, "orders", "p0", 150)
    client.xadd(stage, {STAGE_ROWS_FIELD: bad})
    with pytest.raises(TxMQError, match=error):
        job.commit([stage])
    assert bodies(client, "orders") == [] and client.xlen(stage) == 3, "the chunk with the bad entry moved nothing"


def test_a_stage_written_row_by_row_is_published_too(client):
    """A stage of an earlier writer (an entry per row, not packed) still publishes each row once."""
    job = WriteJob.new(client)
    job.register()
    stage = job.stage("orders", "p0")
    for n in range(3):
        client.xadd(stage, {"transaction_id": f"{job.job_id}.p0.{n}", "body": f"old-{n}"})
    job.commit([stage])
    assert bodies(client, "orders") == ["old-0", "old-1", "old-2"] and not client.exists(stage)


# Issue 23, defect 4: a job whose driver is alive is never settled by the checker, and a commit that cannot publish
# every staged row raises.


@pytest.mark.parametrize("micro_batch", [False, True], ids=["batch", "micro-batch"])
def test_a_job_that_runs_longer_than_max_age_is_left_to_its_live_driver(client, micro_batch):
    """The checker's max_age is for half messages: a job whose lease its tasks renew is not rolled back (batch) or
    discarded (micro-batch), however long it has been listed; its commit then publishes every row."""
    job = WriteJob.micro_batch(client, "long-sink", 3) if micro_batch else WriteJob.new(client)
    staged = stage_rows(client, job, "orders", "p0", 250)
    checker = Settings(max_age=0.001, transaction_timeout=0)
    client.zadd(JOB_REGISTRY, {job.keys.decision: 0})  # listed long ago, as the registry said before leases
    assert settle_jobs(client, checker) == 0
    job.register()  # a task renews the lease
    assert settle_jobs(client, checker) == 0
    assert client.xlen(staged) == 3 and client.zscore(JOB_REGISTRY, job.keys.decision) > 0
    decision = job.commit({staged: 250})
    assert (decision.outcome, decision.status) == (COMMIT, "DECIDED")
    assert bodies(client, "orders") == [f"p0-{n}" for n in range(250)]
    assert client.zcard(JOB_REGISTRY) == 0


def test_a_micro_batch_whose_lease_passed_cannot_commit_its_set_aside_stages(client):
    """The driver stalled past its lease: the checker deleted its stages; its commit raises and decides nothing, so
    Spark fails the batch and runs it again under the same id, which commits."""
    settings = Settings(job_lease=0.2)
    stalled = WriteJob.micro_batch(client, "stall-sink", 5, settings)
    staged = stage_rows(client, stalled, "orders", "run1", 4)
    wait_until(lambda: settle_jobs(client, settings) == 1)
    assert not client.exists(staged)
    with pytest.raises(JobNotCommittedError, match=f"nothing of it was published: stage {staged}: MISSING"):
        stalled.commit({staged: 4})
    assert client.hget(stalled.keys.decision, "outcome") is None
    assert client.hget(stalled.keys.sink, "last_batch") is None, "the batch id is still free"
    replay = WriteJob.micro_batch(client, "stall-sink", 5, settings)
    again = stage_rows(client, replay, "orders", "run2", 2)
    assert replay.commit({again: 2}).status == "DECIDED"
    assert bodies(client, "orders") == ["run2-0", "run2-1"] and client.zcard(JOB_REGISTRY) == 0


@pytest.mark.parametrize("micro_batch", [False, True], ids=["batch", "micro-batch"])
def test_a_commit_naming_a_stage_that_expired_is_refused_and_publishes_nothing(client, micro_batch):
    """A stage listed in the job but gone (it expired while the job ran on) is found before the COMMIT is decided:
    the job ends as an abort ends it (a batch job rolled back, a micro-batch's stages deleted, its batch id free),
    none of its rows is published, and the error names the stage. It used to decide COMMIT, publish the other
    stages and park the job half published."""
    settings = Settings(transaction_timeout=0)
    job = WriteJob.micro_batch(client, "expiry-sink", 2, settings) if micro_batch else WriteJob.new(client, settings)
    early = stage_rows(client, job, "orders", "p0", 2)
    late = stage_rows(client, job, "orders", "p1", 3)
    client.delete(early)  # its time to live ran out
    with pytest.raises(JobNotCommittedError, match=f"nothing of it was published: stage {early}: MISSING"):
        job.commit({early: 2, late: 3})
    assert bodies(client, "orders") == [] and not client.exists(late)
    assert client.hget(job.keys.decision, "outcome") == (None if micro_batch else b"ROLLBACK")
    assert client.hget(job.keys.decision, "parked") is None and client.zcard(JOB_REGISTRY) == 0
    if micro_batch:
        assert client.hget(job.keys.sink, "last_batch") is None, "the batch id is still free"


def test_a_running_task_keeps_every_stage_of_its_job_alive(client):
    """A task that runs long renews the time to live of the job's stages, those of attempts that ended long before
    too: none expires while the job runs (the time to live was set once, when the stage was opened)."""
    settings = Settings(job_lease=0.3, stage_lifetime=2, job_decision_lifetime=10)
    job = WriteJob.new(client, settings)
    early = stage_rows(client, job, "orders", "p0", 2)  # an attempt that ended long ago
    client.pexpire(early, 1000)  # as if most of its time to live had passed
    running = WriteJob(client, job.keys, settings)
    keeper = LeaseKeeper(running)
    keeper.start()
    try:
        wait_until(lambda: client.pttl(early) > 1200, timeout=10)
    finally:
        keeper.stop()
        running.close()
    assert job.commit({early: 2}).status == "DECIDED"
    assert bodies(client, "orders") == ["p0-0", "p0-1"]


def test_a_committed_stage_lost_after_the_decision_parks_the_job_with_nothing_published(client):
    """publish_stage on a missing stage is an error, not an empty success; every stage is checked before the first
    row is published, so the job is parked (not retried by the checker) with none of its rows visible (not half of
    them), and txmq status shows why."""
    settings = Settings(transaction_timeout=0)
    job = WriteJob.new(client, settings)
    kept = stage_rows(client, job, "orders", "p0", 3)
    lost = stage_rows(client, job, "orders", "p1", 3)
    decision = job.decide(COMMIT, {kept: 3, lost: 3})
    client.delete(lost)  # lost in a failover
    with pytest.raises(UnpublishableJobError, match=f"stage {lost}: MISSING"):
        job.settle(decision)
    assert bodies(client, "orders") == [] and client.xlen(kept) == 1
    assert client.zscore(JOB_REGISTRY, job.keys.decision) == float("inf")
    assert settle_jobs(client, settings) == 0 and bodies(client, "orders") == []
    seen = write_jobs(client, int(time.time() * 1000))
    assert seen["parked"] == 1 and lost in seen["parked_reasons"][0]["reason"]


def test_a_stage_published_in_full_stays_done_for_a_repeated_settle(client):
    """The driver, Spark's abort, the checker and a replay may all settle the same decision: each finds the stages
    published, none publishes a row twice, none calls a published stage missing."""
    job = WriteJob.new(client, Settings(transaction_timeout=0))
    staged = stage_rows(client, job, "orders", "p0", 1500)
    job.commit({staged: 1500})
    for _ in range(2):
        assert job.settle(job.decide(COMMIT, [])) == 0
        assert job.abort().outcome is COMMIT
    assert len(bodies(client, "orders")) == 1500 and client.zcard(JOB_REGISTRY) == 0


def test_a_stage_that_published_fewer_rows_than_its_attempt_staged_fails_the_commit(client):
    """A stage that cannot be counted before publishing (an earlier writer's: entries without counted ids) is
    compared after: what there was is published once, and the job is parked."""
    job = WriteJob.new(client)
    job.register()
    staged = job.stage("orders", "p0")
    rows = [["transaction_id", f"x.{n}", "body", f"p0-{n}"] for n in range(250)]
    for start in (0, 100, 200):
        client.xadd(staged, {STAGE_ROWS_FIELD: msgpack.packb(rows[start : start + 100])}, nomkstream=True)
    first = client.xrange(staged, count=1)[0][0]
    client.xdel(staged, first)  # an entry of 100 rows lost
    with pytest.raises(UnpublishableJobError, match="150 rows published of the 250 its attempt staged"):
        job.commit({staged: 250})
    assert len(bodies(client, "orders")) == 150, "what there was is published, once"


@pytest.mark.parametrize("damage", ["entry lost", "entry written twice", "other rows"])
def test_a_committed_stage_holding_other_rows_than_staged_publishes_nothing(client, damage):
    """The stage's rows are counted (from its counted ids) before the first row of the job is published: a stage
    with an entry lost, one written twice (a retry that did not use its counted id) or other rows than its attempt
    counted parks the job with nothing of it visible."""
    settings = Settings(transaction_timeout=0)
    job = WriteJob.new(client, settings)
    fine = stage_rows(client, job, "orders", "p0", 50)
    damaged = stage_rows(client, job, "orders", "p1", 250)
    decision = job.decide(COMMIT, {fine: 50, damaged: 250})
    if damage == "other rows":
        last_id, fields = client.xrange(damaged)[-1]
        client.xdel(damaged, last_id)
        client.xadd(damaged, fields, id=stage_entry_id(int(last_id.decode().split("-")[0]), 251))
    elif damage == "entry lost":
        client.xdel(damaged, client.xrange(damaged, count=1)[0][0])
    elif damage == "entry written twice":
        last_id, fields = client.xrange(damaged)[-1]
        number = int(last_id.decode().split("-")[0])
        client.xadd(damaged, fields, id=stage_entry_id(number + 1, 300))
    with pytest.raises(UnpublishableJobError, match=f"stage {damaged}: MISMATCH"):
        job.settle(decision)
    assert bodies(client, "orders") == [], "nothing of the job is published"
    assert client.zscore(JOB_REGISTRY, job.keys.decision) == float("inf")


# Issue 23, defect 5: every row of a chunk is checked before the first is appended, and a job that cannot be
# published is parked instead of being retried forever.


@pytest.mark.parametrize(
    "bad, why",
    [
        (["transaction_id", "x", "body", True], "has a boolean at 4"),
        (["transaction_id", "x", "body", ["nested"]], "has a table at 4"),
        (["transaction_id", "x", "", "empty name"], "has an empty field name at 3"),
    ],
    ids=["boolean", "nested", "empty-name"],
)
def test_a_row_that_xadd_would_refuse_publishes_nothing_and_is_not_retried(client, bad, why):
    settings = Settings(transaction_timeout=0)
    job = WriteJob.new(client, settings)
    stage = stage_rows(client, job, "orders", "p0", 150)
    client.xadd(stage, {STAGE_ROWS_FIELD: msgpack.packb([["transaction_id", "y", "body", "fine"], bad])})
    with pytest.raises(TxMQError) as raised:
        job.commit({stage: 150})
    assert bodies(client, "orders") == [], "nothing is appended before the bad row is found"
    for _ in range(3):  # checker rounds
        assert settle_jobs(client, settings) == 0
    assert bodies(client, "orders") == [] and client.xlen(stage) == 3, "nothing moved, the stage is kept as it is"
    assert isinstance(raised.value, UnpublishableJobError) and f"row 2 {why}" in str(raised.value)
    assert client.zscore(JOB_REGISTRY, job.keys.decision) == float("inf"), "parked: the checker leaves it"
    assert why in client.hget(job.keys.decision, "parked").decode()

    bad_entry = client.xrange(stage, "-", "+")[-1][0]  # the operator, as the README says: delete it, list the job
    client.xdel(stage, bad_entry)
    client.zadd(JOB_REGISTRY, {job.keys.decision: 0})
    assert settle_jobs(client, settings) == 1
    assert bodies(client, "orders") == [f"p0-{n}" for n in range(150)]
    assert client.zcard(JOB_REGISTRY) == 0 and not client.exists(stage)


def test_numbers_in_a_row_are_published_as_redis_writes_them(client):
    job = WriteJob.new(client)
    stage = job.stage("orders", "p0")
    client.xadd(stage, {STAGE_ROWS_FIELD: msgpack.packb([["transaction_id", "n", "body", "b", "count", 7]])})
    job.commit({stage: 1})
    assert [f[b"count"] for _, f in client.xrange("orders")] == [b"7"]


# Issue 23, defect 8: the settler settles what is due, wherever it is listed.


def test_a_decided_job_behind_many_undecided_ones_is_settled_in_one_round(client):
    settings = Settings(transaction_timeout=0)
    running = [WriteJob.new(client, settings) for _ in range(150)]
    for job in running:
        job.register()  # drivers alive and writing
        job.close()
    listed_first = int(time.time() * 1000) - 1000  # the oldest (older code listed jobs by their start)
    client.zadd(JOB_REGISTRY, {job.keys.decision: listed_first for job in running})
    dead = WriteJob.new(client, settings)
    staged = stage_rows(client, dead, "orders", "p0", 2)
    dead.decide(COMMIT, {staged: 2})  # its driver dies here
    assert settle_jobs(client, settings) == 1
    assert bodies(client, "orders") == ["p0-0", "p0-1"]
    assert client.zcard(JOB_REGISTRY) == 150
    assert client.zcount(JOB_REGISTRY, "-inf", listed_first) == 0, "each was looked at, and listed for its lease's end"


def test_a_replay_that_decides_while_the_checker_settles_the_discarded_run_stays_listed(client):
    """The checker finds micro-batch 7's lease passed and sets its stages aside; before it has settled them, the
    restarted query replays batch 7, decides COMMIT (listing it) and its driver dies. The checker's settling of the
    discarded run must not unlist the replay's decision: the checker publishes it later. (It used to unlist it, and
    re-list only a job holding a lease: the COMMIT stood, never published.)"""
    settings = Settings(job_lease=0.2, transaction_timeout=0)
    first = WriteJob.micro_batch(client, "race-sink", 7, settings)
    stage_rows(client, first, "orders", "run1", 2)  # its driver dies before committing
    client.hset(first.keys.decision, "lease_ms", 1)  # what time does: its lease passed
    checker = WriteJob.micro_batch(client, "race-sink", 7, settings)
    status, discarded, _ = checker.expire()
    assert status == "DISCARDED" and discarded is not None
    replay = WriteJob.micro_batch(client, "race-sink", 7, settings)
    staged = stage_rows(client, replay, "orders", "run2", 3)
    assert replay.decide(COMMIT, {staged: 3}).status == "DECIDED"  # the replay's driver dies here
    checker.settle(discarded)
    assert client.zscore(JOB_REGISTRY, replay.keys.decision) is not None, "the replay's decision stays listed"
    wait_until(lambda: settle_jobs(client, settings) == 1)
    assert bodies(client, "orders") == ["run2-0", "run2-1", "run2-2"]
    assert client.zcard(JOB_REGISTRY) == 0 and not list(client.scan_iter(match="txmq:*:stage:*"))


def test_a_new_query_under_a_committed_sink_id_is_refused_not_dropped(client):
    """A new streaming query (a fresh checkpoint) reuses a sinkId: its batch 0 was committed by the first query.
    Its tasks' lease and its decision are refused with an error naming the sink; nothing of it is dropped in
    silence (its tasks used to find the old decision, write nothing, and its commit returned)."""
    first = WriteJob.micro_batch(client, "reused-sink", 0, query_id="query-1")
    first.commit({stage_rows(client, first, "orders", "q1", 2): 2})
    second = WriteJob.micro_batch(client, "reused-sink", 0, query_id="query-2")
    with pytest.raises(WriteJobError, match="sink 'reused-sink': its micro-batches were committed by streaming query"):
        second.lease()
    with pytest.raises(WriteJobError, match="query-1, and this is query query-2"):
        second.commit({})
    restarted = WriteJob.micro_batch(client, "reused-sink", 0, query_id="query-1")  # the same query, restarted
    assert restarted.lease() is None and restarted.commit({}).status == "DUPLICATE"
    assert bodies(client, "orders") == ["q1-0", "q1-1"]
