"""Write jobs: many rows published exactly once, or not at all (the Spark writer's core; no Spark here).

A job's task attempts write their rows to *stages*: one stream per attempt and topic stream, in the topic stream's
hash slot, invisible to consumers; a stage entry packs up to :data:`ROWS_PER_STAGE_ENTRY` rows in its one field
:data:`STAGE_ROWS_FIELD` (MessagePack, see ``lua/publish_stage.lua``), so that writing a row costs the server a
fraction of a command. The driver then decides once
(``lua/decide_job.lua``): COMMIT with the stages of the attempts Spark committed, or ROLLBACK. Settling follows the
decision that stands: every committed stage is moved into its topic stream chunk by chunk (``lua/publish_stage.lua``,
each chunk moved and trimmed in one call, so a repeat never publishes a row twice) and every other stage — failed or
speculative attempts, a rolled-back job — is deleted. A driver that dies after its decision leaves the settling to
the checker (:func:`settle_jobs`), as does a job that never decided within ``max_age``, which is rolled back.

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
import time
from dataclasses import dataclass
from typing import Any

from .config import Settings
from .connection import REDIS_ERRORS
from .direct import ScriptRunner
from .entries import text
from .errors import DurabilityError, TxMQConnectionError, TxMQError
from .keys import JOB_REGISTRY, JobKeys, stage_key, stream_of_stage
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


@dataclass(frozen=True)
class Decision:
    """The decision that stands for a job, and whether this call made it."""

    outcome: LocalTransactionState
    stages: list[str]
    status: str
    """DECIDED (this call), DUPLICATE (an earlier decision stands), REPLAYED (the sink committed this batch
    before and its decision is gone: nothing to publish) or DISCARDED (stages deleted, nothing decided)."""


class WriteJob:
    """One write job on one client (``redis.Redis`` or ``RedisCluster``); :meth:`close` when done with it."""

    def __init__(self, client: Any, keys: JobKeys, settings: Settings | None = None) -> None:
        self.client = client
        self.keys = keys
        self.settings = settings or Settings()
        self._decide = register_script(client, "decide_job")
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

    def register(self) -> None:
        """List the job for the checker before any task writes (a driver that dies leaves nothing unlisted)."""
        started = {self.keys.decision: int(time.time() * 1000)}
        self._do("register", lambda: self.client.zadd(JOB_REGISTRY, started, nx=True))

    def stage(self, stream: str, attempt: str) -> str | None:
        """The stage of task attempt ``attempt`` for ``stream``: opened empty with a time to live
        (``lua/open_stage.lua``; rows go in with ``XADD NOMKSTREAM``), then listed in the job's stages
        (``lua/note_stage.lua``), the job listed for the checker first. None when the job is already decided (a
        late or speculative attempt, a micro-batch replayed after a restart): the attempt writes nothing."""
        key = stage_key(stream, self.job_id, attempt)
        self.register()
        # not confirmed here: the writer's confirmation of its stage writes covers these earlier writes too
        self._do("open a stage", lambda: self._open_stage(keys=[key], args=[self.settings.kept_ms]))
        noted = self._do("note a stage", lambda: self._note_stage(keys=self.keys.note_keys, args=[key]))
        if text(noted[0]) == "OK":
            return key
        self._do("delete a stage", lambda: self.client.delete(key))
        if text(noted[0]) != "DECIDED":
            raise TxMQError(f"write job {self.job_id}: stage {key} refused: {text(noted[1])} {text(noted[2])}")
        logger.info(
            "write job %s: already decided %s when task attempt %s began to write for %s: it writes nothing",
            self.job_id,
            text(noted[1]),
            attempt,
            stream,
        )
        return None

    def decide(self, outcome: LocalTransactionState, stages: list[str]) -> Decision:
        keys = [self.keys.decision] + ([self.keys.sink] if self.keys.sink else [])
        batch = str(self.keys.batch_id) if self.keys.sink else ""
        args = [LocalTransactionState(outcome).value, json.dumps(sorted(stages)), self.settings.kept_ms, batch]
        reply = self._do("decide", lambda: self._runner.run(self._decide, keys, args))
        return self._decision(reply)

    def _decision(self, reply: Any) -> Decision:
        status, first, second, third = (text(part) or "" for part in [*reply, "", "", ""][:4])
        if status != "OK":
            raise TxMQError(f"write job {self.job_id}: decision refused: {first} {second}")
        return Decision(LocalTransactionState(first), json.loads(second), third)

    def commit(self, stages: list[str]) -> Decision:
        """Decide COMMIT for these stages (unless another decision stands), then settle by the decision."""
        decision = self.decide(LocalTransactionState.COMMIT, stages)
        self.settle(decision)
        return decision

    def abort(self) -> Decision:
        """Decide ROLLBACK (unless a decision stands), then settle by the decision. A rollback the durability level
        did not confirm is settled all the same: lost in a failover, it leaves an undecided job, which is rolled
        back too (after ``max_age``); nothing is published either way."""
        try:
            decision = self.decide(LocalTransactionState.ROLLBACK, [])
        except DurabilityError as exc:
            if not exc.replies:
                raise
            decision = self._decision(exc.replies[0])
            logger.warning("%s; settling by the decision on the master", exc)
        self.settle(decision)
        return decision

    def discard(self) -> None:
        """Delete every stage of the job without deciding: a streaming micro-batch that failed is run again by
        Spark with the same batch id, which must still be free to commit."""
        self.settle(Decision(LocalTransactionState.ROLLBACK, [], "DISCARDED"))

    def settle(self, decision: Decision) -> int:
        """Publish the decision's stages, delete every other stage of the job, unlist it; returns rows published."""
        published = sum(self.publish(stage) for stage in decision.stages)
        keep = set(decision.stages)
        written = self._do("read its stages", lambda: self.client.smembers(self.keys.stages))
        for stage in (text(member) or "" for member in written):
            if stage not in keep:
                self._do("delete a stage", lambda stage=stage: self.client.delete(stage))
        self._do("delete its stage list", lambda: self.client.delete(self.keys.stages))
        self._do("unlist", lambda: self.client.zrem(JOB_REGISTRY, self.keys.decision))
        return published

    def publish(self, stage: str) -> int:
        """Move a stage into its topic stream, chunk by chunk; returns the rows this call moved."""
        stream = stream_of_stage(stage)
        moved = 0
        while True:
            reply = self._do("publish", lambda: self._runner.run(self._publish, [stage, stream], [PUBLISH_CHUNK]))
            if text(reply[0]) != "OK":
                raise TxMQError(f"write job {self.job_id}: stage {stage}: {text(reply[1])} {text(reply[2])}")
            moved += int(reply[1])
            if int(reply[2]) == 0:
                return moved

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


def settle_jobs(client: Any, settings: Settings, limit: int = 100) -> int:
    """Settle the jobs their driver left: decided ones once their decision is ``transaction_timeout`` old (a live
    driver is settling it meanwhile; a repeat is harmless), undecided ones after ``max_age`` (rolled back).
    Returns the number of jobs settled."""
    now_ms = int(time.time() * 1000)
    listed = client.zrangebyscore(JOB_REGISTRY, "-inf", now_ms, start=0, num=limit, withscores=True)
    settled = 0
    for member, started_ms in listed:
        decision_key = text(member) or ""
        try:
            keys = JobKeys.of_decision(decision_key)
        except ValueError:
            client.zrem(JOB_REGISTRY, member)
            continue
        job = WriteJob(client, keys, settings)
        try:
            decision = _settle_left(job, client, now_ms, int(started_ms), settings)
        finally:
            job.close()
        if decision is not None:
            logger.info("write job %s settled by the checker: %s", keys.job_id, decision.outcome.value)
            settled += 1
    return settled


def _settle_left(job: WriteJob, client: Any, now_ms: int, started_ms: int, settings: Settings) -> Decision | None:
    """Settle one job its driver may have left, or None while it is its driver's."""
    keys = job.keys
    outcome, decided_ms = client.hmget(keys.decision, "outcome", "decided_ms")
    if outcome is None:
        if now_ms - started_ms < settings.max_age * 1000:
            return None
        logger.warning("write job %s: no decision after max_age; deleting its stages", keys.job_id)
        if keys.sink:
            job.discard()  # Spark runs the micro-batch again from its checkpoint: its batch id stays free
            return Decision(LocalTransactionState.ROLLBACK, [], "DISCARDED")
        return job.abort()
    if now_ms - int(decided_ms or 0) < settings.transaction_timeout * 1000:
        return None
    decision = job.decide(LocalTransactionState(text(outcome)), [])
    job.settle(decision)
    return decision
