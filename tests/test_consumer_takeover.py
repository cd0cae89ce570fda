"""Only a consumer that died loses its messages: a live one keeps what it holds however long its handler takes, a
handler is never called for a message its consumer no longer owns, and a stopped consumer finishes the message in
hand and hands the rest back, for another consumer to take at once.

Each test runs on both APIs (``api``, from ``tests/test_consumer.py``), against a real redis-server. The run tests
give the asyncio consumer a handler that awaits (``asyncio.sleep``), as a real one must: a handler that blocks the
event loop blocks the consumer's heartbeat too.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redis_txmq import ConsumedMessage, Settings
from redis_txmq.core.keys import TopicKeys

from .helpers import wait_until
from .test_consumer import COMMIT, AsyncioApi, SyncApi, send

pytestmark = pytest.mark.real

FAST_HEARTBEAT = Settings(heartbeat_interval=0.2)
"""A lease of 0.6 s: a consumer that stops renewing it is seen dead quickly."""
KEYS = TopicKeys("orders")


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[SyncApi | AsyncioApi]:
    chosen = SyncApi() if request.param == "sync" else AsyncioApi()
    yield chosen
    chosen.close()


class Runner:
    """``consumer.run`` in a thread, its handler taking ``seconds`` (awaited on asyncio) and recording each call;
    while ``release`` is clear, a handler waits (``held``: clear from the start, before the thread can read)."""

    def __init__(
        self, api: Any, consumer: Any, seconds: float, calls: list[tuple[str, str]], *, held: bool = False
    ) -> None:
        self.consumer = consumer
        self.started = threading.Event()
        self.release = threading.Event()
        if not held:
            self.release.set()
        self.handled = 0

        def record(message: ConsumedMessage) -> None:
            calls.append((consumer.consumer_name, message.id))
            self.started.set()

        if isinstance(api, AsyncioApi):

            async def handle(message: ConsumedMessage) -> None:
                record(message)
                await asyncio.sleep(seconds)
                while not self.release.is_set():
                    await asyncio.sleep(0.01)

            def target() -> None:
                self.handled = api.runner.run(consumer.consumer.run(handle), timeout=None)

        else:

            def handle(message: ConsumedMessage) -> None:
                record(message)
                time.sleep(seconds)
                self.release.wait()

            def target() -> None:
                self.handled = consumer.run(handle)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.consumer.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "run() returned after stop()"


def pending_of(client: redis.Redis) -> int:
    return int(client.xpending("orders", "billing")["pending"])


@pytest.mark.parametrize("max_deliveries", [16, 1])
def test_two_live_consumers_with_slow_handlers_never_take_each_others_messages(api, real_client, max_deliveries):
    """Handlers of 0.6 s, batches of 3, ``min_idle_time`` 1 s. The first consumer's handler is held on its first
    message until the rest of its batch is older than ``min_idle_time`` and a second consumer has polled (its first
    poll makes a claim walk); then both run on. Each message is handled once, by the consumer that read it, and none
    is dead-lettered (with ``max_deliveries=1`` a takeover would dead-letter a message that its handler then
    applied)."""
    send(real_client, [COMMIT] * 12)
    calls: list[tuple[str, str]] = []
    options = {"batch_size": 3, "min_idle_time": 1.0, "block": 0.05, "max_deliveries": max_deliveries}

    def start(name: str) -> Runner:
        c = api.Consumer("orders", "billing", name, client=real_client, settings=FAST_HEARTBEAT, **options)
        return Runner(api, c, 0.6, calls, held=name == "a")

    first = start("a")
    runners = [first]
    try:
        wait_until(lambda: calls and oldest_idle_ms(real_client) >= 1000, 30)
        runners.append(start("b"))
        wait_until(lambda: any(name == "b" for name, _ in calls), 30)
        first.release.set()
        wait_until(lambda: len({message_id for _, message_id in calls}) == 12 and pending_of(real_client) == 0, 60)
    finally:
        first.release.set()
        for runner in runners:
            runner.stop()
    counts = collections.Counter(message_id for _, message_id in calls)
    assert [m for m, n in counts.items() if n > 1] == [], "no message handled twice"
    assert real_client.xlen(KEYS.consumer_dead_stream("billing")) == 0, "nothing a live consumer held dead-lettered"


def oldest_idle_ms(client: redis.Redis) -> int:
    entries = client.xpending_range("orders", "billing", "-", "+", 100)
    return max((int(entry["time_since_delivered"]) for entry in entries), default=0)


def test_a_handler_is_never_called_for_a_message_its_consumer_no_longer_owns(api, real_client):
    """Another consumer took the second message of the batch (a consumer of an older release, which claims by idle
    time only): the first consumer does not hand it to its handler, and handles the others."""
    send(real_client, [COMMIT] * 3)
    calls: list[tuple[str, str]] = []
    c = api.Consumer("orders", "billing", "a", client=real_client, batch_size=3, block=0.05, min_idle_time=60)
    runner = Runner(api, c, 0.0, calls, held=True)
    try:
        assert runner.started.wait(10)
        first, second, third = (entry_id.decode() for entry_id, _ in real_client.xrange("orders"))
        assert calls == [("a", first)]
        assert real_client.xclaim("orders", "billing", "older-release", 0, [second], justid=True) == [second.encode()]
        runner.release.set()
        wait_until(lambda: len(calls) == 2 and pending_of(real_client) == 1)
    finally:
        runner.release.set()
        runner.stop()
    assert calls == [("a", first), ("a", third)]
    (held,) = real_client.xpending_range("orders", "billing", "-", "+", 10)
    assert (held["message_id"].decode(), held["consumer"]) == (second, b"older-release")


def test_stop_finishes_the_message_in_hand_and_hands_the_rest_back(api, real_client):
    """A batch of 10, stopped during the first handler: run() returns once that one is handled, and another
    consumer whose ``min_idle_time`` is an hour takes the other nine at once, as first deliveries (with
    ``max_deliveries=1``, none is dead-lettered)."""
    send(real_client, [COMMIT] * 10)
    calls: list[tuple[str, str]] = []
    first = api.Consumer(
        "orders", "billing", "first", client=real_client, batch_size=10, block=0.05, min_idle_time=3600
    )
    runner = Runner(api, first, 0.0, calls, held=True)
    assert runner.started.wait(10)
    stop_now(api, first)  # while the handler has the first message in hand
    runner.release.set()
    runner.thread.join(30)
    assert runner.handled == 1 and len(calls) == 1, "only the message in hand was handled"
    first.close()

    second = api.Consumer(
        "orders", "billing", "second", client=real_client, block=0.05, min_idle_time=3600, max_deliveries=1
    )
    handed_back = second.poll()
    ids = [entry_id.decode() for entry_id, _ in real_client.xrange("orders")]
    assert [m.id for m in handed_back] == ids[1:]
    assert {m.delivery_count for m in handed_back} == {1}, "handed back undelivered: no delivery counted"
    assert real_client.xlen(KEYS.consumer_dead_stream("billing")) == 0
    members = [info["name"] for info in real_client.xinfo_consumers("orders", "billing")]
    assert members == [b"second"], "the consumer that stopped is removed once it holds nothing"
    assert list(real_client.hgetall(KEYS.consumer_leases("billing"))) == [b"second"]


def test_iteration_stops_after_the_message_in_hand_and_hands_the_rest_back(api, real_client):
    send(real_client, [COMMIT] * 5)
    first = api.Consumer("orders", "billing", "first", client=real_client, block=0.05, min_idle_time=3600)
    seen = []
    for message in first:
        seen.append(message.id)
        first.ack(message)
        first.stop()
    assert len(seen) == 1
    first.close()
    second = api.Consumer("orders", "billing", "second", client=real_client, block=0.05, min_idle_time=3600)
    assert len(second.poll()) == 4


def test_a_consumer_whose_lease_ran_out_has_its_messages_taken_over(api, real_client):
    """The consumer stops renewing its lease (its process froze or died): once the lease ran out and
    ``min_idle_time`` passed, a live consumer takes its messages over."""
    send(real_client, [COMMIT] * 2)
    frozen = api.Consumer(
        "orders", "billing", "frozen", client=real_client, block=0.05, min_idle_time=0.2, settings=FAST_HEARTBEAT
    )
    assert len(frozen.poll()) == 2
    freeze(api, frozen)
    live = api.Consumer(
        "orders", "billing", "live", client=real_client, block=0.05, min_idle_time=0.2, settings=FAST_HEARTBEAT
    )
    taken: list[ConsumedMessage] = []
    wait_until(lambda: taken.extend(live.poll()) or len(taken) == 2)
    assert {m.delivery_count for m in taken} == {2}


def test_a_consumer_of_a_release_before_leases_has_its_messages_taken_over_after_min_idle_time(api, real_client):
    """A consumer of an earlier release writes no lease: its unacked messages are taken over once idle
    ``min_idle_time``, as that release's consumers take each other's."""
    send(real_client, [COMMIT] * 2)
    real_client.xgroup_create("orders", "billing", id="0")
    real_client.xreadgroup("billing", "older-release", {"orders": ">"})
    live = api.Consumer("orders", "billing", "live", client=real_client, block=0.05, min_idle_time=0.2)
    taken: list[ConsumedMessage] = []
    wait_until(lambda: taken.extend(live.poll()) or len(taken) == 2)
    assert {m.delivery_count for m in taken} == {2}


def stop_now(api: Any, consumer: Any) -> None:
    """``consumer.stop()``, done when this returns (the asyncio consumer's is called on its event loop)."""
    if isinstance(api, AsyncioApi):

        async def stop() -> None:
            consumer.consumer.stop()

        api.runner.run(stop())
    else:
        consumer.stop()


def freeze(api: Any, consumer: Any) -> None:
    """Stop ``consumer``'s heartbeat without handing anything back, as a process that froze or died."""
    target = consumer.consumer if isinstance(api, AsyncioApi) else consumer
    heartbeat = target._heartbeat
    if isinstance(api, AsyncioApi):
        api.runner.run(heartbeat.stop(5))
    else:
        heartbeat.stop(5)
    target._heartbeat = None


def test_close_while_run_checks_its_next_message_never_lets_two_handlers_run_on_it(real_client, redis_url):
    """``close()`` from another thread lands while ``run()`` is between its ownership check and its handler: the
    hand-back waited for ``run()`` (it handed everything back, the lease at 0, and ``run()`` still called its
    handler on the message another consumer then took: two handlers on one message)."""
    from redis_txmq import Consumer

    keys = TopicKeys("close-race")
    for trial in range(12):
        group = f"g{trial}"
        for i in range(100):
            real_client.xadd(keys.topic_stream, {"body": b"%d" % i})
        consumer = Consumer("close-race", group, "a", redis_url=redis_url, batch_size=100, block=0.05)
        closing = threading.Event()
        late: list[str] = []

        def handler(
            message: ConsumedMessage, closing: threading.Event = closing, late: list[str] = late, group: str = group
        ) -> None:
            if closing.is_set():
                late.append(message.id)
                time.sleep(0.05)  # the hand-back, had it not waited, lands meanwhile
                if real_client.hget(keys.consumer_leases(group), "a") in (None, b"0"):
                    late.append("handed back while its handler runs: another consumer takes it")

        failures: list[BaseException] = []

        def run(handler: Any = handler, failures: list[BaseException] = failures, consumer: Any = consumer) -> None:
            try:
                consumer.run(lambda message: handler(message))
            except BaseException as exc:  # noqa: BLE001 - the test's thread reports it
                failures.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        time.sleep(0.005 * (trial % 6))
        closing.set()
        consumer.close()
        runner.join(30)
        assert not runner.is_alive()
        assert not failures, failures
        lease = real_client.hget(keys.consumer_leases(group), "a")
        if late:  # at most the message already in hand when close() came, and it was acked before the hand-back
            assert len(late) == 1, late
            assert not [
                entry
                for entry in real_client.xpending_range(keys.topic_stream, group, "-", "+", 1000)
                if entry["message_id"].decode() == late[0]
            ], "handled and acked before the hand-back"
        assert lease in (None, b"0"), "handed back once run() was done"
