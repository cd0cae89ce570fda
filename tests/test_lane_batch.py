"""The asyncio lane sends the prepares, and the ends, of one topic partition that are in flight together as one call
of ``lua/prepare_halves.lua`` / ``lua/end_transactions.lua``: each caller still gets its own reply or its own error,
each transaction is prepared once and ends exactly once, through duplicates, a bad argument, a refused topic stream,
a failed command inside one prepare or end, NOSCRIPT, a connection dropped mid-batch and a durability level that
falls short; a batch of prepares wakes the topic in the checkers' schedule as the prepares one by one would. Against
a real Redis."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
import redis
import redis.asyncio

from redis_txmq import LocalTransactionState, Message
from redis_txmq.asyncio import TransactionListener, TransactionProducer
from redis_txmq.asyncio.broker import AsyncRedisBroker
from redis_txmq.asyncio.lane import MAX_ENDS_PER_CALL, MAX_PREPARES_PER_CALL, ScriptLane
from redis_txmq.core.batching import spread
from redis_txmq.core.durability import Durability
from redis_txmq.core.errors import CorruptEntryError, DurabilityError, PrepareError, TransactionConflictError, TxMQError
from redis_txmq.core.keys import SCHEDULE, TopicKeys
from redis_txmq.core.protocol import EndResult, EndSource, PrepareResult
from redis_txmq.core.scripts import register_topic_script, script_text, topic_preludes
from redis_txmq.core.topics import create_topic, partition_keys_of
from redis_txmq.sync.broker import RedisBroker

from .replicas import replicated_fixture  # noqa: F401 - the fixture 'replicated'

pytestmark = pytest.mark.real

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
GROUP = "batch_group"


class Arg(TransactionListener):
    """The local transaction's outcome is the send's ``arg``."""

    async def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return arg

    async def check_local_transaction(self, message: Message) -> Any:
        return None


def watch_batches(lane: ScriptLane, kind: str = "ends") -> list[tuple[str, int]]:
    """``(topic stream, calls carried)`` of every ``end_transactions`` (``kind`` "ends") or ``prepare_halves``
    ("prepares") call the lane writes from now on."""
    seen: list[tuple[str, int]] = []
    coalesce = lane._coalesce
    (many,) = (lane._end_batches if kind == "ends" else lane._prepare_batches).values()

    def watching(batch: Any) -> Any:
        calls, spans = coalesce(batch)
        seen.extend((keys[3], (len(args) - 1) // args[0]) for script, keys, args in calls if script is many)
        return calls, spans

    lane._coalesce = watching
    return seen


def assert_ended_once(client: redis.Redis, keys: TopicKeys, outcomes: dict[str, str]) -> None:
    """Every transaction of ``outcomes`` (id -> COMMIT / ROLLBACK) ended once, with that outcome, and left nothing
    in flight: its message in the topic stream exactly once for COMMIT, never for ROLLBACK, one op record each."""
    in_topic = collections.Counter(fields[b"transaction_id"].decode() for _, fields in client.xrange(keys.topic_stream))
    assert in_topic == collections.Counter(t for t, outcome in outcomes.items() if outcome == "COMMIT")
    records = [(f[b"transaction_id"].decode(), f[b"outcome"].decode()) for _, f in client.xrange(keys.op_stream)]
    assert sorted(records) == sorted(outcomes.items())
    assert client.xlen(keys.half_stream) == 0 and client.hlen(keys.inflight) == 0


def outcome_of(i: int) -> LocalTransactionState:
    return ROLLBACK if i % 3 == 0 else COMMIT


def test_sends_in_flight_together_end_in_one_call_and_each_exactly_once(real_client, redis_url):
    count = 2 * MAX_ENDS_PER_CALL + 32  # more than one batch call's worth

    async def scenario() -> tuple[list[Any], list[tuple[str, int]]]:
        async with TransactionProducer(GROUP, Arg(), redis_url=redis_url) as producer:
            seen = watch_batches(producer.broker.runner._lane)
            real_client.config_resetstat()
            messages = [Message("orders", b"%d" % i) for i in range(count)]
            return await asyncio.gather(
                *(producer.send_message_in_transaction(m, outcome_of(i)) for i, m in enumerate(messages))
            ), seen

    results, seen = asyncio.run(scenario())
    keys = TopicKeys("orders")
    assert [r.local_transaction_state for r in results] == [outcome_of(i) for i in range(count)]
    assert all((r.committed_id is not None) == (outcome_of(i) == COMMIT) for i, r in enumerate(results))
    assert not [r.end_error for r in results if r.end_error]
    assert_ended_once(real_client, keys, {r.transaction_id: outcome_of(i).value for i, r in enumerate(results)})
    assert sum(ends for _, ends in seen) > count // 2, "most ends went out in batch calls"
    assert max(ends for _, ends in seen) <= MAX_ENDS_PER_CALL and {stream for stream, _ in seen} == {"orders"}
    assert real_client.info("commandstats")["cmdstat_evalsha"]["calls"] < 1.5 * count


def test_ends_to_several_topics_and_partitions_are_batched_per_partition(real_client, redis_url):
    create_topic(real_client, "parted", 4)
    messages = [
        (Message("parted", b"%d" % i, keys=f"key-{i}") if i % 2 else Message(("orders", "audit")[i % 4 // 2], b"x"))
        for i in range(160)
    ]

    async def scenario() -> tuple[list[Any], list[tuple[str, int]]]:
        async with TransactionProducer(GROUP, Arg(), redis_url=redis_url) as producer:
            seen = watch_batches(producer.broker.runner._lane)
            sends = (producer.send_message_in_transaction(m, outcome_of(i)) for i, m in enumerate(messages))
            return await asyncio.gather(*sends), seen

    results, seen = asyncio.run(scenario())
    assert not [r.end_error for r in results if r.end_error]
    every = [*partition_keys_of("parted", 4), TopicKeys("orders"), TopicKeys("audit")]
    for keys in every:
        outcomes = {
            r.transaction_id: outcome_of(i).value
            for i, r in enumerate(results)
            if r.topic == keys.topic and r.partition == keys.partition
        }
        assert outcomes, keys
        assert_ended_once(real_client, keys, outcomes)
    streams = {stream for stream, _ in seen}
    assert len(streams) > 2 and streams <= {keys.topic_stream for keys in every}


async def _prepared(broker: AsyncRedisBroker, keys: TopicKeys, count: int, tag: str) -> list[str]:
    ids = [f"{tag}-{i}" for i in range(count)]
    await asyncio.gather(*(broker.prepare_half(keys, Message(keys.topic, b"body"), t, GROUP) for t in ids))
    return ids


def _end(broker: AsyncRedisBroker, keys: TopicKeys, txid: str, outcome: LocalTransactionState, remark: str = ""):
    return broker.end_transaction(keys, txid, GROUP, outcome, source=EndSource.PRODUCER, remark=remark or None)


def _broker_scenario(redis_url: str, body: Any) -> Any:
    return _broker_scenario_of(redis_url, body, "ends")


def _broker_scenario_of(redis_url: str, body: Any, kind: str) -> Any:
    """``body(broker, seen)`` on a broker of its own, ``seen`` the lane's batch calls of ``kind`` (ends, prepares)."""

    async def run() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        broker = AsyncRedisBroker(client)
        try:
            return await body(broker, watch_batches(broker.runner._lane, kind))
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_a_transaction_ended_twice_in_one_batch_applies_once(real_client, redis_url):
    keys = TopicKeys("orders")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        t = await _prepared(broker, keys, 10, "dup")
        ends = [(t[0], COMMIT), (t[0], COMMIT), (t[1], ROLLBACK), (t[1], ROLLBACK), (t[2], COMMIT), (t[2], ROLLBACK)]
        ends += [(txid, COMMIT) for txid in t[3:]] + [(t[3], UNKNOWN)]
        replies = await asyncio.gather(*(_end(broker, keys, txid, o) for txid, o in ends), return_exceptions=True)
        return t, replies, seen

    t, replies, seen = _broker_scenario(redis_url, body)
    assert seen == [(keys.topic_stream, 14)], "one call for every end"
    first, again = replies[0], replies[1]
    assert isinstance(first, EndResult) and isinstance(again, EndResult)
    assert first.applied and not again.applied and first.committed_id == again.committed_id is not None
    assert replies[2].applied and not replies[3].applied and replies[3].state == "ROLLBACK"
    assert replies[4].applied and isinstance(replies[5], TransactionConflictError)
    assert all(isinstance(r, EndResult) and r.applied for r in replies[6:13])
    assert isinstance(replies[13], EndResult) and replies[13].state == "COMMIT" and not replies[13].applied
    assert_ended_once(real_client, keys, {txid: ("ROLLBACK" if txid == t[1] else "COMMIT") for txid in t})


def test_a_refused_topic_stream_fails_its_commits_only_and_they_stay_in_flight(real_client, redis_url):
    refused, fine = TopicKeys("refused"), TopicKeys("fine")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        a, b = await _prepared(broker, refused, 8, "a"), await _prepared(broker, fine, 8, "b")
        real_client.set(refused.topic_stream, "not a stream")
        ends = [pair for i in range(8) for pair in ((refused, a[i], outcome_of(i + 1)), (fine, b[i], COMMIT))]
        replies = await asyncio.gather(*(_end(broker, k, txid, o) for k, txid, o in ends), return_exceptions=True)
        in_flight = real_client.hlen(refused.inflight)
        real_client.delete(refused.topic_stream)
        again = await asyncio.gather(
            *(_end(broker, refused, txid, COMMIT) for k, txid, o in ends if k is refused and o == COMMIT)
        )
        return a, b, ends, replies, in_flight, again, seen

    a, b, ends, replies, in_flight, again, seen = _broker_scenario(redis_url, body)
    assert sorted(seen[:2]) == [(fine.topic_stream, 8), (refused.topic_stream, 8)]
    for (keys, _, outcome), reply in zip(ends, replies, strict=True):
        if keys is refused and outcome == COMMIT:
            assert isinstance(reply, CorruptEntryError) and "holds another type" in str(reply)
        else:
            assert isinstance(reply, EndResult) and reply.applied and reply.state == outcome.value
    commits = [txid for i, txid in enumerate(a) if outcome_of(i + 1) == COMMIT]
    assert in_flight == len(commits), "a refused commit keeps its transaction in flight"
    assert all(r.applied for r in again)
    assert_ended_once(real_client, fine, dict.fromkeys(b, "COMMIT"))
    assert_ended_once(real_client, refused, {txid: outcome_of(i + 1).value for i, txid in enumerate(a)})


def test_a_command_failing_inside_one_end_fails_that_end_only(real_client, redis_url):
    """The remark of an UNKNOWN answer goes to a key of another type: that HSET fails inside the batch; pcall keeps
    the error to that end's reply and the ends after it still apply."""
    keys = TopicKeys("orders")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        t = await _prepared(broker, keys, 6, "cmd")
        real_client.set(keys.remarks, "not a hash")
        ends = [_end(broker, keys, t[0], COMMIT), _end(broker, keys, t[1], UNKNOWN, "later")]
        ends += [_end(broker, keys, txid, COMMIT) for txid in t[2:]]
        return t, await asyncio.gather(*ends, return_exceptions=True), seen

    t, replies, seen = _broker_scenario(redis_url, body)
    assert seen == [(keys.topic_stream, 6)]
    assert isinstance(replies[1], TxMQError) and "WRONGTYPE" in str(replies[1])
    assert all(isinstance(r, EndResult) and r.applied for i, r in enumerate(replies) if i != 1)
    assert real_client.hkeys(keys.inflight) == [t[1].encode()]
    committed = [fields[b"transaction_id"].decode() for _, fields in real_client.xrange(keys.topic_stream)]
    assert committed == [t[0], *t[2:]]


def test_a_remembered_outcome_refused_after_the_ends_leaves_them_published_once_and_retired(real_client):
    """`ended` holds another type (written over by another tool): the batch's write of the remembered outcomes,
    made after its ends, is refused. The ends are still retired, so each is published once: a repeat finds it no
    longer in flight (and is refused reading `ended`) instead of publishing it again, as it would if the batch
    stopped at the refused write."""
    keys = TopicKeys("orders")
    prepare = register_topic_script(real_client, "prepare_half")
    ends = register_topic_script(real_client, "end_transactions")
    for txid in ("a", "b"):
        prepare(keys=keys.script_keys(), args=[txid, GROUP, "orders", "0", txid.encode(), "", "", "", ""])
    real_client.set(keys.ended, "not a hash")
    args = [8, "a", GROUP, "COMMIT", "producer", "", 0, 1000, ""]  # a not remembered (window 0), b remembered
    args += ["b", GROUP, "COMMIT", "producer", "", 60_000, 1000, ""]
    first = ends(keys=keys.script_keys(), args=args)
    assert [reply[4] for reply in first] == [b"APPLIED", b"APPLIED"]
    again = ends(keys=keys.script_keys(), args=args)
    assert all(isinstance(reply, redis.ResponseError) and "WRONGTYPE" in str(reply) for reply in again)
    assert [fields[b"body"] for _, fields in real_client.xrange(keys.topic_stream)] == [b"a", b"b"]
    assert real_client.hlen(keys.inflight) == 0 and real_client.xlen(keys.half_stream) == 0


def test_remembered_outcomes_of_another_type_fail_only_the_prepares_that_read_them(real_client):
    """`ended` holds another type: a repeat of a prepare in flight is still a DUPLICATE, and a new prepare fails
    reading `ended`, as each would alone (the call's one read of `ended` is refused without failing the call)."""
    keys = TopicKeys("orders")
    prepares = register_topic_script(real_client, "prepare_halves")
    first = prepares(keys=keys.script_keys(), args=[9, "a", GROUP, "orders", "0", b"a", "", "", "", ""])
    real_client.set(keys.ended, "not a hash")
    args: list[Any] = [9, "a", GROUP, "orders", "0", b"a", "", "", "", "", "b", GROUP, "orders", "0", b"b"]
    again, new = prepares(keys=keys.script_keys(), args=[*args, "", "", "", ""])
    assert again[1] == first[0][1] and again[3] == b"DUPLICATE"
    assert isinstance(new, redis.ResponseError) and "WRONGTYPE" in str(new)


def test_an_index_write_refused_after_the_prepares_fails_the_prepares_it_was_for(real_client):
    """`unchecked` holds another type: the batch's write into it, made after its prepares, is refused; the prepares
    that were to be indexed there get that error (as each would alone), and one with its own immunity (indexed in
    `due`) keeps its reply, and its wake."""
    keys = TopicKeys("orders")
    prepares = register_topic_script(real_client, "prepare_halves")
    real_client.set(keys.unchecked, "not a sorted set")
    args: list[Any] = [9, "a", GROUP, "orders", "0", b"a", "", "", "", "5000", "b", GROUP, "orders", "0", b"b"]
    args += ["", "", "", ""]
    immune, plain = prepares(keys=keys.script_keys(), args=args)
    assert immune[0] == b"OK" and immune[3] == b"NEW" and immune[4] != b"", "its wake, for the caller to write"
    assert isinstance(plain, redis.ResponseError) and "WRONGTYPE" in str(plain)
    assert real_client.zrange(keys.due, 0, -1) == [b"a"]


def test_scripts_flushed_between_batches_are_loaded_again(real_client, redis_url):
    keys = TopicKeys("orders")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        outcomes = {}
        for round_ in range(3):
            real_client.script_flush()  # the first round finds no script at all: the batch one is loaded on use
            t = await _prepared(broker, keys, 20, f"flush{round_}")
            replies = await asyncio.gather(*(_end(broker, keys, txid, outcome_of(i)) for i, txid in enumerate(t)))
            assert all(r.applied for r in replies)
            outcomes.update({txid: outcome_of(i).value for i, txid in enumerate(t)})
        return outcomes, seen

    outcomes, seen = _broker_scenario(redis_url, body)
    assert seen == [(keys.topic_stream, 20)] * 3
    assert_ended_once(real_client, keys, outcomes)


@pytest.mark.parametrize("cut", ["after the first reply", "before any reply"])
def test_a_connection_dropped_mid_batch_is_sent_again_and_applies_nothing_twice(real_client, redis_url, cut):
    topics = [TopicKeys("orders"), TopicKeys("audit")]
    dropped: list[str] = []

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        ids = {keys.topic: await _prepared(broker, keys, 12, keys.topic) for keys in topics}
        pool = broker.runner._lane._pool
        get_connection = pool.get_connection

        async def dropping(*args: Any, **kwargs: Any) -> Any:
            conn = await get_connection(*args, **kwargs)
            read_response = conn.read_response

            async def read_then_drop(*args: Any, **kwargs: Any) -> Any:
                if cut == "after the first reply":
                    await read_response(*args, **kwargs)
                del conn.read_response  # once: the retry reads as usual
                await conn.disconnect()
                dropped.append(cut)
                raise redis.ConnectionError("dropped mid-batch")

            conn.read_response = read_then_drop
            pool.get_connection = get_connection
            return conn

        pool.get_connection = dropping
        ends = [_end(broker, k, txid, outcome_of(i)) for k in topics for i, txid in enumerate(ids[k.topic])]
        return ids, await asyncio.gather(*ends), seen

    ids, replies, seen = _broker_scenario(redis_url, body)
    assert dropped == [cut], "the batch was sent again after the drop"
    assert sorted(seen) == sorted((k.topic_stream, 12) for k in topics)
    assert all(isinstance(r, EndResult) for r in replies)
    for keys in topics:
        assert_ended_once(real_client, keys, {txid: outcome_of(i).value for i, txid in enumerate(ids[keys.topic])})


def test_a_durability_shortfall_gives_each_caller_its_own_reply(real_client, redis_url):
    """No replica answers the WAIT that confirms the batch: every caller learns it, each with its own end's reply."""
    keys = TopicKeys("orders")

    async def scenario() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        broker = AsyncRedisBroker(client)
        t = await _prepared(broker, keys, 8, "wait")
        lane = ScriptLane(client, durability=Durability.of("replica", replicas=1, timeout=0.05))
        seen = watch_batches(lane)
        end = register_topic_script(client, "end_transaction")
        args = [[txid, GROUP, "COMMIT", "producer", "", 60_000, 1000, ""] for txid in t]
        replies = await asyncio.gather(*(lane.call(end, keys.script_keys(), a) for a in args), return_exceptions=True)
        await client.aclose()
        return t, replies, seen

    t, replies, seen = asyncio.run(scenario())
    assert seen == [(keys.topic_stream, 8)]
    assert all(isinstance(r, DurabilityError) and len(r.replies) == 1 for r in replies)
    half_ids = [r.replies[0][2] for r in replies]
    assert len(set(half_ids)) == 8 and all(r.replies[0][4] == b"APPLIED" for r in replies)
    assert_ended_once(real_client, keys, dict.fromkeys(t, "COMMIT"))


def test_an_error_of_the_whole_batch_call_is_each_of_its_ends_error() -> None:
    refused = redis.ResponseError("OOM command not allowed")
    replies = spread([b"prepared", refused, [b"one", b"two"], [b"short"]], [0, (1, 2), (3, 4), (5, 6)], 7)
    assert replies[0] == b"prepared" and replies[1] is refused and replies[2] is refused
    assert replies[3:5] == [b"one", b"two"]
    assert all(isinstance(r, redis.ResponseError) and "2 calls" in str(r) for r in replies[5:])


def test_a_batch_of_ends_makes_two_commands_per_end_and_the_index_reads_and_writes_once(real_client) -> None:
    """The common path of a batch of ends: each end writes its topic entry and op record; the indexes are read once
    (HMGET, ZMSCORE), the half messages prepared together read ahead in one XRANGE, and the indexes written once
    (HSET, ZADD, XDEL, HDEL, ZREM) for the call."""
    keys = TopicKeys("orders")
    prepare = register_topic_script(real_client, "prepare_half")
    ends = register_topic_script(real_client, "end_transactions")
    ids = [f"nine-{i}" for i in range(20)]
    for txid in ids:
        prepare(keys=keys.script_keys(), args=[txid, GROUP, "orders", "0", b"body", "", "", "", ""])
    args: list[Any] = [8]
    for txid in ids[1:]:
        args += [txid, GROUP, "COMMIT", "producer", "", 60_000, 1000, ""]
    ends(keys=keys.script_keys(), args=[8, ids[0], GROUP, "ROLLBACK", "producer", "", 60_000, 1000, ""])  # loads it
    real_client.config_resetstat()
    replies = ends(keys=keys.script_keys(), args=args)
    assert len(replies) == 19 and all(r[0] == b"OK" and r[4] == b"APPLIED" for r in replies)
    calls = {
        name.removeprefix("cmdstat_"): stats["calls"]
        for name, stats in real_client.info("commandstats").items()
        if name not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config|resetstat")
    }
    # the sweep of expired outcomes (ZRANGEBYSCORE, XTRIM) runs in the ends whose time ends in 0 ms
    assert calls.pop("zrangebyscore", 0) == calls.pop("xtrim", 0)
    per_end = {"xadd": 2}
    once = {"hmget": 1, "zmscore": 1, "xrange": 1, "hset": 1, "zadd": 1, "xdel": 1, "hdel": 1, "zrem": 1}
    assert calls == {name: 19 * per_end.get(name, 0) + once.get(name, 0) for name in per_end | once}


def test_half_messages_far_apart_are_read_by_their_own_ends(real_client) -> None:
    """The read ahead covers at most twice as many half messages as the call has ends, from its lowest half id: an
    end whose half message lies beyond (many other transactions in flight in between) reads it itself; one whose
    half message is missing from the stream is CORRUPT, and one whose index holds no entry id fails, as alone."""
    keys = TopicKeys("orders")
    prepare = register_topic_script(real_client, "prepare_half")
    ends = register_topic_script(real_client, "end_transactions")
    ids = [f"far-{i}" for i in range(12)]
    for txid in ids:
        prepare(keys=keys.script_keys(), args=[txid, GROUP, "orders", "0", txid.encode(), "", "", "", ""])
    missing = real_client.hget(keys.inflight, ids[5])
    real_client.xdel(keys.half_stream, missing)
    real_client.hset(keys.inflight, ids[6], "not an entry id")
    args: list[Any] = [8]
    for txid in (ids[0], ids[11], ids[5], ids[1], ids[6]):
        args += [txid, GROUP, "COMMIT", "producer", "", 60_000, 1000, ""]
    ends(keys=keys.script_keys(), args=[8, "load", GROUP, "COMMIT", "producer", "", 60_000, 1000, ""])
    real_client.config_resetstat()
    first, last, corrupt, second, garbled = ends(keys=keys.script_keys(), args=args)
    assert [first[4], last[4], second[4]] == [b"APPLIED"] * 3
    assert corrupt[:2] == [b"ERR", b"CORRUPT"]
    # one read ahead (from id 0, ten entries at most: 0 .. 10 without the deleted 5), then the two beyond it read
    # alone, and the garbled one's XRANGE refused
    assert real_client.info("commandstats")["cmdstat_xrange"]["calls"] == 4
    assert isinstance(garbled, redis.ResponseError) and "Invalid stream ID" in str(garbled)
    bodies = [fields[b"body"] for _, fields in real_client.xrange(keys.topic_stream)]
    assert bodies == [b"far-0", b"far-11", b"far-1"]
    # an index shaped like an id that the server refuses: the read ahead is refused, and each end reads its own
    real_client.hset(keys.inflight, ids[6], "1-18446744073709551616")
    args = [8]
    for txid in (ids[2], ids[10], ids[6]):
        args += [txid, GROUP, "COMMIT", "producer", "", 60_000, 1000, ""]
    first, last, garbled = ends(keys=keys.script_keys(), args=args)
    assert [first[4], last[4]] == [b"APPLIED"] * 2
    assert isinstance(garbled, redis.ResponseError) and "Invalid stream ID" in str(garbled)


def test_a_half_stream_of_another_type_fails_only_the_ends_that_read_it(real_client) -> None:
    """The read ahead is refused with the half stream (written over by another tool): a repeat of an applied end
    and an end of an unknown transaction keep their replies, as alone."""
    keys = TopicKeys("orders")
    prepare = register_topic_script(real_client, "prepare_half")
    ends = register_topic_script(real_client, "end_transactions")
    for txid in ("done", "live"):
        prepare(keys=keys.script_keys(), args=[txid, GROUP, "orders", "0", b"x", "", "", "", ""])
    ends(keys=keys.script_keys(), args=[8, "done", GROUP, "COMMIT", "producer", "", 60_000, 1000, ""])
    real_client.delete(keys.half_stream)
    real_client.set(keys.half_stream, "not a stream")
    args: list[Any] = [8]
    for txid in ("done", "never", "live"):
        args += [txid, GROUP, "COMMIT", "producer", "", 60_000, 1000, ""]
    done, never, live = ends(keys=keys.script_keys(), args=args)
    assert done[4] == b"DUPLICATE" and never[:2] == [b"ERR", b"NOT_FOUND"]
    assert isinstance(live, redis.ResponseError) and "WRONGTYPE" in str(live)


def test_a_refused_sweep_of_expired_outcomes_leaves_the_ends_applied_once(real_client) -> None:
    """`ended` holds another type: the sweep of outcomes past the window (asked for by an end whose time ends in
    0 ms) is refused. It runs after the ends are retired, so none stays in flight to be published again."""
    keys = TopicKeys("orders")
    prepares = register_topic_script(real_client, "prepare_halves")
    ends = register_topic_script(real_client, "end_transactions")
    swept, count = False, 0
    while not swept and count < 5000:  # until an end's op record falls on a millisecond ending in 0
        batch = [f"sweep-{count + i}" for i in range(4)]
        count += len(batch)
        args: list[Any] = [9]
        for txid in batch:
            args += [txid, GROUP, "orders", "0", txid.encode(), "", "", "", ""]
        real_client.delete(keys.ended)
        prepares(keys=keys.script_keys(), args=args)
        real_client.set(keys.ended, "not a hash")
        args = [8]
        for txid in batch:
            args += [txid, GROUP, "COMMIT", "producer", "", 1, 1000, ""]
        assert all(reply[4] == b"APPLIED" for reply in ends(keys=keys.script_keys(), args=args))
        swept = any(op_id.decode().split("-")[0].endswith("0") for op_id, _ in real_client.xrange(keys.op_stream))
    assert swept
    assert real_client.hlen(keys.inflight) == 0
    bodies = [fields[b"body"] for _, fields in real_client.xrange(keys.topic_stream)]
    assert len(bodies) == len(set(bodies)) == count


def test_a_batch_forgets_expired_outcomes_as_fast_as_its_ends_one_by_one_would(real_client) -> None:
    """Each end whose time ends in 0 ms forgets up to 256 outcomes past the window; a batch makes its ends' sweeps
    together after them, as many as asked (not one sweep for the call, which would let `ended` grow under steady
    batched traffic)."""
    keys = TopicKeys("orders")
    prepares = register_topic_script(real_client, "prepare_halves")
    ends = register_topic_script(real_client, "end_transactions")
    old = [f"old-{i}" for i in range(3000)]
    real_client.hset(keys.ended, mapping=dict.fromkeys(old, f"COMMIT|-|1-0|{GROUP}"))
    real_client.zadd(keys.ended_at, dict.fromkeys(old, 1))  # ended long ago: past any window
    count, asked = 0, 0
    while not asked and count < 20_000:  # until a call's ends fall on a millisecond ending in 0
        batch = [f"new-{count + i}" for i in range(32)]
        count += len(batch)
        args: list[Any] = [9]
        for txid in batch:
            args += [txid, GROUP, "orders", "0", b"x", "", "", "", ""]
        prepares(keys=keys.script_keys(), args=args)
        args = [8]
        for txid in batch:
            args += [txid, GROUP, "ROLLBACK", "producer", "", 60_000, 100_000, ""]
        last = real_client.xrevrange(keys.op_stream, count=1)
        ends(keys=keys.script_keys(), args=args)
        made = real_client.xrange(keys.op_stream, min=f"({last[0][0].decode()}" if last else "-")
        asked = sum(op_id.decode().split("-")[0].endswith("0") for op_id, _ in made)
    assert asked
    forgotten = len(old) - sum(1 for txid in real_client.hmget(keys.ended, old) if txid is not None)
    assert forgotten == min(len(old), 256 * asked)


def test_a_batch_of_ends_with_different_windows_forgets_only_what_every_one_would(real_client) -> None:
    """A call whose ends have different dedupe windows (not the library's: a producer's ends share its window)
    sweeps with the earliest cutoff of those that asked: outcomes still within a longer window are kept."""
    keys = TopicKeys("orders")
    prepares = register_topic_script(real_client, "prepare_halves")
    ends = register_topic_script(real_client, "end_transactions")
    (now_s, now_us) = real_client.time()
    recent = [f"recent-{i}" for i in range(300)]  # 30 s old: past a 1 s window, within a 60 s one
    real_client.hset(keys.ended, mapping=dict.fromkeys(recent, f"COMMIT|-|1-0|{GROUP}"))
    real_client.zadd(keys.ended_at, dict.fromkeys(recent, now_s * 1000 + now_us // 1000 - 30_000))
    windows: dict[str, int] = {}
    count, mixed = 0, False
    while not mixed and count < 40_000:  # until ends of both windows ask for a sweep in one call, a 1 s one last
        batch = [f"new-{count + i}" for i in range(4)]
        count += len(batch)
        args: list[Any] = [9]
        for txid in batch:
            args += [txid, GROUP, "orders", "0", b"x", "", "", "", ""]
        prepares(keys=keys.script_keys(), args=args)
        args = [8]
        for i, txid in enumerate(batch):
            windows[txid] = 1_000 if i % 2 else 60_000
            args += [txid, GROUP, "ROLLBACK", "producer", "", windows[txid], 100_000, ""]
        last = real_client.xrevrange(keys.op_stream, count=1)
        ends(keys=keys.script_keys(), args=args)
        made = real_client.xrange(keys.op_stream, min=f"({last[0][0].decode()}" if last else "-")
        askers = [
            windows[fields[b"transaction_id"].decode()]
            for op_id, fields in made
            if op_id.decode().split("-")[0].endswith("0")
        ]
        mixed = bool(askers) and askers[-1] == 1_000 and 60_000 in askers
    assert mixed
    assert all(record is not None for record in real_client.hmget(keys.ended, recent))


# --- prepares: lua/prepare_halves.lua ------------------------------------------------------------------------------


def half_messages_written(client: redis.Redis, keys: TopicKeys) -> int:
    """Entries ever added to the half stream (deleted ones too): one per transaction prepared once."""
    return int(client.xinfo_stream(keys.half_stream)["entries-added"])


def wakes_expected(client: redis.Redis, keys: TopicKeys) -> tuple[int, str]:
    """The wakes prepares one by one would have made into a topic that had nothing unchecked, from its half
    messages in the order they were written: the first without its own immunity, and every one with it; and the
    score the last of them leaves."""
    wakes, score, unchecked = 0, "", False
    for _, fields in client.xrange(keys.half_stream):
        if b"check_immunity_ms" in fields or not unchecked:
            wakes, score = wakes + 1, fields[b"born_ms"].decode()
        unchecked = unchecked or b"check_immunity_ms" not in fields
    return wakes, score


def test_sends_in_flight_together_prepare_in_one_call_and_each_exactly_once(real_client, redis_url):
    count = 2 * MAX_PREPARES_PER_CALL + 32  # more than one batch call's worth

    async def scenario() -> tuple[list[Any], list[tuple[str, int]]]:
        async with TransactionProducer(GROUP, Arg(), redis_url=redis_url) as producer:
            seen = watch_batches(producer.broker.runner._lane, "prepares")
            real_client.config_resetstat()
            messages = [Message("orders", b"%d" % i) for i in range(count)]
            return await asyncio.gather(
                *(producer.send_message_in_transaction(m, outcome_of(i)) for i, m in enumerate(messages))
            ), seen

    results, seen = asyncio.run(scenario())
    keys = TopicKeys("orders")
    assert [r.local_transaction_state for r in results] == [outcome_of(i) for i in range(count)]
    assert not [r.end_error for r in results if r.end_error]
    assert_ended_once(real_client, keys, {r.transaction_id: outcome_of(i).value for i, r in enumerate(results)})
    assert half_messages_written(real_client, keys) == count
    assert sum(prepares for _, prepares in seen) > count // 2, "most prepares went out in batch calls"
    assert max(prepares for _, prepares in seen) <= MAX_PREPARES_PER_CALL
    assert {stream for stream, _ in seen} == {"orders"}
    # both steps batched: far fewer script calls than two per transaction
    assert real_client.info("commandstats")["cmdstat_evalsha"]["calls"] < 0.75 * count


def test_prepares_to_several_topics_and_partitions_are_batched_per_partition(real_client, redis_url):
    create_topic(real_client, "parted", 4)
    messages = [
        (Message("parted", b"%d" % i, keys=f"key-{i}") if i % 2 else Message(("orders", "audit")[i % 4 // 2], b"x"))
        for i in range(160)
    ]

    async def scenario() -> tuple[list[Any], list[tuple[str, int]]]:
        async with TransactionProducer(GROUP, Arg(), redis_url=redis_url) as producer:
            seen = watch_batches(producer.broker.runner._lane, "prepares")
            sends = (producer.send_message_in_transaction(m, outcome_of(i)) for i, m in enumerate(messages))
            return await asyncio.gather(*sends), seen

    results, seen = asyncio.run(scenario())
    assert not [r.end_error for r in results if r.end_error]
    every = [*partition_keys_of("parted", 4), TopicKeys("orders"), TopicKeys("audit")]
    for keys in every:
        outcomes = {
            r.transaction_id: outcome_of(i).value
            for i, r in enumerate(results)
            if r.topic == keys.topic and r.partition == keys.partition
        }
        assert outcomes, keys
        assert_ended_once(real_client, keys, outcomes)
        assert half_messages_written(real_client, keys) == len(outcomes)
    streams = {stream for stream, _ in seen}
    assert len(streams) > 2 and streams <= {keys.topic_stream for keys in every}


def _prepare(broker: AsyncRedisBroker, keys: TopicKeys, txid: str, **message: Any):
    return broker.prepare_half(keys, Message(keys.topic, b"body", **message), txid, GROUP)


async def _register(broker: AsyncRedisBroker, *topics: TopicKeys) -> None:
    """The topics registered first (a process's first send to a topic checks its key): the prepares made together
    after it go out in one pipeline."""
    for keys in topics:
        await broker.register_topic(keys, Message(keys.topic, b"x"), "register")


def test_a_transaction_prepared_twice_in_one_batch_is_written_once(real_client, redis_url):
    keys = TopicKeys("orders")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        await _register(broker, keys)
        ids = ["a", "a", "b", "c", "b", "a", "d"]
        return await asyncio.gather(*(_prepare(broker, keys, txid) for txid in ids)), seen

    replies, seen = _broker_scenario_of(redis_url, body, "prepares")
    assert seen == [(keys.topic_stream, 7)], "one call for every prepare"
    assert [r.duplicate for r in replies] == [False, True, False, False, True, True, False]
    assert replies[1].half_id == replies[5].half_id == replies[0].half_id
    assert replies[4].half_id == replies[2].half_id
    assert len({replies[i].half_id for i in (0, 2, 3, 6)}) == 4 and all(r.state == "PREPARED" for r in replies)
    assert half_messages_written(real_client, keys) == 4
    inflight = {k.decode(): v.decode() for k, v in real_client.hgetall(keys.inflight).items()}
    assert inflight == {txid: replies[i].half_id for i, txid in ((0, "a"), (2, "b"), (3, "c"), (6, "d"))}


def test_a_bad_argument_or_a_failed_command_fails_that_prepare_only(real_client, redis_url):
    """An empty transaction id is refused by the rules (BADARG); a prepare with its own immunity writes a `due` key
    of another type (a command failing inside the batch: pcall keeps it to that prepare). The others apply."""
    keys = TopicKeys("orders")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        await _register(broker, keys)
        real_client.set(keys.due, "not a sorted set")
        sends = [_prepare(broker, keys, f"ok-{i}") for i in range(3)]
        sends += [_prepare(broker, keys, ""), _prepare(broker, keys, "immune", check_immunity_seconds=5)]
        sends += [_prepare(broker, keys, f"ok-{i}") for i in range(3, 6)]
        return await asyncio.gather(*sends, return_exceptions=True), seen

    replies, seen = _broker_scenario_of(redis_url, body, "prepares")
    assert seen == [(keys.topic_stream, 8)]
    assert isinstance(replies[3], PrepareError) and "BADARG" in str(replies[3])
    assert isinstance(replies[4], PrepareError) and "WRONGTYPE" in str(replies[4])
    fine = [r for i, r in enumerate(replies) if i not in (3, 4)]
    assert all(isinstance(r, PrepareResult) and not r.duplicate for r in fine)
    assert sorted(k.decode() for k in real_client.hkeys(keys.inflight)) == ["immune", *(f"ok-{i}" for i in range(6))]
    # the failed prepare wrote what prepare_half would have before failing; sent again it is a DUPLICATE
    assert half_messages_written(real_client, keys) == 7


def test_prepares_flushed_between_batches_are_loaded_again(real_client, redis_url):
    keys = TopicKeys("orders")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        await _register(broker, keys)
        for round_ in range(3):
            real_client.script_flush()  # the first round finds no script at all: the batch one is loaded on use
            replies = await asyncio.gather(*(_prepare(broker, keys, f"flush{round_}-{i}") for i in range(20)))
            assert all(not r.duplicate for r in replies)
        return seen

    seen = _broker_scenario_of(redis_url, body, "prepares")
    assert seen == [(keys.topic_stream, 20)] * 3
    assert half_messages_written(real_client, keys) == real_client.hlen(keys.inflight) == 60


@pytest.mark.parametrize("cut", ["after the first reply", "before any reply"])
def test_a_connection_dropped_mid_batch_of_prepares_writes_each_half_once(real_client, redis_url, cut):
    topics = [TopicKeys("orders"), TopicKeys("audit")]
    dropped: list[str] = []

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        await _register(broker, *topics)
        pool = broker.runner._lane._pool
        get_connection = pool.get_connection

        async def dropping(*args: Any, **kwargs: Any) -> Any:
            conn = await get_connection(*args, **kwargs)
            read_response = conn.read_response

            async def read_then_drop(*args: Any, **kwargs: Any) -> Any:
                if cut == "after the first reply":
                    await read_response(*args, **kwargs)
                del conn.read_response  # once: the retry reads as usual
                await conn.disconnect()
                dropped.append(cut)
                raise redis.ConnectionError("dropped mid-batch")

            conn.read_response = read_then_drop
            pool.get_connection = get_connection
            return conn

        pool.get_connection = dropping
        ids = [(keys, f"{keys.topic}-{i}") for keys in topics for i in range(12)]
        return ids, await asyncio.gather(*(_prepare(broker, keys, txid) for keys, txid in ids)), seen

    ids, replies, seen = _broker_scenario_of(redis_url, body, "prepares")
    assert dropped == [cut], "the batch was sent again after the drop"
    assert sorted(seen) == sorted((k.topic_stream, 12) for k in topics)
    assert all(isinstance(r, PrepareResult) for r in replies)
    for keys in topics:
        assert half_messages_written(real_client, keys) == 12
        inflight = {k.decode(): v.decode() for k, v in real_client.hgetall(keys.inflight).items()}
        assert inflight == {txid: r.half_id for (k, txid), r in zip(ids, replies, strict=True) if k is keys}
        # the first send woke the topic; its repeat (all duplicates) wrote nothing more
        assert real_client.zscore(SCHEDULE, keys.topic_stream) == int(wakes_expected(real_client, keys)[1])
    if cut == "after the first reply":
        assert [r.duplicate for r in replies[:12]] == [True] * 12, "the first call had applied: its repeat finds it"


def test_a_batch_wakes_the_topic_as_the_prepares_one_by_one_would(real_client, redis_url):
    """Into a topic with nothing unchecked: the first prepare wakes it (its born ms), the later ones find
    `unchecked` non-empty and do not; one with its own immunity wakes it again. A second batch wakes nothing."""
    keys, idle = TopicKeys("woken"), TopicKeys("immune-first")

    async def body(broker: AsyncRedisBroker, seen: list[tuple[str, int]]) -> Any:
        await _register(broker, keys, idle)
        real_client.config_resetstat()
        first = await asyncio.gather(*(_prepare(broker, keys, f"w-{i}") for i in range(10)))
        stats = real_client.info("commandstats")
        after_first = real_client.zscore(SCHEDULE, keys.topic_stream)
        sends = [_prepare(broker, keys, f"x-{i}") for i in range(5)]
        sends += [_prepare(broker, keys, "own", check_immunity_seconds=30)]
        sends += [_prepare(broker, idle, "i-0", check_immunity_seconds=30)]
        sends += [_prepare(broker, idle, f"i-{i}") for i in range(1, 5)]
        second = await asyncio.gather(*sends)
        return first, stats, after_first, second, seen

    first, stats, after_first, second, seen = _broker_scenario_of(redis_url, body, "prepares")
    assert seen == [(keys.topic_stream, 10), (keys.topic_stream, 6), (idle.topic_stream, 5)]
    assert all(r.wake == "" for r in (*first, *second)), "the script wrote the schedule (KEYS[14])"
    born = [fields[b"born_ms"].decode() for _, fields in real_client.xrange(keys.half_stream)]
    assert after_first == int(born[0]), "scored at the first prepare's birth"
    # ten prepares in one call: one ZADD of them all into `unchecked`, one into the schedule (one wake)
    assert stats["cmdstat_zadd"]["calls"] == 2 and stats["cmdstat_exists"]["calls"] == 1
    for topic in (keys, idle):
        wakes, score = wakes_expected(real_client, topic)
        assert real_client.zscore(SCHEDULE, topic.topic_stream) == int(score)
    assert wakes_expected(real_client, keys)[0] == 2 and wakes_expected(real_client, idle)[0] == 2


def test_without_the_schedule_key_each_prepare_replies_its_own_wake(real_client, redis_url):
    """Where the schedule is not passed (as on Cluster), the batch replies the wake time to the prepare that wakes
    the topic, '' to the others, and writes no schedule."""
    keys = TopicKeys("client-woken")

    async def scenario() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        lane = ScriptLane(client)
        seen = watch_batches(lane, "prepares")
        prepare = register_topic_script(client, "prepare_half")
        args = [[f"c-{i}", GROUP, keys.topic, 0, b"body", "", "", "", 5000 if i == 4 else ""] for i in range(8)]
        replies = await asyncio.gather(*(lane.call(prepare, keys.script_keys(), a) for a in args))
        await client.aclose()
        return replies, seen

    replies, seen = asyncio.run(scenario())
    assert seen == [(keys.topic_stream, 8)]
    born = {fields[b"transaction_id"]: fields[b"born_ms"] for _, fields in real_client.xrange(keys.half_stream)}
    assert [r[4] for r in replies] == [born[b"c-0"], b"", b"", b"", born[b"c-4"], b"", b"", b""]
    assert real_client.zscore(SCHEDULE, keys.topic_stream) is None


def test_prepares_of_a_transaction_of_several_messages_keep_their_parent(real_client, redis_url):
    """Prepares with a parent transaction id (ten arguments) and without (nine) go in calls of their own width: a
    prepare of nine never reads the next one's transaction id as its parent."""
    keys = TopicKeys("parents")

    async def scenario() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        lane = ScriptLane(client)
        seen = watch_batches(lane, "prepares")
        prepare = register_topic_script(client, "prepare_half")
        args = [[f"p-{i}", GROUP, keys.topic, 0, b"body", "", "", "", ""] for i in range(8)]
        for i in range(0, 8, 2):
            args[i].append("parent")
        replies = await asyncio.gather(*(lane.call(prepare, keys.scheduled_script_keys(), a) for a in args))
        await client.aclose()
        return replies, seen

    replies, seen = asyncio.run(scenario())
    assert sorted(seen) == [(keys.topic_stream, 4), (keys.topic_stream, 4)]
    assert all(r[0] == b"OK" and r[3] == b"NEW" for r in replies)
    parents = {f[b"transaction_id"]: f.get(b"parent_transaction_id") for _, f in real_client.xrange(keys.half_stream)}
    assert parents == {b"p-%d" % i: (b"parent" if i % 2 == 0 else None) for i in range(8)}


def test_a_prepare_durability_shortfall_gives_each_caller_its_own_reply(real_client, redis_url):
    keys = TopicKeys("orders")

    async def scenario() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        lane = ScriptLane(client, durability=Durability.of("replica", replicas=1, timeout=0.05))
        seen = watch_batches(lane, "prepares")
        prepare = register_topic_script(client, "prepare_half")
        args = [[f"d-{i}", GROUP, keys.topic, 0, b"body", "", "", "", ""] for i in range(8)]
        replies = await asyncio.gather(
            *(lane.call(prepare, keys.scheduled_script_keys(), a) for a in args), return_exceptions=True
        )
        await client.aclose()
        return replies, seen

    replies, seen = asyncio.run(scenario())
    assert seen == [(keys.topic_stream, 8)]
    assert all(isinstance(r, DurabilityError) and len(r.replies) == 1 for r in replies)
    half_ids = [r.replies[0][1] for r in replies]
    assert len(set(half_ids)) == 8 and all(r.replies[0][3] == b"NEW" for r in replies)
    assert half_messages_written(real_client, keys) == 8


def test_a_batch_of_prepares_makes_one_command_per_prepare_and_the_index_reads_and_writes_once(real_client) -> None:
    """The common path of a batch of prepares: each prepare writes its half message; the indexes are read once
    (HMGET of inflight, ended, dead_index; TIME; EXISTS) and written once (HSET, ZADD) for the call, and the topic is
    woken once."""
    keys = TopicKeys("orders")
    prepares = register_topic_script(real_client, "prepare_halves")
    args: list[Any] = [9]
    for i in range(20):
        args += [f"seven-{i}", GROUP, "orders", "0", b"body", "", "", "", ""]
    prepares(keys=keys.scheduled_script_keys(), args=[9, "load", GROUP, "other", "0", b"", "", "", "", ""])
    real_client.delete(*keys.script_keys(), SCHEDULE)
    real_client.config_resetstat()
    replies = prepares(keys=keys.scheduled_script_keys(), args=args)
    assert len(replies) == 20 and all(r[0] == b"OK" and r[3] == b"NEW" and r[4] == b"" for r in replies)
    calls = {
        name.removeprefix("cmdstat_"): stats["calls"]
        for name, stats in real_client.info("commandstats").items()
        if name not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config|resetstat")
    }
    assert calls == {"hmget": 3, "time": 1, "xadd": 20, "hset": 1, "exists": 1, "zadd": 2}


def test_a_batch_sent_to_a_demoted_master_fails_whole_as_one_call_would(replicated: tuple[str, int]) -> None:
    """A master demoted to a replica (a failover whose old connections were not cut): each call of a batch meets
    READONLY and nothing is written; the batch fails as a whole with READONLY, as one call does (redis-py's
    Sentinel connection then reconnects to the new master and the lane sends it again) — not with every caller's
    own error and the connection kept on the replica. A lone COMMIT too (its topic XADD is under pcall)."""
    url, _ = replicated
    master = redis.Redis.from_url(url)
    replica_port = next(
        v["port"] for k, v in master.info("replication").items() if k.startswith("slave") and isinstance(v, dict)
    )
    replica = redis.Redis(host="127.0.0.1", port=int(replica_port))
    keys = TopicKeys("demoted")
    broker = RedisBroker(master)
    halves = [broker.prepare_half(keys, Message("demoted", b"x"), f"tx-{i}", "demoted_group").half_id for i in (0, 1)]
    assert master.wait(1, 10_000) == 1
    prepares = replica.register_script(script_text("prepare_halves", *topic_preludes("prepare_halves")))
    ends = replica.register_script(script_text("end_transactions", *topic_preludes("end_transactions")))
    one_end = replica.register_script(script_text("end_transaction", *topic_preludes("end_transaction")))

    def prepare_args(txid: str) -> list[Any]:
        return [txid, "demoted_group", "demoted", "0", "x", "", "", "", ""]

    def end_args(i: int) -> list[Any]:
        return [f"tx-{i}", "demoted_group", "COMMIT", "producer", "", 300_000, 1000, halves[i]]

    with pytest.raises(redis.ReadOnlyError):
        prepares(keys=keys.script_keys(), args=[9, *prepare_args("tx-new-1"), *prepare_args("tx-new-2")])
    with pytest.raises(redis.ReadOnlyError):
        ends(keys=keys.script_keys(), args=[8, *end_args(0), *end_args(1)])
    with pytest.raises(redis.ReadOnlyError):
        one_end(keys=keys.script_keys(), args=end_args(0))
    assert master.hlen(keys.inflight) == 2 and master.xlen("demoted") == 0
    replica.close()
    master.close()
