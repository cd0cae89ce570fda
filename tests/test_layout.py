"""The layout version record (``lua/heartbeat.lua`` with its third key) and :func:`legacy_producers`, on a real Redis:
which producer instances a checker must treat as writers of an older key layout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from redis_txmq import Settings
from redis_txmq.core.errors import TxMQError
from redis_txmq.core.heartbeat import Heartbeat
from redis_txmq.core.keys import GROUP_REGISTRY, GroupKeys
from redis_txmq.core.layout import LAYOUT_VERSION, legacy_producers
from redis_txmq.sync.preload import preload

from .helpers import ScriptedListener, wait_until

pytestmark = pytest.mark.real

GONE_LONG_AGO = 0
"""A heartbeat score older than ten live periods: the next beat of the group drops the instance."""


def producer_beat(client: redis.Redis, group: str, instance: str, layout: int = LAYOUT_VERSION) -> Heartbeat:
    """A producer instance's heartbeat as this release writes it (with a layout record)."""
    keys = GroupKeys(group)
    beat = Heartbeat(client, keys.producers, keys.durability_levels, instance, 1.0, "master", GroupKeys(group).layouts)
    beat.layout = layout
    return beat


def old_beat(client: redis.Redis, group: str, instance: str) -> Heartbeat:
    """A heartbeat called with two keys, as release 0.1.0 calls it: no layout record."""
    keys = GroupKeys(group)
    return Heartbeat(client, keys.producers, keys.durability_levels, instance, 1.0, "master")


def register(client: redis.Redis, *groups: str) -> None:
    client.sadd(GROUP_REGISTRY, *groups)


def layouts(client: redis.Redis, group: str) -> dict[bytes, bytes]:
    return client.hgetall(GroupKeys(group).layouts)


# ------------------------------------------------------------------------------------------------ the heartbeat script


def test_the_layouts_key_is_in_the_slot_of_the_groups_instances() -> None:
    from redis.crc import key_slot

    assert GroupKeys("shop").layouts == "txmq:group:{shop}:layouts"
    assert key_slot(GroupKeys("shop").layouts.encode()) == key_slot(GroupKeys("shop").producers.encode())


def test_a_beat_records_the_layout_and_leave_removes_it(real_client: redis.Redis) -> None:
    beat = producer_beat(real_client, "shop", "p1")
    assert beat.beat() == 1
    assert layouts(real_client, "shop") == {b"p1": str(LAYOUT_VERSION).encode()}
    assert real_client.hgetall(GroupKeys("shop").durability_levels) == {b"p1": b"master"}
    beat.leave()
    assert layouts(real_client, "shop") == {}
    assert real_client.zcard(GroupKeys("shop").producers) == 0


def test_an_instance_dropped_as_gone_loses_its_layout_record(real_client: redis.Redis) -> None:
    gone, live = producer_beat(real_client, "shop", "gone"), producer_beat(real_client, "shop", "live")
    gone.beat()
    real_client.zadd(GroupKeys("shop").producers, {"gone": GONE_LONG_AGO})
    assert layouts(real_client, "shop") == {b"gone": str(LAYOUT_VERSION).encode()}  # listed, gone, not dropped yet
    live.beat()
    assert layouts(real_client, "shop") == {b"live": str(LAYOUT_VERSION).encode()}
    assert real_client.zrange(GroupKeys("shop").producers, 0, -1) == [b"live"]


def test_two_keys_still_work_and_record_no_layout(real_client: redis.Redis) -> None:
    """The checker's heartbeat, and the call of release 0.1.0: the script without its third key."""
    assert old_beat(real_client, "shop", "old").beat() == 1
    assert not real_client.exists(GroupKeys("shop").layouts)
    checker = Heartbeat.of_checker(real_client, "c1", Settings())
    assert checker.beat() == 1
    assert real_client.keys("*layouts*") == []
    checker.leave()


def test_a_record_left_by_an_instance_dropped_without_the_third_key_is_removed(real_client: redis.Redis) -> None:
    """An instance of this release dropped as gone by a beat of release 0.1.0 (two keys: its record stays): the next
    beat with the third key removes the record once the hash holds more records than the zset has instances."""
    producer_beat(real_client, "shop", "new-gone").beat()
    real_client.zadd(GroupKeys("shop").producers, {"new-gone": GONE_LONG_AGO})
    old_beat(real_client, "shop", "old").beat()  # drops new-gone from the zset, not from the layouts hash
    assert real_client.zrange(GroupKeys("shop").producers, 0, -1) == [b"old"]
    assert set(layouts(real_client, "shop")) == {b"new-gone"}
    old_beat(real_client, "shop", "old").leave()
    producer_beat(real_client, "shop", "new").beat()
    assert set(layouts(real_client, "shop")) == {b"new"}


def test_a_layout_key_without_a_version_is_refused(real_client: redis.Redis) -> None:
    beat = producer_beat(real_client, "shop", "p1")
    preload(beat.script)
    keys = [beat.instances_key, beat.levels_key, beat.layouts_key]
    for args in (["p1", 3000, "beat", "master"], ["p1", 3000, "beat", "master", "0"], ["p1", 3000, "beat", "", "x"]):
        with pytest.raises(redis.ResponseError, match="layout version"):
            beat.script(keys=keys, args=args)
    assert not real_client.exists(beat.instances_key)


# ------------------------------------------------------------------------------------------------- legacy_producers


def test_no_group_no_legacy_producer(real_client: redis.Redis) -> None:
    assert legacy_producers(real_client) == []
    register(real_client, "empty")
    assert legacy_producers(real_client) == []


def test_instances_without_a_current_record_are_legacy(real_client: redis.Redis) -> None:
    register(real_client, "shop", "billing")
    producer_beat(real_client, "shop", "new").beat()
    old_beat(real_client, "shop", "old").beat()
    producer_beat(real_client, "billing", "older-layout", layout=LAYOUT_VERSION - 1).beat()
    producer_beat(real_client, "billing", "newer-layout", layout=LAYOUT_VERSION + 1).beat()
    real_client.zadd(GroupKeys("billing").producers, {"garbled": server_ms(real_client)})  # a record, not a number
    real_client.hset(GroupKeys("billing").layouts, "garbled", "two")
    assert legacy_producers(real_client) == [("billing", "garbled"), ("billing", "older-layout"), ("shop", "old")]


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_an_old_instance_gone_longer_than_the_drop_time_is_not_legacy(real_client: redis.Redis) -> None:
    """Nobody drops the entry of a group none of whose producers runs any more: past the heartbeat's drop time
    (ten live periods) it no longer holds the checkers in full rounds."""
    register(real_client, "shop")
    real_client.zadd(GroupKeys("shop").producers, {"long-gone": server_ms(real_client) - 151_000})
    assert legacy_producers(real_client, heartbeat_interval=5.0) == []
    assert legacy_producers(real_client, heartbeat_interval=6.0) == [("shop", "long-gone")]


def test_an_old_instance_is_legacy_while_listed_gone_or_not_and_not_after_leave_or_drop(
    real_client: redis.Redis,
) -> None:
    register(real_client, "shop")
    old, crashed = old_beat(real_client, "shop", "old"), old_beat(real_client, "shop", "crashed")
    old.beat()
    crashed.beat()
    gone = server_ms(real_client) - 40_000  # gone: not live, not dropped yet (its heartbeat drops at 30 s)
    real_client.zadd(GroupKeys("shop").producers, {"crashed": gone})
    assert legacy_producers(real_client) == [("shop", "crashed"), ("shop", "old")]
    old.leave()  # release 0.1.0's leave: its zset entry is gone; the crashed one's is dropped by this call too
    assert legacy_producers(real_client) == []
    producer_beat(real_client, "shop", "new").beat()
    assert legacy_producers(real_client) == []


def test_a_group_not_registered_is_not_read(real_client: redis.Redis) -> None:
    """Producers register their group with every heartbeat; the registry is what the checker walks."""
    old_beat(real_client, "unlisted", "old").beat()
    assert legacy_producers(real_client) == []


def test_a_registry_member_that_is_no_group_name_is_skipped(
    real_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    register(real_client, "shop", "not a {group}")
    old_beat(real_client, "shop", "old").beat()
    assert legacy_producers(real_client) == [("shop", "old")]
    assert "not a producer group name" in caplog.text


def test_a_group_that_cannot_be_read_raises(real_client: redis.Redis) -> None:
    register(real_client, "shop", "broken")
    old_beat(real_client, "shop", "old").beat()
    real_client.set(GroupKeys("broken").producers, "not a zset")
    with pytest.raises(TxMQError, match="broken"):
        legacy_producers(real_client)


def test_a_client_that_decodes_replies(redis_url: str, real_client: redis.Redis) -> None:
    register(real_client, "shop")
    old_beat(real_client, "shop", "old").beat()
    producer_beat(real_client, "shop", "new").beat()
    with redis.Redis.from_url(redis_url, decode_responses=True) as text_client:
        assert legacy_producers(text_client) == [("shop", "old")]


def test_a_running_producer_records_its_layout(real_client: redis.Redis, make_producer: Any) -> None:
    """The sync and the asyncio producer: a record beside its heartbeat while it runs, none once it shut down."""
    settings = Settings(heartbeat_interval=0.2)
    with make_producer("shop", ScriptedListener(), client=real_client, settings=settings):
        instance = wait_until(lambda: real_client.hkeys(GroupKeys("shop").layouts))[0]
        assert real_client.zscore(GroupKeys("shop").producers, instance) is not None
        assert real_client.hget(GroupKeys("shop").layouts, instance) == str(LAYOUT_VERSION).encode()
        wait_until(lambda: real_client.sismember(GROUP_REGISTRY, "shop"))
        assert legacy_producers(real_client) == []
    assert layouts(real_client, "shop") == {}


@pytest.fixture
def cluster_client(cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def test_legacy_producers_on_a_cluster(cluster_client: RedisCluster) -> None:
    """Groups in the slots of different masters: each group's keys are read on its own master."""
    groups = [f"group-{n}" for n in range(12)]
    masters = {cluster_client.get_node_from_key(GroupKeys(g).producers).name for g in groups}
    assert len(masters) > 1
    register(cluster_client, *groups)
    for group in groups:
        producer_beat(cluster_client, group, "new").beat()
    for group in groups[::3]:
        old_beat(cluster_client, group, "old").beat()
    assert legacy_producers(cluster_client) == [(g, "old") for g in sorted(groups[::3])]
