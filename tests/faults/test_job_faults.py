"""Write jobs under faults: Spark writer drivers (:mod:`.job_worker`: ``BatchWriter`` and ``StreamWriter`` with
their tasks, without a SparkSession) run batch jobs and the micro-batches of a streaming sink each, every job
longer than the ``max_age`` of the two ``txmq checker`` processes beside them (1 s); their commits are killed
before and after the decision and mid-publish, raise after the decision (then Spark's abort, or the driver dies, or
the abort raises too), stall past the job's lease; meanwhile the drivers are SIGKILLed at random points and
restarted (a micro-batch then runs again from the checkpoint: same sink, same batch id, same rows), SIGSTOPped
longer than the job lease, the checkers SIGKILLed, Redis SIGKILLed and restarted. Then the checkers settle what is
left, and the drivers' journals are the ground truth:

- every row of every job whose decision is COMMIT is in its topic stream exactly once, and no row of any other job
  (rolled back, discarded, never decided) is visible;
- a micro-batch is never published twice across its runs (its rows are the same in every run), and the committed
  batch ids of a sink are 0..its last batch, none skipped;
- a commit that returned (and an abort that returned with a COMMIT standing) had published every row of its job
  when it returned; a batch job whose commit raised ``JobNotCommittedError`` is not COMMIT; nothing is COMMIT that
  its driver did not decide;
- nothing is left: ``txmq:jobs`` empty (nothing parked), no stage, stage list or set aside list;
- every injection landed, for batch jobs and micro-batches; no worker exited on its own; nothing raised
  ``UnpublishableJobError``.

``TXMQ_FAULT_SEED`` replays a run's plan of faults and jobs; ``TXMQ_FAULT_JOB_ITEMS`` sets the items per driver
(default 8)."""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

if not os.environ.get("TXMQ_REQUIRE_SPARK"):  # the drivers run the Spark writer's code (no SparkSession)
    pytest.importorskip("pyspark", reason="the write job faults drive redis_txmq.spark.writer: the spark extra")

from redis_txmq import create_topic  # noqa: E402
from redis_txmq.core.keys import JOB_REGISTRY  # noqa: E402
from redis_txmq.core.topics import partition_keys  # noqa: E402

from .harness import TXMQ, Exit, Worker  # noqa: E402
from .job_worker import TOPICS, Event, JobRecord, Journal  # noqa: E402
from .redis_server import RedisServer  # noqa: E402
from .schedule import Fault, plan  # noqa: E402

DRIVERS = 4
CHECKERS = 2
ITEMS = int(os.environ.get("TXMQ_FAULT_JOB_ITEMS") or 8)
"""Items (a batch job, or a micro-batch run until it commits) per driver, at least."""
JOB_LEASE = 2.0
"""The drivers' ``jobLease``: a task renews it every 0.67 s."""
CHECKER_OPTIONS = {"--max-age": 1, "--transaction-timeout": 1, "--check-interval": 0.5, "--claim-idle": 2}
"""A checker whose ``max_age`` every job outlives; a decided job is due for it 1 s after its decision."""
FAULT_KINDS = ("driver", "stall", "checker", "redis")
"""SIGKILL a driver (restarted 0.1-1.5 s later), SIGSTOP a driver for its job lease and 0.6-2 s more, SIGKILL a
checker (restarted 0.1-1.5 s later), SIGKILL Redis (restarted 0.1-1.5 s later, nothing acknowledged lost)."""
STALL_OVER_LEASE = 0.5
DRIVER_SECONDS = 20 + 10 * ITEMS
"""A driver stops after this long (since its first start) even if its items are not done: its journal says what
it did, and what is missing is asserted."""
SETTLE_SECONDS = 45.0
STAGE_PATTERNS = ("txmq:*:stage:*", "txmq:job:*:stages", "txmq:job:*:set-aside")

pytestmark = [pytest.mark.faults, pytest.mark.timeout(DRIVER_SECONDS + 200)]


class Process(Worker):
    """A worker the faults may also SIGSTOP and SIGCONT."""

    def signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signum)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.terminate()


@dataclass
class JobSystem:
    workdir: Path
    seed: int
    server: RedisServer = field(init=False)
    journals: list[Path] = field(init=False)
    drivers: list[Process] = field(default_factory=list)
    checkers: list[Process] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    restarts: collections.Counter[str] = field(default_factory=collections.Counter)

    def __post_init__(self) -> None:
        for directory in ("redis", "logs", "journals"):
            (self.workdir / directory).mkdir()
        self.server = RedisServer(self.workdir / "redis")
        self.journals = [self.workdir / "journals" / f"driver-{slot}.sqlite" for slot in range(DRIVERS)]

    @property
    def workers(self) -> list[Process]:
        return [*self.drivers, *self.checkers]

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.server.port)

    def start(self) -> None:
        self.server.start()
        with self.client() as client:
            for topic, partitions in TOPICS.items():
                create_topic(client, topic, partitions)
        config = self.workdir / "config.json"
        config.write_text(
            json.dumps(
                {
                    "redis_url": self.server.url,
                    "seed": self.seed,
                    "journals": [str(path) for path in self.journals],
                    "drivers": DRIVERS,
                    "items": ITEMS,
                    "job_lease": JOB_LEASE,
                    "seconds": DRIVER_SECONDS,
                }
            )
        )
        logs = self.workdir / "logs"
        driver = [sys.executable, "-m", "tests.faults.job_worker", str(config)]
        self.drivers = [Process(f"driver-{i}", [*driver, str(i)], logs / f"driver-{i}.log") for i in range(DRIVERS)]
        options = [str(x) for kv in ({"--redis-url": self.server.url} | CHECKER_OPTIONS).items() for x in kv]
        checker = [TXMQ, "--log-level", "INFO", "checker", *options]
        self.checkers = [Process(f"checker-{i}", checker, logs / f"checker-{i}.log") for i in range(CHECKERS)]
        for worker in self.workers:
            worker.start()

    def done(self, slot: int) -> bool:
        return Path(f"{self.journals[slot]}.done").exists()

    def all_done(self) -> bool:
        return all(self.done(slot) for slot in range(DRIVERS))

    def restart_exited(self) -> None:
        """Restart a driver that SIGKILLed itself (an injection), and any worker that ended on its own otherwise
        (a finding, kept in :attr:`exits`); a driver that finished its items stays down."""
        for slot, worker in enumerate(self.workers):
            status = worker.exited()
            if status is None or (slot < DRIVERS and status == 0 and self.done(slot)):
                continue
            if status == -signal.SIGKILL and slot < DRIVERS:
                self.restarts["after an injected SIGKILL"] += 1
            else:
                self.exits.append(Exit(worker.name, status, worker.tail(1)))
            worker.kill()
            worker.start()

    def logs(self, lines: int = 20) -> str:
        return "\n".join(f"--- {worker.name}\n{worker.tail(lines)}" for worker in self.workers)

    def stop(self) -> None:
        deadline = time.monotonic() + 5
        for worker in self.workers:
            worker.stop()
        for worker in self.workers:
            worker.wait(max(0.0, deadline - time.monotonic()))
            worker.kill()
        self.server.stop()


@pytest.fixture
def job_system(tmp_path: Path, fault_seed: int, fault_report: list[str]) -> Iterator[JobSystem]:
    built = JobSystem(tmp_path, fault_seed)
    fault_report.append(f"write jobs: logs, journals and Redis data of the run: {tmp_path}")
    try:
        yield built
    finally:
        built.stop()


def describe(fault: Fault) -> str:
    if fault.kind == "stall":
        return f"SIGSTOP driver #{fault.target % DRIVERS} for {JOB_LEASE + STALL_OVER_LEASE + fault.seconds:.1f} s"
    if fault.kind == "redis":
        return f"SIGKILL redis, down {fault.seconds:.1f} s"
    count = DRIVERS if fault.kind == "driver" else CHECKERS
    return f"SIGKILL {fault.kind} #{fault.target % count}, down {fault.seconds:.1f} s"


def inject(fault: Fault, system: JobSystem) -> bool:
    """Apply one fault; False when it targeted a driver that had finished (nothing done)."""
    if fault.kind == "redis":
        system.server.kill()
        time.sleep(fault.seconds)
        system.server.start()
        return True
    if fault.kind == "checker":
        victim = system.checkers[fault.target % CHECKERS]
        victim.kill()
        time.sleep(fault.seconds)
        victim.start()
        return True
    slot = fault.target % DRIVERS
    victim = system.drivers[slot]
    if system.done(slot):  # finished: the fault misses (the last driver running is not the target of them all)
        return False
    if fault.kind == "stall":
        victim.signal(signal.SIGSTOP)
        time.sleep(JOB_LEASE + STALL_OVER_LEASE + fault.seconds)
        victim.signal(signal.SIGCONT)
        return True
    victim.kill()
    time.sleep(fault.seconds)
    if not system.done(slot):
        victim.start()
    return True


def run_faults(system: JobSystem) -> collections.Counter[str]:
    """Seeded faults, one every 1-3 s, until every driver is done and every kind was injected."""
    applied: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    deadline = started + DRIVER_SECONDS + 30
    for fault in plan(system.seed, FAULT_KINDS):
        if system.all_done() and set(FAULT_KINDS) <= applied.keys():
            return applied
        if time.monotonic() > deadline:
            pytest.fail(f"seed {system.seed}: the drivers did not finish their jobs in time\n{system.logs()}")
        if inject(fault, system):
            print(f"{time.monotonic() - started:6.1f} s  {describe(fault)}")
            applied[fault.kind] += 1
        pause_until = time.monotonic() + fault.pause
        while time.monotonic() < pause_until:
            system.restart_exited()
            time.sleep(0.1)
    raise AssertionError("the fault plan is endless")


def leftovers(client: Any) -> dict[str, Any]:
    """What must be gone once the checkers settled everything: listed jobs (with their score: ``inf`` is parked),
    stages, stage lists, set aside lists."""
    left: dict[str, Any] = {}
    listed = client.zrange(JOB_REGISTRY, 0, -1, withscores=True)
    if listed:
        left[JOB_REGISTRY] = {member.decode(): score for member, score in listed}
    for pattern in STAGE_PATTERNS:
        keys = sorted(key.decode() for key in client.scan_iter(match=pattern, count=1000))
        if keys:
            left[pattern] = keys
    return left


def settle(system: JobSystem, client: Any) -> None:
    """Wait until the checkers settled every job left (its lease passed, or its decision is due); fail at once when
    only parked jobs are left."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while left := leftovers(client):
        listed = left.get(JOB_REGISTRY, {})
        if listed and all(score == float("inf") for score in listed.values()) and len(left) == 1:
            reasons = {member: client.hget(member, "parked") for member in listed}
            pytest.fail(f"seed {system.seed}: jobs parked (committed, not every row publishable): {reasons}")
        if time.monotonic() > deadline:
            pytest.fail(f"seed {system.seed}: not settled {SETTLE_SECONDS:.0f} s after the drivers: {left}")
        system.restart_exited()
        time.sleep(0.25)


def visible_rows(client: Any) -> dict[str, list[tuple[str, str]]]:
    """Body -> every (topic stream, entry id) that carries it."""
    found: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for topic in TOPICS:
        for keys in partition_keys(client, topic):
            for entry_id, fields in client.xrange(keys.topic_stream):
                found[fields[b"body"].decode()].append((keys.topic_stream, entry_id.decode()))
    return found


def entry_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


def published_by(rows: list[tuple[str, str]], marks: dict[str, str]) -> list[str]:
    """The rows appended after ``marks`` (the last entry of each stream when a commit or an abort returned)."""
    return [f"{stream} {entry}" for stream, entry in rows if entry_order(entry) > entry_order(marks.get(stream, "0-0"))]


@dataclass
class Truth:
    jobs: dict[str, JobRecord]
    events: dict[str, list[Event]]
    todo: list[tuple[int, str, str]]

    @classmethod
    def read(cls, journals: list[Path]) -> Truth:
        jobs: dict[str, JobRecord] = {}
        events: dict[str, list[Event]] = collections.defaultdict(list)
        todo = []
        for slot, path in enumerate(journals):
            journal = Journal(path)
            try:
                jobs |= {job.label: job for job in journal.jobs()}
                for event in journal.events():
                    events[event.label].append(event)
                todo += [(slot, kind, injection) for kind, injection in journal.todo()]
            finally:
                journal.close()
        return cls(jobs, events, todo)

    def counted(self, prefix: str) -> collections.Counter[str]:
        return collections.Counter(e.event for evs in self.events.values() for e in evs if e.event.startswith(prefix))


def check(client: Any, truth: Truth, seed: int) -> dict[str, Any]:
    """Every assertion on what the run left; returns numbers for the report."""
    where = f"seed {seed}"
    rows = visible_rows(client)
    twice = {body: found for body, found in rows.items() if len(found) > 1}
    assert not twice, f"{where}: rows published more than once: {dict(list(twice.items())[:20])}"
    by_job: dict[str, dict[int, tuple[str, str]]] = collections.defaultdict(dict)
    strangers = []
    for body, (found,) in rows.items():
        label, _, n = body.rpartition("/")
        job = truth.jobs.get(label)
        if job is None or not n.isdigit() or int(n) >= job.rows:
            strangers.append(body)
        else:
            by_job[label][int(n)] = found
    assert not strangers, f"{where}: rows of no job a driver ran: {strangers[:20]}"
    outcomes: collections.Counter[str] = collections.Counter()
    long_committed = 0
    for label, job in sorted(truth.jobs.items()):
        outcome = (client.hget(job.decision, "outcome") or b"none").decode()
        outcomes[f"{job.kind} {outcome}"] += 1
        events = truth.events[label]
        names = [e.event for e in events]
        mine = by_job.get(label, {})
        if outcome == "COMMIT":
            missing = sorted(set(range(job.rows)) - mine.keys())
            assert not missing, f"{where}: {label} ({job.decision}) is COMMIT, rows missing: {missing[:20]}"
            assert "deciding" in names, f"{where}: {label} is COMMIT, yet its driver never decided it"
            began = min(e.at for e in events if e.event == "run")
            decided = min(e.at for e in events if e.event == "deciding")
            long_committed += decided - began > CHECKER_OPTIONS["--max-age"]
        else:
            assert not mine, f"{where}: {label} is {outcome}, yet {len(mine)} of its rows are visible"
        for event in events:
            returned = event.event == "commit returned"
            aborted = event.event == "abort returned" and json.loads(event.detail)["decision"].startswith("COMMIT")
            if returned or aborted:
                assert outcome == "COMMIT", f"{where}: {label}: {event.event}, yet its decision is {outcome}"
                late = published_by(list(mine.values()), json.loads(event.detail))
                assert not late, f"{where}: {label}: {event.event} before its rows were published: {late[:10]}"
            if job.kind == "batch" and event.event == "commit raised" and "JobNotCommittedError" in event.detail:
                assert outcome != "COMMIT", f"{where}: {label}: the commit raised {event.detail}, yet it is COMMIT"
            assert "Unpublishable" not in event.detail, f"{where}: {label}: {event.event}: {event.detail}"
    for slot in range(DRIVERS):
        sink = f"faults-sink-{slot}"
        committed = sorted(
            int(label.rpartition("-s")[2])
            for label, job in truth.jobs.items()
            if label.startswith(f"d{slot}-s") and client.hget(job.decision, "outcome") == b"COMMIT"
        )
        last = client.hget(f"txmq:sink:{{{sink}}}", "last_batch")
        assert committed == list(range(len(committed))), f"{where}: {sink}: committed batches {committed}"
        assert int(last if last is not None else -1) == len(committed) - 1, f"{where}: {sink}: last_batch {last}"
    left = leftovers(client)
    assert not left, f"{where}: left after settling: {left}"
    assert not truth.todo, f"{where}: injections that never landed (slot, kind, injection): {truth.todo}"
    return {
        "jobs": len(truth.jobs),
        "rows": sum(job.rows for job in truth.jobs.values()),
        "visible": len(rows),
        "outcomes": outcomes,
        "long": long_committed,
    }


def counted(counter: collections.Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counter.items())) or "none"


def test_every_committed_job_row_is_published_once_and_nothing_else_is_visible(
    job_system: JobSystem, fault_report: list[str]
) -> None:
    began = time.monotonic()
    job_system.start()
    applied = run_faults(job_system)
    done = time.monotonic()
    client = job_system.client()
    settle(job_system, client)
    settled = time.monotonic()
    truth = Truth.read(job_system.journals)
    checker_logs = "".join(worker.log.read_text(errors="replace") for worker in job_system.checkers)
    by_checker = collections.Counter(
        line.split(": ")[-1] for line in checker_logs.splitlines() if "settled by the checker" in line
    )
    runs = sum(1 for events in truth.events.values() for e in events if e.event == "run")
    fault_report += [
        f"write jobs: {len(truth.jobs)} jobs by {DRIVERS} drivers, {runs} runs (micro-batches run again after a "
        f"failed commit or a restart), {sum(j.rows for j in truth.jobs.values())} rows",
        f"write jobs: injections landed: {counted(truth.counted('landed '))}",
        f"write jobs: commits and aborts: {counted(truth.counted('commit ') + truth.counted('abort '))}; "
        f"task attempts failed: {sum(truth.counted('task failed').values())}",
        f"write jobs: faults: {counted(applied)}; restarts: {counted(job_system.restarts)}; "
        f"settled by the checkers: {counted(by_checker)}",
        "write jobs: unexpected exits: "
        + ("; ".join(f"{e.worker} status {e.status} ({e.last_line})" for e in job_system.exits) or "none"),
        f"write jobs: time: {done - began:.1f} s running under faults, {settled - done:.1f} s settling",
    ]
    numbers = check(client, truth, job_system.seed)
    fault_report.append(
        f"write jobs: decisions: {counted(numbers['outcomes'])}; {numbers['visible']} rows visible; "
        f"{numbers['long']} committed jobs ran longer than the checkers' max_age before their decision"
    )
    assert not job_system.exits, f"seed {job_system.seed}: workers exited on their own: {job_system.exits}"
    assert numbers["long"], "no committed job ran longer than the checkers' max_age"
    client.close()
