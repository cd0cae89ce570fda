"""An upgrade from release 0.1.0 with transactions in flight, both directions: producers and checkers of either
release side by side on one Redis, processes that die in their local transactions, a rolling upgrade.

Each test ends the same way: every transaction any producer prepared has ended, each one that commits is in the topic
stream exactly once, none that rolls back is (``conftest.assert_exactly_once``). Who decides is the body's kind
(``roles.py``), answered alike by every process of either release, as a service's database would.
"""

from __future__ import annotations

import pytest
import redis

from redis_txmq.core.keys import CHECKER_INSTANCES, GroupKeys
from redis_txmq.core.layout import LAYOUT_VERSION, legacy_producers

from ..helpers import wait_until
from .conftest import Fleet, assert_exactly_once

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(120)]

GROUP, TOPIC, OTHER_TOPIC = "shop", "orders", "payments"
PRODUCERS = GroupKeys(GROUP).producers


def listed(client: redis.Redis) -> set[str]:
    """The instances the group's heartbeat zset lists (live, or gone and not dropped yet)."""
    return {member.decode() for member in client.zrange(PRODUCERS, 0, -1)}


def test_an_old_producer_dies_with_transactions_in_flight_and_the_new_release_resolves_them(
    fleet: Fleet, real_client: redis.Redis
) -> None:
    """(a) A producer of 0.1.0 prepares 8 transactions and dies in their local transactions; a new checker and a new
    producer of the same group (which sends some of its own into the same topic) end them all."""
    fleet.producer("old", "old", "--send", "4", "--crash", "8")
    fleet.crashed("old")
    fleet.producer("new", "new", "--send", "4", "--serve")
    fleet.checker("checker", "new")
    assert assert_exactly_once(fleet, real_client, TOPIC) == 16


def test_an_old_producer_gone_long_before_the_new_checker_starts(fleet: Fleet, real_client: redis.Redis) -> None:
    """(a) The same, but the dead producer of 0.1.0 was dropped from its group's heartbeat zset (ten live periods
    without a beat) before the new checker started: nothing says any more that a producer of 0.1.0 was there, and its
    transactions are ended all the same."""
    fleet.producer("old", "old", "--crash", "6")
    fleet.crashed("old")
    fleet.producer("new", "new", "--serve")
    for instance in listed(real_client):
        real_client.zadd(PRODUCERS, {instance: 0}, xx=True)  # the old one's last beat long ago (and the new one's,
    # which its next beat writes again); that beat drops the old one
    wait_until(lambda: len(listed(real_client)) == 1 and not legacy_producers(real_client), timeout=10)
    fleet.checker("checker", "new")
    assert assert_exactly_once(fleet, real_client, TOPIC) == 6


def test_a_new_producer_dies_with_transactions_in_flight_and_the_old_release_resolves_them(
    fleet: Fleet, real_client: redis.Redis
) -> None:
    """(b) A downgrade, or a new producer started before the checkers were upgraded: a producer of this release
    prepares 8 transactions and dies; a checker and a producer of 0.1.0 end them all."""
    fleet.producer("new", "new", "--send", "4", "--crash", "8")
    fleet.crashed("new")
    fleet.producer("old", "old", "--send", "4", "--serve")
    fleet.checker("checker", "old")
    assert assert_exactly_once(fleet, real_client, TOPIC) == 16


def test_a_rolling_upgrade_checkers_first_then_producers(fleet: Fleet, real_client: redis.Redis) -> None:
    """(c) 0.1.0 runs: a checker, a producer sending all along (a quarter of its transactions left UNKNOWN for the
    check-back). One producer dies with transactions in flight; the checker is replaced by a new one (started first,
    then the old one stopped); another producer of 0.1.0 sends to a topic nothing else writes to (nothing wakes it
    for the new checker) and dies mid-way; then the producers are replaced: a new one starts, the old one stops
    cleanly (leaving its group with UNKNOWN transactions in flight), a new one dies with transactions in flight.
    Every transaction ends exactly once."""
    fleet.checker("old-checker", "old")
    fleet.producer("old-1", "old", "--send", "-1", "--pace", "0.05", "--serve")
    wait_until(lambda: fleet.count("old-1") >= 8, timeout=20)
    fleet.producer("old-2", "old", "--send", "4", "--crash", "4")
    fleet.crashed("old-2")

    fleet.checker("new-checker", "new")
    wait_until(lambda: real_client.zcard(CHECKER_INSTANCES) == 2, timeout=20)
    fleet.stop("old-checker")
    fleet.producer("old-3", "old", "--send", "8", "--pace", "0.05", "--crash", "4", topic=OTHER_TOPIC)
    fleet.crashed("old-3")

    fleet.producer("new-1", "new", "--send", "40", "--pace", "0.05", "--serve")
    wait_until(lambda: fleet.count("new-1") >= 4, timeout=20)
    fleet.stop("old-1")
    fleet.producer("new-2", "new", "--send", "4", "--crash", "4")
    fleet.crashed("new-2")
    wait_until(lambda: fleet.sent("new-1"), timeout=20)
    assert assert_exactly_once(fleet, real_client, OTHER_TOPIC) == 12
    assert assert_exactly_once(fleet, real_client, TOPIC) >= 8 + 8 + 40 + 8


def test_a_rolling_upgrade_producers_first_then_checkers(fleet: Fleet, real_client: redis.Redis) -> None:
    """(c) The other order: 0.1.0's checker and producer run; a new producer starts and the old one stops cleanly
    with UNKNOWN transactions in flight, a new producer dies with transactions in flight while only the old checker
    runs; then the checker is replaced. Every transaction ends exactly once."""
    fleet.checker("old-checker", "old")
    fleet.producer("old-1", "old", "--send", "-1", "--pace", "0.05", "--serve")
    wait_until(lambda: fleet.count("old-1") >= 8, timeout=20)

    fleet.producer("new-1", "new", "--send", "40", "--pace", "0.05", "--serve")
    wait_until(lambda: fleet.count("new-1") >= 4, timeout=20)
    fleet.stop("old-1")
    fleet.producer("new-2", "new", "--send", "4", "--crash", "4")
    fleet.crashed("new-2")

    fleet.checker("new-checker", "new")
    wait_until(lambda: real_client.zcard(CHECKER_INSTANCES) == 2, timeout=20)
    fleet.stop("old-checker")
    wait_until(lambda: fleet.sent("new-1"), timeout=20)
    total = assert_exactly_once(fleet, real_client, TOPIC)
    assert total >= 8 + 40 + 8


def test_a_new_checker_tells_a_live_old_producer_by_its_missing_layout_record(
    fleet: Fleet, real_client: redis.Redis
) -> None:
    """(d) A new checker runs; a producer of 0.1.0 starts and sends (a quarter of its transactions UNKNOWN, for the
    check-back): :func:`legacy_producers` lists it, and its transactions end within seconds. A new producer beside it
    records its layout and is not listed; once the old one has stopped (its leave), nothing is."""
    fleet.checker("checker", "new")
    wait_until(lambda: real_client.zcard(CHECKER_INSTANCES) == 1, timeout=20)
    fleet.producer("old", "old", "--send", "8", "--serve")
    legacy = wait_until(lambda: legacy_producers(real_client), timeout=20)
    assert [group for group, _ in legacy] == [GROUP]
    old_instance = legacy[0][1]
    assert not real_client.hexists(GroupKeys(GROUP).layouts, old_instance)
    wait_until(lambda: fleet.sent("old"), timeout=20)
    assert assert_exactly_once(fleet, real_client, TOPIC, timeout=15) == 8

    fleet.producer("new", "new", "--serve")
    records = wait_until(lambda: real_client.hgetall(GroupKeys(GROUP).layouts), timeout=20)
    assert list(records.values()) == [str(LAYOUT_VERSION).encode()]
    new_instance = next(iter(records)).decode()
    assert legacy_producers(real_client) == [(GROUP, old_instance)]
    assert listed(real_client) == {old_instance, new_instance}

    fleet.stop("old")
    assert legacy_producers(real_client) == []
    assert listed(real_client) == {new_instance}
    assert real_client.hgetall(GroupKeys(GROUP).layouts) == {new_instance.encode(): str(LAYOUT_VERSION).encode()}
