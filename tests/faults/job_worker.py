"""A writer driver of the fault suite's run for write jobs: Spark's driver and its tasks, without Spark.

``python -m tests.faults.job_worker CONFIG SLOT`` runs a seeded sequence of *items*: a batch job (a new
``BatchWriter``, its job id random, as ``df.write`` makes one) or the next micro-batch of the slot's streaming sink
(``StreamWriter``, sink ``faults-sink-<slot>``). Each task attempt runs ``writer.write(...)`` in a thread of its own
(partitions in parallel) with a task context of its own (:class:`TaskContexts`: the partition, a task attempt id
and the micro-batch's id, as Spark's Python worker has them), reading its rows slowly, so that a job runs 1.1-1.6 s:
longer than the checker's ``max_age``, and long enough for a SIGKILL or a SIGSTOP to land while tasks write. Then
the driver commits one successful attempt per partition, or aborts (a partition failed three attempts), like Spark:

- a task attempt may fail part way (its rows staged, then it raises) and be tried again, or be run twice (a
  speculative duplicate), the driver committing either;
- a commit that raises is followed by the writer's ``abort``; a micro-batch whose commit raised is run again (the
  query restarts from its checkpoint: same sink, same batch id, same rows), and so is the micro-batch a killed
  driver had not checkpointed, first thing after the restart; a batch job is never run again (an application
  that reruns a failed job makes a new one);
- the slot's *checkpoint* (the last micro-batch whose commit returned) is journaled right after the commit returns.

Every job's rows are deterministic: row ``n`` of job ``label`` has the body ``<label>/<n>`` (the same in every run
of a micro-batch, as Spark replays the same offsets) and the key ``k<n>``.

Injections (one per item at most, :data:`INJECTIONS`), made by wrapping ``WriteJob.decide`` and the publishing
calls of ``WriteJob._do`` in this process: SIGKILL before the decision, right after it, or after the first
publishing call; the first publishing call raising a dropped connection before it runs or after it ran (its reply
lost), then Spark's abort, or the driver dying before the abort, or the abort's first publishing call raising too;
the driver stalling longer than the job's lease between its tasks and its commit. Each slot is first given a share
of every injection for both kinds of job (:func:`required`), kept until it lands; then items draw at random. Stage
entries hold 25 rows and a publishing call moves one entry, so that a kill or a raise lands between the chunks of
one stage as well as between stages.

The journal (:class:`Journal`, SQLite beside the logs) is the ground truth the test checks Redis against: every job
(label, kind, decision key, topic, rows), and what happened to it (``run``, ``task failed``, ``deciding``, ``commit
returned`` with the last entry id of each topic stream when it returned, ``commit raised``, ``abort returned``
with the decision it settled by and the same marks, ``abort raised``, ``landed <injection>``). After its quota of
items (or once the config's ``seconds`` have passed since its first start: a library that settles jobs under
their drivers may never let a micro-batch commit) the driver touches ``<journal>.done`` and exits."""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import redis
from pyspark.sql.types import StringType, StructField, StructType

import redis_txmq.jobs.stages
import redis_txmq.spark.writer
from redis_txmq.core.errors import TxMQConnectionError
from redis_txmq.core.keys import JobKeys
from redis_txmq.core.topics import partition_keys
from redis_txmq.jobs import JobDecision, WriteJob
from redis_txmq.spark.writer import BatchWriter, StagedRows, StreamWriter, parse_write_options

logger = logging.getLogger("faults.jobs")

TOPICS = {"ledger": 2, "events": 1}
"""Topic -> partitions: batch jobs write ``ledger`` (rows routed by key over two streams), micro-batches
``events``."""
BATCH_TOPIC, MICRO_TOPIC = "ledger", "events"
KINDS = ("batch", "micro")
INJECTIONS = (
    "kill before decision",
    "kill after decision",
    "kill mid-publish",
    "raise after decision",
    "raise mid-publish",
    "raise, then die before abort",
    "raise, abort raises too",
    "stall past the lease",
)
"""What an item does to its own commit (see the module's docstring)."""
NO_INJECTION_SHARE = 0.4
"""Share of the items, once a slot's required injections landed, that commit without one."""
ROWS_PER_ENTRY = 25
"""Rows per stage entry (the writer packs 100): a job's stages hold several entries each."""
PUBLISH_CHUNK = 1
"""Stage entries per publishing call (the library moves 10): a job is published in many calls."""
RECORD_BATCH = 20
"""Rows per Arrow record batch a task reads, one every ``job seconds / batches``."""
TASK_TRIES = 3
"""Attempts of one partition before the job is aborted (Spark's default is 4)."""
RETRY_PAUSE = 0.3
MICRO_RUNS = 5
"""Runs of one micro-batch by one item before the item gives up (the next micro item runs it again)."""
STALL_OVER_LEASE = 1.0
"""Seconds the injection ``stall past the lease`` sleeps on top of the job's lease."""


class TaskFailed(Exception):
    """What a task attempt that fails part way raises (after staging some of its rows)."""


class DriverDies(BaseException):
    """Never caught: the process SIGKILLs itself where this would be raised."""


# -- the ground truth ------------------------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    label TEXT PRIMARY KEY, kind TEXT NOT NULL, decision TEXT NOT NULL, topic TEXT NOT NULL, rows INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    n INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL, event TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '',
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS items (i INTEGER PRIMARY KEY, kind TEXT NOT NULL, injection TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS todo (kind TEXT NOT NULL, injection TEXT NOT NULL, PRIMARY KEY (kind, injection));
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class JobRecord:
    label: str
    kind: str
    decision: str
    topic: str
    rows: int


@dataclass(frozen=True)
class Event:
    label: str
    event: str
    detail: str
    at: float


class Journal:
    """One driver slot's SQLite journal (WAL; one connection shared by the task threads under a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)

    def _run(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        """The statements in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, *params: Any) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    @staticmethod
    def _event(label: str, event: str, detail: str) -> tuple[str, tuple[Any, ...]]:
        return "INSERT INTO events (label, event, detail, at) VALUES (?, ?, ?, ?)", (label, event, detail, time.time())

    def event(self, label: str, event: str, detail: str = "") -> None:
        self._run(self._event(label, event, detail))

    def job(self, job: JobRecord) -> None:
        self._run(("INSERT OR IGNORE INTO jobs VALUES (?, ?, ?, ?, ?)", tuple(vars(job).values())))

    def landed(self, label: str, kind: str, injection: str, detail: str = "") -> None:
        """The injection happened (journaled before a kill): no longer required of the slot."""
        self._run(
            self._event(label, f"landed {injection}", detail),
            ("DELETE FROM todo WHERE kind = ? AND injection = ?", (kind, injection)),
        )

    def committed(self, label: str, batch_id: int, marks: dict[str, str]) -> None:
        """A micro-batch's commit returned: its event and the checkpoint, together."""
        self._run(
            self._event(label, "commit returned", json.dumps(marks)),
            ("INSERT OR REPLACE INTO state VALUES ('checkpoint', ?)", (batch_id,)),
        )

    def value(self, key: str, default: int) -> int:
        rows = self._rows("SELECT value FROM state WHERE key = ?", key)
        return int(rows[0][0]) if rows else default

    def started(self) -> float:
        """When the slot's driver first started (epoch seconds)."""
        self._run(("INSERT OR IGNORE INTO state VALUES ('started', ?)", (int(time.time()),)))
        return float(self.value("started", 0))

    def begin_item(self, i: int, kind: str, injection: str) -> None:
        self._run(
            ("INSERT OR REPLACE INTO items VALUES (?, ?, ?)", (i, kind, injection)),
            ("INSERT OR REPLACE INTO state VALUES ('next_item', ?)", (i + 1,)),
        )

    def require(self, wanted: list[tuple[str, str]]) -> None:
        """Set the slot's required injections, once (a restarted driver keeps what is left of them)."""
        if not self._rows("SELECT 1 FROM state WHERE key = 'required'"):
            self._run(
                *(("INSERT OR IGNORE INTO todo VALUES (?, ?)", pair) for pair in wanted),
                ("INSERT INTO state VALUES ('required', ?)", (len(wanted),)),
            )

    def todo(self) -> list[tuple[str, str]]:
        return [(kind, injection) for kind, injection in self._rows("SELECT kind, injection FROM todo ORDER BY 2, 1")]

    def jobs(self) -> list[JobRecord]:
        return [JobRecord(*row) for row in self._rows("SELECT label, kind, decision, topic, rows FROM jobs")]

    def events(self) -> list[Event]:
        return [Event(*row) for row in self._rows("SELECT label, event, detail, at FROM events ORDER BY n")]

    def close(self) -> None:
        self._db.close()


# -- what the seed says ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A job's rows and the fate of its task attempts."""

    label: str
    rows: int
    partitions: int
    seconds: float
    """How long each task takes to read its rows."""
    fails_first: tuple[bool, ...]
    """Per partition: its first attempt fails part way (after staging some rows)."""
    speculative: tuple[bool, ...]
    """Per partition: two attempts succeed; the driver commits one of them."""

    def partition_rows(self, partition: int) -> range:
        size = -(-self.rows // self.partitions)
        return range(partition * size, min(self.rows, (partition + 1) * size))


def spec(label: str, seed: str) -> Spec:
    rng = random.Random(seed)
    partitions = rng.randint(1, 3)
    return Spec(
        label,
        rows=rng.randint(40, 160) * partitions,
        partitions=partitions,
        seconds=rng.uniform(1.1, 1.6),
        fails_first=tuple(rng.random() < 0.2 for _ in range(partitions)),
        speculative=tuple(rng.random() < 0.1 for _ in range(partitions)),
    )


def required(slot: int, drivers: int) -> list[tuple[str, str]]:
    """The slot's share of every injection for both kinds of job."""
    pairs = list(itertools.product(KINDS, INJECTIONS))
    return [pair for i, pair in enumerate(pairs) if i % drivers == slot]


def draw_item(seed: int, slot: int, i: int, todo: list[tuple[str, str]]) -> tuple[str, str]:
    """Item ``i``'s kind and injection: the first required one left, else at random."""
    if todo:
        return todo[0]
    rng = random.Random(f"{seed}/{slot}/item/{i}")
    kind = rng.choice(KINDS)
    injection = "" if rng.random() < NO_INJECTION_SHARE else rng.choice(INJECTIONS)
    return kind, injection


# -- Spark's pieces, without Spark -----------------------------------------------------------------------------


class TaskContexts:
    """Stands in for ``pyspark.TaskContext`` in the writer module: each task thread has a context of its own (a
    Python worker of Spark runs one task at a time, whose context is the process' one)."""

    _local = threading.local()
    _attempts = itertools.count(1)

    def __init__(self, partition: int, batch_id: int | None) -> None:
        self._partition = partition
        self._attempt = next(self._attempts)
        self._batch_id = batch_id

    @classmethod
    def get(cls) -> TaskContexts | None:
        return getattr(cls._local, "context", None)

    @classmethod
    def enter(cls, context: TaskContexts | None) -> None:
        cls._local.context = context

    def partitionId(self) -> int:  # noqa: N802 - Spark's name
        return self._partition

    def taskAttemptId(self) -> int:  # noqa: N802 - Spark's name
        return self._attempt

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802 - Spark's name
        if key == redis_txmq.spark.writer.BATCH_ID_PROPERTY and self._batch_id is not None:
            return str(self._batch_id)
        return None


class Injector:
    """The injection armed for the commit (or abort) under way, and the wrappers that make it happen."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.injection = ""
        self.label = ""
        self.kind = ""
        self.fired = False
        self.last_abort: JobDecision | None = None

    def arm(self, injection: str, label: str, kind: str) -> None:
        self.injection, self.label, self.kind = injection, label, kind
        self.fired = False

    def disarm(self) -> None:
        self.injection = ""

    def land(self, detail: str = "") -> None:
        self.journal.landed(self.label, self.kind, self.injection, detail)
        self.fired = True

    def die(self, detail: str = "") -> None:
        """Journal the landing, then SIGKILL this process (no cleanup, no abort)."""
        self.land(detail)
        logger.warning("fault: %s of %s: SIGKILL", self.injection, self.label)
        os.kill(os.getpid(), signal.SIGKILL)
        raise DriverDies  # not reached

    def install(self) -> None:
        decide, do, abort = WriteJob.decide, WriteJob._do, WriteJob.abort
        injector = self

        def wrapped_decide(job: WriteJob, outcome: Any, stages: Any) -> JobDecision:
            if injector.injection == "kill before decision":
                injector.die()
            decision = decide(job, outcome, stages)
            if injector.injection == "kill after decision" and decision.status == "DECIDED":
                injector.die(decision.outcome.value)
            return decision

        def wrapped_do(job: WriteJob, what: str, action: Any) -> Any:
            if what != "publish" or not injector.injection or injector.fired:
                return do(job, what, action)
            injection = injector.injection
            if injection in ("raise after decision", "raise, then die before abort", "raise, abort raises too"):
                injector.land("before the first publishing call")
                return do(job, what, dropped)
            if injection == "raise in abort":  # the abort after "raise, abort raises too"
                injector.fired = True
                return do(job, what, dropped)
            if injection == "raise mid-publish":

                def applied_then_dropped() -> Any:
                    moved = action()  # applied; its reply is lost
                    injector.land(f"after the first publishing call moved {moved[1]} rows")
                    return dropped()

                return do(job, what, applied_then_dropped)
            if injection == "kill mid-publish":
                moved = do(job, what, action)
                injector.die(f"after the first publishing call moved {moved[1]} rows, {moved[2]} entries left")
            return do(job, what, action)

        def wrapped_abort(job: WriteJob) -> JobDecision:
            injector.last_abort = None
            decision = abort(job)
            injector.last_abort = decision
            return decision

        WriteJob.decide = wrapped_decide  # type: ignore[method-assign,assignment]
        WriteJob._do = wrapped_do  # type: ignore[method-assign,assignment]
        WriteJob.abort = wrapped_abort  # type: ignore[method-assign,assignment]


def dropped() -> Any:
    """A publishing call whose connection dropped (what redis-py raises; ``WriteJob`` makes it its own error)."""
    raise redis.ConnectionError("fault: the connection dropped after the decision")


# -- the driver ------------------------------------------------------------------------------------------------


class Driver:
    def __init__(self, config: dict[str, Any], slot: int, stop: threading.Event) -> None:
        self.config, self.slot, self.stop = config, slot, stop
        self.seed = int(config["seed"])
        self.journal = Journal(Path(config["journals"][slot]))
        self.injector = Injector(self.journal)
        self.sink = f"faults-sink-{slot}"
        self.client: Any = redis.Redis.from_url(config["redis_url"])
        schema = StructType([StructField("body", StringType()), StructField("keys", StringType())])
        common = {"redis.url": config["redis_url"], "writeBatchSize": "50", "jobLease": str(config["job_lease"])}
        self.batch_options = parse_write_options({**common, "topic": BATCH_TOPIC}, schema, streaming=False)
        self.micro_options = parse_write_options(
            {**common, "topic": MICRO_TOPIC, "sinkId": self.sink}, schema, streaming=True
        )
        self.stream_writer = StreamWriter(self.micro_options)
        self.job_lease = float(config["job_lease"])

    def marks(self, topic: str) -> dict[str, str]:
        """The last entry id of each stream of ``topic`` now (once Redis answers): a row published before now has
        an id at most this."""
        while True:
            try:
                marks = {}
                for keys in partition_keys(self.client, topic):
                    last = self.client.xrevrange(keys.topic_stream, count=1)
                    marks[keys.topic_stream] = last[0][0].decode() if last else "0-0"
                return marks
            except redis.ConnectionError as exc:
                logger.warning("reading the marks of %s: %s; again", topic, exc)
                time.sleep(RETRY_PAUSE)

    # -- tasks ---------------------------------------------------------------------------------------------------

    def batches(self, job: Spec, partition: int, fail_after: int | None) -> Iterator[pa.RecordBatch]:
        numbers = list(job.partition_rows(partition))
        chunks = [numbers[i : i + RECORD_BATCH] for i in range(0, len(numbers), RECORD_BATCH)] or [[]]
        pause = job.seconds / len(chunks)
        read = 0
        for chunk in chunks:
            if fail_after is not None and read >= fail_after:
                raise TaskFailed(f"{job.label}: partition {partition} failed after {read} rows")
            time.sleep(pause)
            yield pa.RecordBatch.from_pydict(
                {"body": [f"{job.label}/{n}" for n in chunk], "keys": [f"k{n}" for n in chunk]}
            )
            read += len(chunk)

    def attempt(self, writer: Any, job: Spec, partition: int, batch_id: int | None, fail: bool) -> StagedRows:
        TaskContexts.enter(TaskContexts(partition, batch_id))
        try:
            size = len(job.partition_rows(partition))
            result: StagedRows = writer.write(self.batches(job, partition, size // 2 if fail else None))
            return result
        finally:
            TaskContexts.enter(None)

    def partition(self, writer: Any, job: Spec, partition: int, batch_id: int | None) -> StagedRows | None:
        """The partition's attempts until one succeeds (and a speculative duplicate): the message Spark commits,
        or None when every attempt failed."""
        rng = random.Random(f"{self.seed}/{job.label}/{partition}")
        succeeded: list[StagedRows] = []
        for attempt in range(TASK_TRIES):
            fail = attempt == 0 and job.fails_first[partition]
            try:
                succeeded.append(self.attempt(writer, job, partition, batch_id, fail))
            except Exception as exc:  # noqa: BLE001 - a task that fails for any reason is tried again, as in Spark
                self.journal.event(job.label, "task failed", f"partition {partition}: {type(exc).__name__}: {exc}")
                time.sleep(RETRY_PAUSE)
                continue
            if job.speculative[partition]:
                try:
                    succeeded.append(self.attempt(writer, job, partition, batch_id, False))
                except Exception as exc:  # noqa: BLE001
                    self.journal.event(job.label, "task failed", f"speculative {partition}: {type(exc).__name__}")
            return rng.choice(succeeded)
        return None

    def tasks(self, writer: Any, job: Spec, batch_id: int | None) -> tuple[list[StagedRows], bool]:
        """Run the job's partitions in parallel: (the messages of the succeeded partitions, whether all did)."""
        with ThreadPoolExecutor(max_workers=job.partitions, thread_name_prefix=f"task-{job.label}") as pool:
            results = list(pool.map(lambda p: self.partition(writer, job, p, batch_id), range(job.partitions)))
        messages = [message for message in results if message is not None]
        return messages, len(messages) == job.partitions

    # -- the driver's commit and abort ---------------------------------------------------------------------------

    def settle(self, job: Spec, kind: str, injection: str, writer: Any, batch_id: int | None) -> bool:
        """Run the tasks, then commit (and abort when that raised) like Spark's driver; True when the commit
        returned."""
        topic = MICRO_TOPIC if batch_id is not None else BATCH_TOPIC
        call = (lambda m: writer.commit(m, batch_id)) if batch_id is not None else writer.commit
        cancel = (lambda m: writer.abort(m, batch_id)) if batch_id is not None else writer.abort
        messages, complete = self.tasks(writer, job, batch_id)
        if not complete:
            self.journal.event(job.label, "gave up", "a partition failed every attempt")
            self.abort(job, topic, cancel, messages)
            return False
        if injection == "stall past the lease":
            time.sleep(self.job_lease + STALL_OVER_LEASE)  # no task runs: nothing renews the lease
            self.journal.landed(job.label, kind, injection, f"{self.job_lease + STALL_OVER_LEASE:g} s")
            injection = ""
        staged = sum(message.rows for message in messages)
        self.journal.event(job.label, "deciding", f"{staged} rows in {sum(len(m.stages) for m in messages)} stages")
        self.injector.arm(injection, job.label, kind)
        try:
            call(messages)
        except Exception as exc:  # noqa: BLE001 - Spark aborts whatever the commit raised
            fired = self.injector.fired
            self.injector.disarm()
            self.journal.event(job.label, "commit raised", f"{type(exc).__name__}: {exc}")
            if fired and injection == "raise, then die before abort":
                logger.warning("fault: %s: SIGKILL before the abort", job.label)
                os.kill(os.getpid(), signal.SIGKILL)
            if fired and injection == "raise, abort raises too":
                self.injector.arm("raise in abort", job.label, kind)
            self.abort(job, topic, cancel, messages)
            return False
        finally:
            self.injector.disarm()
        if batch_id is not None:
            self.journal.committed(job.label, batch_id, self.marks(topic))
        else:
            self.journal.event(job.label, "commit returned", json.dumps(self.marks(topic)))
        return True

    def abort(self, job: Spec, topic: str, cancel: Any, messages: list[StagedRows]) -> None:
        try:
            cancel(messages)
        except Exception as exc:  # noqa: BLE001 - Spark logs a failed abort; the checker finishes the job
            self.journal.event(job.label, "abort raised", f"{type(exc).__name__}: {exc}")
            return
        finally:
            self.injector.disarm()
        decision = self.injector.last_abort
        outcome = f"{decision.outcome.value} {decision.status}" if decision else "?"
        self.journal.event(job.label, "abort returned", json.dumps({"decision": outcome, **self.marks(topic)}))

    # -- items ---------------------------------------------------------------------------------------------------

    def batch_job(self, i: int, injection: str) -> None:
        while True:  # df.write fails at once while Redis cannot be reached: the application tries again
            try:
                writer = BatchWriter(self.batch_options)
                break
            except TxMQConnectionError as exc:
                logger.warning("item %d: %s; again", i, exc)
                time.sleep(RETRY_PAUSE)
        job = spec(f"d{self.slot}-b{i}", f"{self.seed}/{self.slot}/batch/{i}")
        self.journal.job(JobRecord(job.label, "batch", writer.keys.decision, BATCH_TOPIC, job.rows))
        self.journal.event(job.label, "run", writer.keys.job_id)
        self.settle(job, "batch", injection, writer, None)

    def micro_batch(self, injection: str, replay: bool = False) -> None:
        """Run the micro-batch after the checkpoint until its commit returns (the query restarted after each
        failure), at most :data:`MICRO_RUNS` times."""
        for run in range(MICRO_RUNS):
            if self.stop.is_set():
                return
            batch_id = self.journal.value("checkpoint", -1) + 1
            job = spec(f"d{self.slot}-s{batch_id}", f"{self.seed}/{self.sink}/{batch_id}")
            keys = JobKeys.of_batch(self.sink, batch_id)
            self.journal.job(JobRecord(job.label, "micro", keys.decision, MICRO_TOPIC, job.rows))
            self.journal.event(job.label, "run", "replay after a restart" if replay and run == 0 else f"run {run}")
            if self.settle(job, "micro", injection if run == 0 else "", self.stream_writer, batch_id):
                return

    def run(self) -> bool:
        """The slot's items (resuming after a restart); True when they are all done."""
        self.journal.require(required(self.slot, int(self.config["drivers"])))
        start = self.journal.value("next_item", 0)
        checkpoint = self.journal.value("checkpoint", -1)
        ends = self.journal.started() + float(self.config["seconds"])
        begun = {job.label for job in self.journal.jobs()}
        if f"d{self.slot}-s{checkpoint + 1}" in begun and time.time() < ends:  # the query restarts: the batch again
            self.micro_batch("", replay=True)
        quota = int(self.config["items"])
        for i in itertools.count(start):
            todo = self.journal.todo()
            if self.stop.is_set() or i >= 2 * quota or (i >= quota and not todo):
                break
            if time.time() > ends:
                logger.error("item %d: out of time (required injections left: %s)", i, todo)
                break
            kind, injection = draw_item(self.seed, self.slot, i, todo)
            self.journal.begin_item(i, kind, injection)
            logger.info("item %d: %s %s", i, kind, injection or "(no injection)")
            if kind == "batch":
                self.batch_job(i, injection)
            else:
                self.micro_batch(injection)
        return not self.stop.is_set()

    def close(self) -> None:
        self.client.close()
        self.journal.close()


def main(config_path: str, slot_arg: str) -> None:
    config, slot = json.loads(Path(config_path).read_text()), int(slot_arg)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    redis_txmq.spark.writer.TaskContext = TaskContexts  # type: ignore[misc,assignment]
    redis_txmq.spark.writer.ROWS_PER_STAGE_ENTRY = ROWS_PER_ENTRY  # type: ignore[misc]
    redis_txmq.jobs.stages.PUBLISH_CHUNK = PUBLISH_CHUNK  # type: ignore[misc]
    driver = Driver(config, slot, stop)
    driver.injector.install()
    try:
        if driver.run():
            Path(f"{config['journals'][slot]}.done").touch()
            logger.info("all items done")
    finally:
        driver.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
