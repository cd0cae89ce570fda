"""Every Redis key name of redis-txmq, and nothing else builds one.

Layout (SPEC §3). For a topic stream key ``S`` (the topic name, ``<topic>#<p>`` for partition p of a
partitioned topic; ``#`` cannot occur in a topic name), every companion key carries the hash tag ``{S}``
and so lives in the hash slot of ``S`` itself: one script call can touch them all, also on Redis Cluster.

====================================  ======  ==========================================================
key                                   type    holds
====================================  ======  ==========================================================
``S``                                 stream  committed messages only: what consumers read
``txmq:{S}:half``                     stream  half messages of in-flight transactions (retired on end)
``txmq:{S}:op``                       stream  outcome records, capped (RocketMQ's op half topic)
``txmq:{S}:dead``                     stream  transactions given up by the checker, whole, with reason
``txmq:{S}:inflight``                 hash    transaction id -> half message id
``txmq:{S}:ended``                    hash    transaction id -> outcome, for the dedupe window
``txmq:{S}:ended-at``                 zset    transaction id -> end time (ms), expires ``ended``
``txmq:{S}:unchecked``                zset    transaction id -> born time (ms), never checked, no own immunity
``txmq:{S}:due``                      zset    transaction id -> time of next check (ms)
``txmq:{S}:checks``                   hash    transaction id -> number of checks so far
``txmq:{S}:remarks``                  hash    transaction id -> last remark (listener exception, check answer)
``txmq:{S}:dead-index``               hash    transaction id -> entry id in the dead-letter stream
``txmq:{S}:requests``                 hash    transaction id -> id of its pending check request (at most one)
``txmq:{S}:consumer-dead:<group>``    stream  entries a consumer group gave up on (delivery limit)
``txmq:{S}:consumer-leases:<group>``  hash    consumer -> when (server ms) its lease on the entries it holds ends; 0:
                                              it stopped and handed them back (``lua/consumer_keys.lua``)
``txmq:topic:{T}``                    hash    topic T's metadata: ``partitions`` (absent: one partition)
``txmq:topics``                       set     registry of topic stream keys that have seen a transaction
``txmq:schedule``                     zset    topic stream key -> when (server ms) a checker looks at it next: rounds
                                              visit what is due, not every registered topic (SPEC §4.5)
``txmq:groups``                       set     registry of producer groups that have started a producer
``txmq:group:{G}:check``              stream  check requests for producer group G (read by its producers)
``txmq:group:{G}:producers``          zset    producer instance -> last heartbeat (ms, server clock)
``txmq:group:{G}:layouts``            hash    producer instance -> the key layout version it writes (0.1.0: none)
``txmq:replies``                      stream  check answers from producers (read by the checkers)
``txmq:checkers``                     zset    checker instance -> last heartbeat (ms, server clock)
``txmq:group:{G}:durability``         hash    producer instance -> durability level (``txmq status``)
``txmq:{txmq:checkers}:durability``   hash    checker instance -> durability level (slot of ``txmq:checkers``)
``txmq:decision:{X}``                 hash    the decision of transaction X of several messages (its own slot)
``txmq:{S}:stage:<J>:<a>``            stream  rows of attempt a of a write job J for stream S, invisible until J commits
                                              (MessagePack, 100 rows per entry; expires after max_age + dedupe window)
``txmq:{S}:published:<J>:<a>``        hash    ``rows``: how many rows of that stage were published (kept as long as
                                              J's decision: a stage published in full is told apart from a lost one)
``txmq:job:{J}`` / ``:stages``        hash    write job J: its lease while undecided (``lease_ms``), then its decision
                                              (outcome, stages committed, rows per stage) / set: its stages
``txmq:job:{J}:set-aside``            set     stages of a micro-batch that was not committed, to delete
``txmq:job:{K}:<b>`` / ``:stages``    hash    the same for micro-batch b of streaming sink K
``txmq:sink:{K}``                     hash    streaming sink K: ``last_batch``, the last micro-batch it committed
``txmq:jobs``                         zset    write jobs not settled yet -> when the checker looks at each next (ms:
                                              its lease's end, its decision's time + transaction_timeout; +inf: parked)
``txmq:audit``                        stream  what operators did in the console: who, action, transaction, result
                                              (capped near ``AUDIT_MAXLEN`` entries)
====================================  ======  ==========================================================

The Lua scripts that change a transaction receive ``TopicKeys.script_keys`` as KEYS, in that order;
``lua/topic_keys.lua`` binds them to names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .message import validate_name

PREFIX = "txmq"
TOPIC_REGISTRY = f"{PREFIX}:topics"
SCHEDULE = f"{PREFIX}:schedule"
"""Topic stream key -> the server time (ms) a checker looks at that topic next: the earliest check due of its
in-flight transactions, or when its oldest remembered outcome leaves the dedupe window; absent while it holds
neither. Checkers write it after a look (``lua/schedule_topics.lua``); a prepare into a topic with nothing
unchecked "wakes" it (scores it at the prepare's time): in the prepare script itself where the schedule may be
passed beside the topic keys (one server), else from the client right after (Cluster)."""
GROUP_REGISTRY = f"{PREFIX}:groups"
REPLY_STREAM = f"{PREFIX}:replies"
CHECKER_INSTANCES = f"{PREFIX}:checkers"
CHECKER_LEVELS = f"{PREFIX}:{{{CHECKER_INSTANCES}}}:durability"
"""Checker instance -> durability level; tagged with the whole name of ``txmq:checkers`` (which has no tag), so
both live in one hash slot for the heartbeat script; under the ``txmq:`` prefix like every key of the library.
Earlier releases wrote ``{txmq:checkers}:durability``, outside the prefix (an ACL user limited to ``~txmq:*`` could
not start a checker); it fed ``txmq status`` only, so it is not read any more and may be deleted."""
PRODUCERS_CONSUMER_GROUP = "producers"
"""Consumer group of a check-request stream: the live producer instances of the producer group."""
CHECKERS_CONSUMER_GROUP = "checkers"
"""Consumer group of the reply stream: the checker instances."""
PARTITION_SEPARATOR = "#"


def topic_meta_key(topic: str) -> str:
    """Metadata of a topic (its partition count), in the slot of the unpartitioned stream ``topic``."""
    return f"{PREFIX}:topic:{{{topic}}}"


def topic_stream_key(topic: str, partition: int = 0, partitioned: bool = False) -> str:
    """The key of a topic partition's stream: the bare topic name when the topic is not partitioned."""
    if not partitioned:
        return topic
    return f"{topic}{PARTITION_SEPARATOR}{partition}"


@dataclass(frozen=True)
class TopicKeys:
    """The keys of one topic partition; all in the hash slot of ``topic_stream``."""

    topic: str
    partition: int = 0
    partitioned: bool = False

    @cached_property
    def topic_stream(self) -> str:
        return topic_stream_key(self.topic, self.partition, self.partitioned)

    def _companion(self, name: str) -> str:
        return f"{PREFIX}:{{{self.topic_stream}}}:{name}"

    @property
    def half_stream(self) -> str:
        return self._companion("half")

    @property
    def op_stream(self) -> str:
        return self._companion("op")

    @property
    def dead_stream(self) -> str:
        return self._companion("dead")

    @property
    def inflight(self) -> str:
        return self._companion("inflight")

    @property
    def ended(self) -> str:
        return self._companion("ended")

    @property
    def ended_at(self) -> str:
        return self._companion("ended-at")

    @property
    def unchecked(self) -> str:
        return self._companion("unchecked")

    @property
    def due(self) -> str:
        return self._companion("due")

    @property
    def checks(self) -> str:
        return self._companion("checks")

    @property
    def remarks(self) -> str:
        return self._companion("remarks")

    @property
    def dead_index(self) -> str:
        return self._companion("dead-index")

    @property
    def check_requests(self) -> str:
        """Transaction id -> the entry id of its one pending check request in its producer group's stream."""
        return self._companion("requests")

    def consumer_dead_stream(self, group: str) -> str:
        """Dead letters of one consumer group of this topic stream."""
        validate_name(group, "consumer group")
        return self._companion(f"consumer-dead:{group}")

    def consumer_leases(self, group: str) -> str:
        """Consumer -> the server time (ms) its lease on the entries it holds ends, renewed by its heartbeat; 0 once
        it stopped and handed them back. Only a consumer without a live lease has its entries taken over."""
        validate_name(group, "consumer group")
        return self._companion(f"consumer-leases:{group}")

    def script_keys(self) -> list[str]:
        """KEYS of every transaction script, in the order ``lua/topic_keys.lua`` binds them."""
        return self._script_keys

    def scheduled_script_keys(self) -> list[str]:
        """``script_keys`` and ``SCHEDULE`` (``KEYS[14]``), for the scripts that wake the topic in the
        checkers' schedule, on a server where one call may touch both (not Cluster: another hash slot)."""
        return self._scheduled_script_keys

    @cached_property
    def _scheduled_script_keys(self) -> list[str]:
        return [*self._script_keys, SCHEDULE]

    @cached_property
    def _script_keys(self) -> list[str]:
        return [
            self.half_stream,
            self.op_stream,
            self.dead_stream,
            self.topic_stream,
            self.inflight,
            self.ended,
            self.ended_at,
            self.unchecked,
            self.due,
            self.checks,
            self.remarks,
            self.dead_index,
            self.check_requests,
        ]


@dataclass(frozen=True)
class GroupKeys:
    """The keys of one producer group; all in the hash slot of ``{G}``."""

    producer_group: str

    @property
    def check_requests(self) -> str:
        return f"{PREFIX}:group:{{{self.producer_group}}}:check"

    @property
    def producers(self) -> str:
        return f"{PREFIX}:group:{{{self.producer_group}}}:producers"

    @property
    def layouts(self) -> str:
        """Producer instance -> the key layout version it writes (``redis_txmq.core.layout``), beside ``producers``
        in one slot: the heartbeat script writes both."""
        return f"{PREFIX}:group:{{{self.producer_group}}}:layouts"

    @property
    def durability_levels(self) -> str:
        """Producer instance -> the durability level it writes with (``txmq status``)."""
        return f"{PREFIX}:group:{{{self.producer_group}}}:durability"


def topic_keys_of_stream(stream: str) -> TopicKeys:
    """The ``TopicKeys`` of a topic stream key as stored in the registry."""
    topic, separator, partition = stream.partition(PARTITION_SEPARATOR)
    if not separator:
        return TopicKeys(topic)
    return TopicKeys(topic, int(partition), partitioned=True)


def decision_key(transaction_id: str) -> str:
    """The decision of a transaction of several messages: in the hash slot of its id, apart from every topic."""
    return f"{PREFIX}:decision:{{{transaction_id}}}"


JOB_REGISTRY = f"{PREFIX}:jobs"
"""Write jobs not settled yet: decision key -> the time (server ms) the checker looks at the job next (the end of its
lease, or its decision's time plus ``transaction_timeout``; ``+inf`` for a job parked for an operator)."""


def stage_key(stream: str, job_id: str, attempt: str) -> str:
    """The rows a write job's task attempt wrote for topic stream ``stream``: in the stream's slot, so that one
    script call moves a chunk of them into it."""
    return f"{PREFIX}:{{{stream}}}:stage:{job_id}:{attempt}"


def stream_of_stage(stage: str) -> str:
    """The topic stream a stage key was written for (the inverse of ``stage_key``)."""
    if not stage.startswith(f"{PREFIX}:{{") or "}:stage:" not in stage:
        raise ValueError(f"not a stage key: {stage!r}")
    return stage[len(PREFIX) + 2 : stage.index("}:stage:")]


def published_key(stage: str) -> str:
    """How many rows of ``stage`` were published (``lua/publish_stage.lua``), in the stage's slot; it outlives the
    stage, so that a stage published in full is told apart from one that is missing."""
    stream_of_stage(stage)
    return stage.replace("}:stage:", "}:published:", 1)


@dataclass(frozen=True)
class JobKeys:
    """The keys of a write job (a Spark batch write, or one micro-batch of a streaming sink): its decision and the
    set of stages its tasks wrote, in one slot; for a sink, the slot of the sink, whose last committed micro-batch
    is updated in the same script call as the decision."""

    job_id: str
    sink_id: str = ""
    batch_id: int = -1

    @classmethod
    def of_batch(cls, sink_id: str, batch_id: int) -> JobKeys:
        return cls(f"{validate_name(sink_id, 'sinkId')}.{batch_id}", sink_id, batch_id)

    @cached_property
    def decision(self) -> str:
        if self.sink_id:
            return f"{PREFIX}:job:{{{self.sink_id}}}:{self.batch_id}"
        return f"{PREFIX}:job:{{{self.job_id}}}"

    @cached_property
    def stages(self) -> str:
        return f"{self.decision}:stages"

    @cached_property
    def set_aside(self) -> str:
        """Stages of a micro-batch that was not committed, waiting to be deleted (``lua/settle_job.lua``)."""
        return f"{self.decision}:set-aside"

    @property
    def note_keys(self) -> list[str]:
        """KEYS of ``lua/note_stage.lua``: the decision and the stage list."""
        return [self.decision, self.stages]

    @property
    def settle_keys(self) -> list[str]:
        """KEYS of ``lua/settle_job.lua``: the record, the stage list and the set aside stages."""
        return [self.decision, self.stages, self.set_aside]

    @cached_property
    def sink(self) -> str:
        """The sink's hash (``last_batch``); '' for a batch job."""
        return f"{PREFIX}:sink:{{{self.sink_id}}}" if self.sink_id else ""

    @classmethod
    def of_decision(cls, decision: str) -> JobKeys:
        """The keys of a job from its decision key (as the job registry holds it)."""
        prefix = f"{PREFIX}:job:{{"
        if not decision.startswith(prefix) or "}" not in decision:
            raise ValueError(f"not a job decision key: {decision!r}")
        tag, _, rest = decision[len(prefix) :].partition("}")
        if not rest:
            return cls(tag)
        batch = int(rest.lstrip(":"))
        return cls(f"{tag}.{batch}", tag, batch)


AUDIT_STREAM = f"{PREFIX}:audit"
"""The console's audit trail: one entry per action an operator took (``redis_txmq.ops.console``), read back by its
audit page; outside every topic's slot, written by the operator's user only."""
AUDIT_MAXLEN = 10_000
"""Approximate cap of ``AUDIT_STREAM`` (``XADD MAXLEN ~``): the recent actions, not an archive."""
