"""A prepare resent after its reply was lost still wakes its topic in the checkers' schedule (Cluster, where the
client writes the wake the script replies: the schedule is in another hash slot).

redis-py sends a command again when its reply is lost; the prepare then answers DUPLICATE. When that answer carried
no wake, nobody wrote it, every later prepare joined a non-empty ``unchecked`` without waking either, and the
topic's check-backs waited for a checker's next full pass (58 s in the report) instead of its next round."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from redis_txmq import Message
from redis_txmq.checker import Checker
from redis_txmq.core.keys import SCHEDULE, GroupKeys, TopicKeys
from redis_txmq.core.protocol import prepare_args
from redis_txmq.core.scripts import register_topic_script
from redis_txmq.sync.broker import RedisBroker

from .helpers import server_ms, wait_until
from .test_checker_schedule import FAST, GROUP, requested

_ids = itertools.count()


def args_of(keys: TopicKeys, txid: str, immunity_ms: int | None = None) -> list[Any]:
    message = Message(keys.topic, b"body", check_immunity_seconds=immunity_ms / 1000 if immunity_ms else None)
    return prepare_args(message, txid, GROUP, keys)


def reply(raw: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in raw]


def born_of(client: Any, keys: TopicKeys, half_id: str) -> str:
    ((_, fields),) = client.xrange(keys.half_stream, half_id, half_id)
    return fields[b"born_ms"].decode()


@pytest.mark.real
def test_a_repeated_prepare_replies_the_wake_while_its_transaction_is_unchecked(real_client: redis.Redis) -> None:
    """Both scripts (one prepare a call, a batch of them), without the schedule among their keys (Cluster): a
    repeat answers DUPLICATE with the wake the first call replied, as long as no checker counted a check of it (a
    look that checked it wrote the topic's next time itself)."""
    prepare = register_topic_script(real_client, "prepare_half")
    prepares = register_topic_script(real_client, "prepare_halves")
    keys = TopicKeys("retried")
    first = reply(prepare(keys=keys.script_keys(), args=args_of(keys, "tx-a")))
    assert first[3] == "NEW" and first[4] == born_of(real_client, keys, first[1])
    again = reply(prepare(keys=keys.script_keys(), args=args_of(keys, "tx-a")))
    assert again == ["OK", first[1], "PREPARED", "DUPLICATE", first[4]]
    batch = args_of(keys, "tx-a")
    (in_batch,) = [reply(r) for r in prepares(keys=keys.script_keys(), args=[len(batch), *batch])]
    assert in_batch == again

    # a second transaction joins a non-empty `unchecked`: it never woke the topic, its repeat wakes it all the same
    # (at its own birth: a past time only makes the next round look)
    second = reply(prepare(keys=keys.script_keys(), args=args_of(keys, "tx-b")))
    assert second[3:] == ["NEW", ""]
    assert reply(prepare(keys=keys.script_keys(), args=args_of(keys, "tx-b")))[4] == born_of(
        real_client, keys, second[1]
    )

    # in one batch: the first is new, its repeat in the same call answers as a second call would
    fresh = args_of(keys, "tx-c")
    new, repeat = (reply(r) for r in prepares(keys=keys.script_keys(), args=[len(fresh), *fresh, *fresh]))
    assert new[3:] == ["NEW", ""] and repeat == [
        "OK",
        new[1],
        "PREPARED",
        "DUPLICATE",
        born_of(real_client, keys, new[1]),
    ]

    # a message with its own immunity always wakes; its repeat too
    own = args_of(keys, "tx-d", immunity_ms=5000)
    woke = reply(prepare(keys=keys.script_keys(), args=own))
    assert woke[4] == born_of(real_client, keys, woke[1])
    assert reply(prepare(keys=keys.script_keys(), args=own))[4] == woke[4]
    (batched,) = [reply(r) for r in prepares(keys=keys.script_keys(), args=[len(own), *own])]
    assert batched[3:] == ["DUPLICATE", woke[4]]

    # checked once: the look scheduled the topic, a repeat wakes nothing
    for txid in ("tx-a", "tx-d"):
        real_client.zrem(keys.unchecked, txid)
        real_client.zadd(keys.due, {txid: server_ms(real_client) + 60_000})
        real_client.hincrby(keys.checks, txid, 1)
    for txid, immunity in (("tx-a", None), ("tx-d", 5000)):
        call = args_of(keys, txid, immunity)
        assert reply(prepare(keys=keys.script_keys(), args=call))[3:] == ["DUPLICATE", ""]
        (batched,) = [reply(r) for r in prepares(keys=keys.script_keys(), args=[len(call), *call])]
        assert batched[3:] == ["DUPLICATE", ""]

    # with the schedule among the keys (one server) the first call wrote the wake itself: a repeat replies none
    assert reply(prepare(keys=keys.scheduled_script_keys(), args=args_of(keys, "tx-b")))[3:] == ["DUPLICATE", ""]


@pytest.fixture
def cluster(cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def test_on_a_cluster_a_resent_prepare_wakes_the_topic_and_its_check_back_goes_out(cluster: RedisCluster) -> None:
    """The report's case on a real cluster: the first send of a prepare ran and its reply was lost (the script run
    directly, its reply dropped), the resend's DUPLICATE is what the client sees. The topic is woken all the same,
    and a checker whose start-up full pass is spent sends the check-back of it and of a later prepare in its next
    rounds."""
    settings = replace(FAST, cluster=True)
    broker = RedisBroker(cluster, settings)
    broker.load_scripts()
    checker = Checker(cluster, settings, full_pass_interval=1e9, sweep_interval=1e9)
    checker.run_round()  # the start-up full pass: nothing to see yet
    keys = TopicKeys("lost-reply")
    message = Message(keys.topic, b"body")
    txid = f"tx-{next(_ids)}"
    args = prepare_args(message, txid, GROUP, keys)
    broker.register_topic(keys, message, txid)
    broker._prepare(keys=keys.script_keys(), args=args)  # ran, and its reply (with the wake) never arrived
    assert cluster.zscore(SCHEDULE, keys.topic_stream) is None

    resent = broker.prepare_half(keys, message, txid, GROUP)
    assert resent.duplicate
    assert cluster.zscore(SCHEDULE, keys.topic_stream) == int(born_of(cluster, keys, resent.half_id))
    later = f"tx-{next(_ids)}"
    broker.prepare_half(keys, message, later, GROUP)  # joins a non-empty `unchecked`: no wake of its own

    def both_requested() -> bool:
        checker.run_round()
        return {txid, later} <= requested(cluster)

    wait_until(both_requested, timeout=10)
    assert cluster.xlen(GroupKeys(GROUP).check_requests) == 2
