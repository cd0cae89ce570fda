"""A batch of prepares (``lua/prepare_halves.lua``) or of ends (``lua/end_transactions.lua``) gives exactly the replies
and leaves exactly the state that its calls give one by one through ``lua/prepare_half.lua`` /
``lua/end_transaction.lua``, in order. The batch scripts are the asyncio lane's send path: whether several sends to
one topic partition go out together or one at a time is up to timing, so a batch must be indistinguishable from its
calls one by one, however it is written inside (one script run per call, or bulk commands over the whole batch).

A differential test on the session's real server: hypothesis draws a program (steps, each a batch of prepares or of
ends of one topic partition, over a small pool of transaction ids and two producer groups, so that repeats inside a
batch, conflicts, group mismatches and bad arguments are frequent; between steps, a check the checker counted or a
dead letter), runs it one call at a time on one logical database and batch by batch on another, and after every
step compares the replies, every topic key, and the checkers' schedule. Entry ids and server times differ between the
two databases: an id is compared by its rank in its stream, a time by what it must equal (a half message's born_ms,
an op record's time). The last test shows that these programs tell apart batches wrong in the ways a bulk rewrite
can be: no overlay for a transaction repeated in a batch (two half messages, a message published twice), a sloppy
one (DUPLICATE for a conflict or another group), a wake per prepare, an immunity ignored, remarks kept or dropped,
checks and requests left behind, calls reordered."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from redis_txmq.core.keys import SCHEDULE, TopicKeys
from redis_txmq.core.scripts import register_topic_script

pytestmark = pytest.mark.real

KEYS = TopicKeys("orders")
TXIDS = ("t0", "t1", "t2", "t3")
OP_MAXLEN = "1000"
"""Far above the op records a program writes: the approximate trim never drops one."""
CHECKED_AT = 4_000_000_000_000
"""The next check a simulated check schedules: a fixed time, the same in both databases."""
DATABASES = (1, 2)
"""The logical databases of the session's server the test owns: one by one, batched."""
_IDS = re.compile(r"\b\d+-\d+\b")


@dataclass(frozen=True)
class Prepare:
    """One prepare_half call; ``parent`` is sent only in a step of width 10."""

    txid: str
    group: str
    partition: str
    body: bytes
    keys: str
    tags: str
    properties: str
    immunity: str
    parent: str

    def args(self, width: int) -> list[Any]:
        args = [self.txid, self.group, KEYS.topic, self.partition, self.body, self.keys, self.tags, self.properties]
        return [*args, self.immunity, self.parent][:width]


@dataclass(frozen=True)
class End:
    """One end_transaction call. ``txid`` '@k' is the k-th transaction in flight at the step's start (in id order;
    TXIDS[k] when fewer are), so that most ends meet one. ``half`` is the expected half id: '' none, 'own' the
    transaction's half at the step's start, 'other' another transaction's."""

    txid: str
    group: str
    outcome: str
    source: str
    remark: str
    window: str
    half: str


@dataclass(frozen=True)
class Step:
    """One batch: prepares (width 9 or 10, the schedule passed as KEYS[14] or not) or ends (width 8)."""

    calls: tuple[Prepare, ...] | tuple[End, ...]
    width: int
    scheduled: bool = False

    @property
    def prepares(self) -> bool:
        return isinstance(self.calls[0], Prepare)

    @property
    def keys(self) -> list[str]:
        return KEYS.scheduled_script_keys() if self.prepares and self.scheduled else KEYS.script_keys()


@dataclass(frozen=True)
class Check:
    """A check the checker counted (as claim_checks leaves it), with a pending check request or not, of the
    ``pick``-th transaction in flight (in id order; none when nothing is in flight)."""

    pick: int
    request: bool


@dataclass(frozen=True)
class Bury:
    """The transaction id is in the dead letters (as a burial leaves it), when it is not in flight."""

    txid: str


Item = Step | Check | Bury


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, list | tuple):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        return {_decode(k): _decode(v) for k, v in value.items()}
    return value


def _call(script: Any, keys: list[str], args: list[Any]) -> Any:
    """The script's reply, or the error it raised (compared like a reply)."""
    try:
        return script(keys=keys, args=args)
    except redis.ResponseError as error:
        return error


def _id_order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


class Side:
    """One database: runs a program's steps and reads its state back in a form comparable with the other's."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.prepare = register_topic_script(client, "prepare_half")
        self.end = register_topic_script(client, "end_transaction")
        self.prepares = register_topic_script(client, "prepare_halves")
        self.ends = register_topic_script(client, "end_transactions")
        self.known: dict[str, set[str]] = {"half": set(), "topic": set()}

    def reset(self) -> None:
        self.client.flushdb()
        self.known = {"half": set(), "topic": set()}

    def label(self, stream: str, entry_id: str) -> str:
        """An entry id as its rank in its stream (ids only grow): the same in both databases when they agree."""
        if entry_id not in self.known[stream]:
            return entry_id
        return f"{stream}#{sorted(self.known[stream], key=_id_order).index(entry_id)}"

    def arguments(self, step: Step) -> list[list[Any]]:
        """Each call's ARGV, expected half ids taken from this database at the step's start."""
        if step.prepares:
            return [call.args(step.width) for call in step.calls if isinstance(call, Prepare)]
        inflight: dict[str, str] = _decode(self.client.hgetall(KEYS.inflight))
        calls = []
        for end in step.calls:
            assert isinstance(end, End)
            txid = end.txid
            if txid.startswith("@"):
                k = int(txid[1:])
                txid = sorted(inflight)[k % len(inflight)] if inflight else TXIDS[k]
            half = ""
            if end.half == "own":
                half = inflight.get(txid, "")
            elif end.half == "other":
                half = next((inflight[t] for t in TXIDS if t != txid and t in inflight), "0-1")
            calls.append([txid, end.group, end.outcome, end.source, end.remark, end.window, OP_MAXLEN, half])
        return calls

    def one_by_one(self, step: Step, calls: list[list[Any]]) -> tuple[list[Any], int | None, float | None]:
        """Replies of the calls sent one at a time, and the last call that woke the topic with its score (a prepare
        and its look at the schedule in one round trip)."""
        replies: list[Any] = []
        waker, score = None, None
        for i, args in enumerate(calls):
            if not step.prepares:
                replies.append(_call(self.end, step.keys, args))
                continue
            pipe = self.client.pipeline(transaction=False)
            self.prepare(keys=step.keys, args=args, client=pipe)
            pipe.zscore(SCHEDULE, KEYS.topic_stream)
            pipe.delete(SCHEDULE)
            reply, woke, _ = pipe.execute(raise_on_error=False)
            replies.append(reply)
            if woke is not None:
                waker, score = i, woke
        return replies, waker, score

    def take_schedule(self) -> float | None:
        """The topic's score in the schedule, which is then cleared: the scripts only write it."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zscore(SCHEDULE, KEYS.topic_stream)
        pipe.delete(SCHEDULE)
        return pipe.execute()[0]

    def mutate(self, item: Check | Bury, position: int) -> None:
        inflight: list[str] = sorted(_decode(self.client.hkeys(KEYS.inflight)))
        if isinstance(item, Check) and inflight:
            txid = inflight[item.pick % len(inflight)]
            self.client.zrem(KEYS.unchecked, txid)
            self.client.zadd(KEYS.due, {txid: CHECKED_AT + position})
            self.client.hincrby(KEYS.checks, txid, 1)
            if item.request:
                self.client.hset(KEYS.check_requests, txid, f"9-{position}")
        elif isinstance(item, Bury) and item.txid not in inflight:
            self.client.hset(KEYS.dead_index, item.txid, f"8-{position}")

    def observe(self, step: Step, replies: list[Any], waker: int | None, score: float | None) -> dict[str, Any]:
        """Replies, state and wake of the step just run, with ids as ranks and times as what they must equal."""
        pipe = self.client.pipeline(transaction=False)
        for stream in (KEYS.half_stream, KEYS.topic_stream, KEYS.op_stream, KEYS.dead_stream):
            pipe.xrange(stream)
        for name in (KEYS.inflight, KEYS.ended, KEYS.checks, KEYS.remarks, KEYS.dead_index, KEYS.check_requests):
            pipe.hgetall(name)
        for name in (KEYS.ended_at, KEYS.unchecked, KEYS.due):
            pipe.zrange(name, 0, -1, withscores=True)
        pipe.keys("*")
        (
            half,
            topic,
            ops,
            dead,
            inflight,
            ended,
            checks,
            remarks,
            dead_index,
            requests,
            ended_at,
            unchecked,
            due,
            keys,
        ) = _decode(pipe.execute())
        halves: dict[str, dict[str, str]] = dict(half)
        records = {txid: record.split("|") for txid, record in ended.items()}
        answers = [r if isinstance(r, Exception) else _decode(r) for r in replies]

        self.known["half"].update(halves, inflight.values(), (r[2] for r in records.values() if len(r) > 2))
        self.known["half"].update(f.get("half_id", "") for _, f in ops)
        self.known["topic"].update((i for i, _ in topic), (f.get("committed_id", "") for _, f in ops))
        self.known["topic"].update(r[1] for r in records.values() if len(r) > 1)
        for answer in answers:
            if isinstance(answer, list) and answer and answer[0] == "OK":
                if step.prepares and len(answer) > 1:
                    self.known["half"].add(answer[1])
                elif len(answer) > 3:
                    self.known["half"].add(answer[2])
                    self.known["topic"].add(answer[3])
        self.known = {stream: {i for i in ids if _IDS.fullmatch(i)} for stream, ids in self.known.items()}

        def born(half_id: str) -> str | None:
            return halves.get(half_id, {}).get("born_ms")

        def reply(answer: Any) -> Any:
            if isinstance(answer, Exception):
                return ["raised", _IDS.sub(lambda m: self.label("half", m[0]), str(answer))]
            if not isinstance(answer, list) or not answer:
                return ["not a reply", repr(answer)]
            if answer[0] != "OK":
                return [_IDS.sub(lambda m: self.label("half", m[0]), a) if isinstance(a, str) else a for a in answer]
            if step.prepares:
                wake = answer[4:5]
                if wake and wake[0]:
                    wake = ["its born_ms" if wake[0] == born(answer[1]) else "another time"]
                return [answer[0], self.label("half", answer[1]), *answer[2:4], *wake]
            return [*answer[:2], self.label("half", answer[2]), self.label("topic", answer[3]), *answer[4:]]

        woken = "not woken"
        if score is not None:
            woken = "woken by no call"
            waking: Any = answers[waker] if waker is not None and waker < len(answers) else None
            if _ok(waking, "NEW"):
                at = "its born_ms" if f"{int(score)}" == born(waking[1]) else "another time"
                woken = f"woken by call {waker} at {at}"

        def in_flight_half(txid: str) -> dict[str, str]:
            return halves.get(inflight.get(txid, ""), {})

        def ended_time(txid: str, at: float) -> str:
            record = records.get(txid, [])
            op_ids = [i for i, f in ops if f.get("transaction_id") == txid and record[2:3] == [f.get("half_id")]]
            return "its op record's time" if [f"{int(at)}"] == [i.split("-")[0] for i in op_ids] else "another time"

        def unchecked_time(txid: str, at: float) -> str:
            return "its born_ms" if f"{int(at)}" == in_flight_half(txid).get("born_ms") else "another time"

        def due_time(txid: str, at: float) -> str:
            fields = in_flight_half(txid)
            immunity = fields.get("check_immunity_ms")
            if immunity and f"{int(at)}" == f"{int(fields.get('born_ms', '0')) + int(immunity)}":
                return "born_ms + check_immunity_ms"
            return f"{int(at)}" if int(at) >= CHECKED_AT else "another time"

        def record(parts: list[str]) -> str:
            if len(parts) != 4:
                return "|".join(parts)
            state, committed, half_id, group = parts
            return f"{state}|{self.label('topic', committed)}|{self.label('half', half_id)}|{group}"

        def op_record(fields: dict[str, str]) -> dict[str, str]:
            labelled = {"half_id": self.label("half", fields.get("half_id", ""))}
            return {**fields, **labelled, "committed_id": self.label("topic", fields.get("committed_id", ""))}

        return {
            "replies": [reply(a) for a in answers],
            "schedule": woken,
            "half stream": [
                (
                    self.label("half", i),
                    {k: v for k, v in f.items() if k != "born_ms"},
                    f.get("born_ms", "").isdigit(),
                )
                for i, f in halves.items()
            ],
            "topic stream": [(self.label("topic", i), f) for i, f in topic],
            "op stream": [op_record(f) for _, f in ops],
            "dead stream": [f for _, f in dead],
            "inflight": {txid: self.label("half", half_id) for txid, half_id in inflight.items()},
            "ended": {txid: record(parts) for txid, parts in records.items()},
            "ended_at": {txid: ended_time(txid, at) for txid, at in ended_at},
            "unchecked": {txid: unchecked_time(txid, at) for txid, at in unchecked},
            "due": {txid: due_time(txid, at) for txid, at in due},
            "checks": checks,
            "remarks": remarks,
            "dead_index": dead_index,
            "requests": requests,
            "keys": sorted(keys),
        }


Batch = Callable[[Side, Step, list[list[Any]]], list[Any]]


def batch_scripts(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """The batch scripts: one call of prepare_halves / end_transactions for the whole step."""
    script = side.prepares if step.prepares else side.ends
    return script(keys=step.keys, args=[step.width, *(arg for call in calls for arg in call)])


def first_difference(sides: tuple[Side, Side], program: list[Item], batch: Batch) -> str | None:
    """Runs ``program`` one call at a time on the first side and batch by batch (``batch``) on the second; what first
    differs after a step, or None."""
    one, many = sides
    for side in sides:
        side.reset()
    for position, item in enumerate(program):
        if not isinstance(item, Step):
            for side in sides:
                side.mutate(item, position)
            continue
        replies, waker, score = one.one_by_one(item, one.arguments(item))
        expected = one.observe(item, replies, waker, score)
        try:
            batched = batch(many, item, many.arguments(item))
        except redis.ResponseError as error:
            batched = [error]
        got = many.observe(item, batched, waker, many.take_schedule())
        differences = [
            f"  {name}:\n    one by one {expected.get(name)!r}\n    batched    {got.get(name)!r}"
            for name in expected.keys() | got.keys()
            if expected.get(name) != got.get(name)
        ]
        if differences:
            return f"after step {position} ({item}):\n" + "\n".join(sorted(differences))
    return None


def _weighted(*choices: tuple[Any, int]) -> st.SearchStrategy[Any]:
    """One of the values of ``choices`` (value, weight): bad arguments and dead letters rare enough that most calls
    reach a transaction's state."""
    return st.sampled_from([value for value, weight in choices for _ in range(weight)])


def _prepares() -> st.SearchStrategy[Prepare]:
    return st.builds(
        Prepare,
        txid=_weighted(*((t, 6) for t in TXIDS), ("", 1)),
        group=_weighted(("g1", 4), ("g2", 1)),
        partition=_weighted(("0", 14), ("x", 1)),
        body=st.binary(max_size=4),
        keys=st.sampled_from(("", "k1 k2")),
        tags=st.sampled_from(("", "tag")),
        properties=st.sampled_from(("", '{"p":"v"}')),
        immunity=_weighted(("", 8), ("5000", 1), ("250", 1), ("0", 1)),
        parent=st.sampled_from(("", "parent")),
    )


def _ends() -> st.SearchStrategy[End]:
    return st.builds(
        End,
        txid=_weighted(*((f"@{k}", 4) for k in range(len(TXIDS))), *((t, 2) for t in TXIDS), ("", 1)),
        group=_weighted(("g1", 4), ("g2", 1)),
        outcome=_weighted(("COMMIT", 4), ("ROLLBACK", 3), ("UNKNOWN", 4), ("MAYBE", 1)),
        source=st.sampled_from(("producer", "checker")),
        remark=_weighted(("", 1), ("r1", 2), ("r2", 1)),
        window=_weighted(("60000", 5), ("0", 4), ("-1", 1)),
        half=_weighted(("", 5), ("own", 4), ("other", 1)),
    )


def _calls(call: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    """1 to 12 calls, often two or three of one transaction in a row: a repeat inside one batch, as the same call
    again, another outcome, another group, a remark then an end."""
    runs = st.lists(call, min_size=2, max_size=3).map(lambda run: [replace(one, txid=run[0].txid) for one in run])
    groups = st.lists(st.one_of(call.map(lambda one: [one]), runs), min_size=1, max_size=4)
    return groups.map(lambda calls: tuple(one for group in calls for one in group))


_PREPARE_STEPS = st.builds(
    Step,
    calls=_calls(_prepares()),
    width=st.sampled_from((9, 10)),
    scheduled=st.booleans(),
)
_END_STEPS = st.builds(Step, calls=_calls(_ends()), width=st.just(8))
_CHECKS = st.builds(Check, pick=st.integers(0, len(TXIDS) - 1), request=st.booleans())
_BURIES = st.builds(Bury, txid=st.sampled_from(TXIDS))
_ITEMS = _weighted((_PREPARE_STEPS, 4), (_END_STEPS, 5), (_CHECKS, 2), (_BURIES, 1)).flatmap(lambda item: item)
PROGRAMS = st.builds(lambda first, rest: [first, *rest], _PREPARE_STEPS, st.lists(_ITEMS, min_size=2, max_size=12))
"""A prepare step first, then steps, checks and dead letters."""
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def sides(redis_url: str) -> Iterator[tuple[Side, Side]]:
    """Clients of two logical databases of the session's server: one by one, batched."""
    url = urlsplit(redis_url)
    clients = [redis.Redis.from_url(url._replace(path=f"/{db}").geturl()) for db in DATABASES]
    yield Side(clients[0]), Side(clients[1])
    for client in clients:
        client.flushdb()
        client.close()


@SETTINGS
@given(program=PROGRAMS)
def test_a_batch_gives_the_replies_and_state_of_its_calls_one_by_one(
    sides: tuple[Side, Side], program: list[Item]
) -> None:
    difference = first_difference(sides, program, batch_scripts)
    assert difference is None, difference


# Batches wrong in the ways a rewrite with bulk commands can be; each is built from the real scripts.


def _entry(side: Side, stream: str, entry_id: bytes) -> dict[Any, Any]:
    """The fields of one stream entry."""
    entries: Any = side.client.xrange(stream, entry_id, entry_id)
    return entries[0][1]


def _ok(reply: Any, kind: str | bytes) -> bool:
    """An OK reply of a NEW prepare or an APPLIED end (text or bytes)."""
    ok = b"OK" if isinstance(kind, bytes) else "OK"
    return isinstance(reply, list) and len(reply) > 4 and reply[0] == ok and kind in reply[3:5]


def prepares_without_overlay(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """The in-flight index read once for the batch: a transaction prepared twice in it gets two half messages."""
    if not step.prepares:
        return batch_scripts(side, step, calls)
    before = dict(zip([c[0] for c in calls], side.client.hmget(KEYS.inflight, [c[0] for c in calls]), strict=True))
    replies = []
    for args in calls:
        if args[0] and before[args[0]] is None:
            side.client.hdel(KEYS.inflight, args[0])
        replies.append(_call(side.prepare, step.keys, args))
    return replies


def ends_without_overlay(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """Half messages read once for the batch: a transaction committed twice in it is published twice."""
    if step.prepares:
        return batch_scripts(side, step, calls)
    applied: dict[str, list[Any]] = {}
    replies = []
    for args in calls:
        earlier = applied.get(args[0])
        if earlier is not None and args[2] == "COMMIT" and earlier[1] == b"COMMIT":
            published = side.client.xadd(KEYS.topic_stream, _entry(side, KEYS.topic_stream, earlier[3]))
            replies.append([*earlier[:3], published, *earlier[4:]])
            continue
        reply = _call(side.end, step.keys, args)
        if _ok(reply, b"APPLIED"):
            applied[args[0]] = reply
        replies.append(reply)
    return replies


def sloppy_overlay(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """A transaction ended earlier in the batch answers DUPLICATE, whatever its group, outcome and window."""
    replies = batch_scripts(side, step, calls)
    if step.prepares:
        return replies
    first: dict[str, list[Any]] = {}
    for i, args in enumerate(calls):
        if args[0] in first:
            replies[i] = [*first[args[0]][:4], b"DUPLICATE", b""]
        elif _ok(replies[i], b"APPLIED"):
            first[args[0]] = replies[i]
    return replies


def every_prepare_wakes(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """`unchecked` read once for the batch: every new prepare into an empty one replies a wake. Only where the
    schedule is not passed: where it is, the wrong wake shows only as the schedule's score, the same when the
    prepares are born in the same millisecond, and ``find`` wants a difference it can see again."""
    if not step.prepares or step.scheduled:
        return batch_scripts(side, step, calls)
    empty = side.client.exists(KEYS.unchecked) == 0
    replies = []
    for args in calls:
        reply = _call(side.prepare, step.keys, args)
        if empty and _ok(reply, b"NEW") and reply[4] == b"":
            reply = [*reply[:4], _entry(side, KEYS.half_stream, reply[1])[b"born_ms"]]
        replies.append(reply)
    return replies


def immunity_ignored(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """A new half message with its own check immunity indexed in `unchecked`, as one without."""
    replies = batch_scripts(side, step, calls)
    if step.prepares:
        for args, answer in zip(calls, replies, strict=True):
            if args[8] and _ok(answer, b"NEW") and side.client.zrem(KEYS.due, args[0]):
                side.client.zadd(KEYS.unchecked, {args[0]: int(_entry(side, KEYS.half_stream, answer[1])[b"born_ms"])})
    return replies


def remarks_kept(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """A retired transaction's remark always stays, also past the dedupe window or after a check."""
    if step.prepares:
        return batch_scripts(side, step, calls)
    replies = []
    for args in calls:
        remark = side.client.hget(KEYS.remarks, args[0])
        replies.append(_call(side.end, step.keys, args))
        if remark is not None:
            side.client.hsetnx(KEYS.remarks, args[0], remark)
    return replies


def remarks_dropped(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """A retired transaction's remark always goes, also a never-checked one's within the dedupe window."""
    replies = batch_scripts(side, step, calls)
    for args, answer in zip(calls, replies, strict=True):
        if _ok(answer, b"APPLIED"):
            side.client.hdel(KEYS.remarks, args[0])
    return replies


def checked_path_skipped(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """A retired transaction is taken for never checked: its check count, next check and request stay."""
    before = (side.client.hgetall(KEYS.checks), side.client.hgetall(KEYS.check_requests))
    due: Any = side.client.zrange(KEYS.due, 0, -1, withscores=True)
    replies = batch_scripts(side, step, calls)
    for name, entries in zip((KEYS.checks, KEYS.check_requests), before, strict=True):
        for txid, value in entries.items():
            side.client.hsetnx(name, txid, value)
    if due:
        side.client.zadd(KEYS.due, dict(due), nx=True)
    return [[*r[:5], b""] if _ok(r, b"APPLIED") else r for r in replies]


def reordered(side: Side, step: Step, calls: list[list[Any]]) -> list[Any]:
    """The calls of a batch applied last to first."""
    return batch_scripts(side, step, calls[::-1])[::-1]


@pytest.mark.parametrize(
    "wrong",
    [
        prepares_without_overlay,
        ends_without_overlay,
        sloppy_overlay,
        every_prepare_wakes,
        immunity_ignored,
        remarks_kept,
        remarks_dropped,
        checked_path_skipped,
        reordered,
    ],
    ids=lambda f: f.__name__,
)
def test_the_comparison_tells_a_wrong_batch_from_its_calls_one_by_one(sides: tuple[Side, Side], wrong: Batch) -> None:
    """The programs the test above draws find each of these wrong batches out."""
    search = settings(SETTINGS, max_examples=300, phases=[Phase.generate])
    program = find(PROGRAMS, lambda p: first_difference(sides, p, wrong) is not None, settings=search)
    assert first_difference(sides, program, wrong) is not None
