"""The asyncio lane sends the ends of one topic partition that are in flight together as one call of
``lua/end_transactions.lua``: each caller still gets its own reply or its own error, and each transaction ends
exactly once, through duplicates, a refused topic stream, a failed command inside one end, NOSCRIPT, a connection
dropped mid-batch and a durability level that falls short. Against a real Redis."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from redis_txmq import LocalTransactionState, Message
from redis_txmq.asyncio import TransactionListener, TransactionProducer
from redis_txmq.asyncio.broker import AsyncRedisBroker
from redis_txmq.asyncio.lane import MAX_ENDS_PER_CALL, ScriptLane, _spread
from redis_txmq.durability import Durability
from redis_txmq.errors import CorruptEntryError, DurabilityError, TransactionConflictError, TxMQError
from redis_txmq.keys import TopicKeys
from redis_txmq.protocol import EndResult, EndSource
from redis_txmq.scripts import assemble, register_topic_script, script_source
from redis_txmq.topics import create_topic, partition_keys_of

pytestmark = pytest.mark.real

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
GROUP = "batch_group"


class Arg(TransactionListener):
    """The local transaction's outcome is the send's ``arg``."""

    async def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return arg

    async def check_local_transaction(self, message: Message) -> Any:
        return None


def watch_batches(lane: ScriptLane) -> list[tuple[str, int]]:
    """``(topic stream, ends)`` of every ``end_transactions`` call the lane writes from now on."""
    seen: list[tuple[str, int]] = []
    coalesce = lane._coalesce

    def watching(batch: Any) -> Any:
        calls, spans = coalesce(batch)
        seen.extend((keys[3], (len(args) - 1) // args[0]) for script, keys, args in calls if script is lane._ends)
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
    async def run() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        broker = AsyncRedisBroker(client)
        try:
            return await body(broker, watch_batches(broker.runner._lane))
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
    replies = _spread([b"prepared", refused, [b"one", b"two"], [b"short"]], [0, (1, 2), (3, 4), (5, 6)], 7)
    assert replies[0] == b"prepared" and replies[1] is refused and replies[2] is refused
    assert replies[3:5] == [b"one", b"two"]
    assert all(isinstance(r, redis.ResponseError) and "2 ends" in str(r) for r in replies[5:])


def test_one_end_and_a_batch_of_ends_run_the_same_text() -> None:
    text = (Path(__file__).resolve().parent.parent / "lua" / "include" / "end_one.lua").read_text(encoding="utf-8")
    end_one = assemble(text, "include/end_one").rstrip("\n")
    assert end_one in script_source("end_transaction")
    indented = "\n".join("  " + line if line else line for line in end_one.split("\n"))
    assert "local function end_one(at)\n" + indented + "\nend\n" in script_source("end_transactions")


def test_a_batch_makes_an_end_s_nine_commands_per_end_and_nothing_more(real_client) -> None:
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
    nine = {"hget": 1, "xrange": 1, "xadd": 2, "hset": 1, "zadd": 1, "xdel": 1, "hdel": 1, "zrem": 1}
    assert calls == {name: 19 * count for name, count in nine.items()}
