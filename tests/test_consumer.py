"""Consumer groups over topic streams: ack, re-delivery after a consumer dies, delivery limit, bad entries.

Each behaviour test runs on both APIs (fixture ``api``): :class:`redis_txmq.Consumer`, and
:class:`redis_txmq.asyncio.Consumer` driven through :class:`AsyncioApi`, which runs its coroutines on an event loop
in a thread (``tests/async_api.py``), so that a test is written once against the sync surface. The asyncio consumer
gets its own ``redis.asyncio`` client to the same server as the test's client (fakeredis, a redis-server, the
cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from redis_txmq import (
    ConfigurationError,
    Consumer,
    LocalTransactionState,
    Message,
    TransactionProducer,
    TxMQConnectionError,
    create_topic,
)
from redis_txmq.asyncio.consumer import Consumer as AsyncConsumer
from redis_txmq.core.groups import ensure_consumer_group, forget_dead_consumers
from redis_txmq.core.keys import TopicKeys
from redis_txmq.transport.embedded import free_port, wait_for_ping

from .async_api import LoopThread, Synced, async_client_like
from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK


class SyncApi:
    """The sync consumer, as it is."""

    logger = "redis_txmq.sync.consumer"

    def Consumer(self, *args: Any, **kwargs: Any) -> Consumer:
        return Consumer(*args, **kwargs)

    def twin(self, client: Any) -> Any:
        """The client this API's consumers use where a test passes ``client``."""
        return client

    def close(self) -> None:
        pass


class AsyncConsumerFacade(Synced):
    """An asyncio consumer behind the sync consumer's surface; ``run`` hands it an ``async def`` wrapper of the
    test's handler, so that the run tests await a handler."""

    def __init__(self, runner: LoopThread, *args: Any, **kwargs: Any) -> None:
        async def started() -> AsyncConsumer:
            return await AsyncConsumer(*args, **kwargs).__aenter__()

        super().__init__(runner, runner.run(started()))
        self.consumer = self._target

    def __iter__(self) -> Iterator[Any]:
        messages = self.consumer.__aiter__()

        async def next_message() -> Any:
            return await messages.__anext__()

        while True:
            try:
                yield self._runner.run(next_message())
            except StopAsyncIteration:
                return

    def run(self, handler: Callable[[Any], Any], *, max_messages: int | None = None) -> int:
        async def handle(message: Any) -> Any:
            return handler(message)

        return self._runner.run(self.consumer.run(handle, max_messages=max_messages))

    def stop(self) -> None:
        self._runner.loop.call_soon_threadsafe(self.consumer.stop)

    def __enter__(self) -> AsyncConsumerFacade:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class AsyncioApi:
    """The asyncio consumer, driven from the test's thread through :class:`AsyncConsumerFacade`."""

    logger = "redis_txmq.asyncio.consumer"

    def __init__(self) -> None:
        self.runner = LoopThread()
        self._twins: dict[int, Any] = {}
        self._consumers: list[AsyncConsumerFacade] = []

    def Consumer(self, *args: Any, client: Any = None, **kwargs: Any) -> AsyncConsumerFacade:
        if client is not None:
            kwargs["client"] = self.twin(client)
        consumer = AsyncConsumerFacade(self.runner, *args, **kwargs)
        self._consumers.append(consumer)
        return consumer

    def twin(self, client: Any) -> Any:
        """A ``redis.asyncio`` client to the server of the test's ``client``, one per test and client."""
        if id(client) not in self._twins:
            self._twins[id(client)] = async_client_like(client)
        return self._twins[id(client)]

    def close(self) -> None:
        for consumer in self._consumers:
            self.runner.run(consumer.consumer.close())
        for twin in self._twins.values():
            self.runner.run(twin.aclose())
        self.runner.run(self.runner.loop.shutdown_asyncgens())
        self.runner.close()


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[SyncApi | AsyncioApi]:
    """The same behaviour test runs on the sync consumer and on the asyncio one."""
    chosen = SyncApi() if request.param == "sync" else AsyncioApi()
    yield chosen
    chosen.close()


@pytest.fixture
def cluster(cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


@pytest.fixture(params=["fakeredis", "redis-server", "cluster"])
def any_client(request: pytest.FixtureRequest) -> Any:
    """``client``, and the 3-master cluster as well."""
    if request.param == "cluster":
        return request.getfixturevalue("cluster")
    return request.getfixturevalue("fake_client" if request.param == "fakeredis" else "real_client")


def send(client, outcomes, topic="orders", first=0):
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        return [
            producer.send_message_in_transaction(
                Message(topic, f"m{i}".encode(), keys=f"k{i}", properties={"i": str(i)}), outcome
            )
            for i, outcome in enumerate(outcomes, first)
        ]


def consumer(api, client, name="c1", **kwargs):
    kwargs.setdefault("block", 0.05)
    return api.Consumer("orders", "billing", name, client=client, **kwargs)


def die(api: SyncApi | AsyncioApi, c: Any, client: Any, topic: str = "orders", group: str = "billing") -> None:
    """``c`` dies as a process would, in an instant: its heartbeat stops, nothing is handed back, and its lease
    (``TopicKeys.consumer_leases``) is past, as it is three heartbeat intervals after its last beat."""
    target = c.consumer if isinstance(api, AsyncioApi) else c
    heartbeat, target._heartbeat = target._heartbeat, None
    if isinstance(api, AsyncioApi):
        api.runner.run(heartbeat.stop(5))
    else:
        heartbeat.stop(5)
    target._lease_held = False
    for keys in target.partitions:
        client.hset(keys.consumer_leases(group), target.consumer_name, 1)


def drain(c, rounds=5):
    seen = []
    for _ in range(rounds):
        seen.extend(c.poll())
    return seen


def test_consumer_sees_committed_only_and_ack_clears_pending(api, any_client):
    client = any_client
    results = send(client, [COMMIT, ROLLBACK, COMMIT])
    c = consumer(api, client)
    messages = drain(c)
    assert [m.body for m in messages] == [b"m0", b"m2"]
    assert [m.transaction_id for m in messages] == [results[0].transaction_id, results[2].transaction_id]
    assert messages[0].keys == ["k0"] and messages[0].properties == {"i": "0"} and messages[0].delivery_count == 1
    assert messages[0].id == results[0].committed_id and messages[0].timestamp_ms > 0
    assert client.xpending("orders", "billing")["pending"] == 2
    for m in messages:
        c.ack(m)
    assert client.xpending("orders", "billing")["pending"] == 0


def test_group_starts_from_the_beginning_by_default(api, client):
    send(client, [COMMIT])
    assert [m.body for m in drain(consumer(api, client))] == [b"m0"]


def test_unacked_message_of_dead_consumer_is_redelivered(api, any_client):
    client = any_client
    send(client, [COMMIT])
    dead = consumer(api, client, "dead", min_idle_time=0.1)
    assert [m.body for m in dead.poll()] == [b"m0"]
    die(api, dead, client)  # ...without acking
    survivor = consumer(api, client, "survivor", min_idle_time=0.1)
    redelivered = wait_until(lambda: survivor.poll())
    assert [m.body for m in redelivered] == [b"m0"] and redelivered[0].delivery_count == 2
    survivor.ack(redelivered[0])
    assert client.xpending("orders", "billing")["pending"] == 0


def test_delivery_limit_moves_entry_to_dead_letters(api, client):
    send(client, [COMMIT, COMMIT])
    c = consumer(api, client, min_idle_time=0.05, max_deliveries=2)
    first = drain(c, 2)
    ok = next(m for m in first if m.body == b"m1")
    c.ack(ok)
    deliveries = [m.delivery_count for m in first if m.body == b"m0"]
    wait_until(lambda: deliveries.extend(m.delivery_count for m in c.poll()) or len(c.dead_letters()) == 1)
    assert deliveries == [1, 2], "delivered at most max_deliveries times"
    ((dead_id, dead),) = c.dead_letters()
    assert dead["body"] == b"m0" and dead["dead_reason"] == b"delivery limit 2 reached"
    assert dead["dead_delivery_count"] == b"3" and dead["dead_group"] == b"billing"
    assert client.xpending("orders", "billing")["pending"] == 0
    assert client.xlen("orders") == 2, "the topic stream is never changed by a consumer"


def test_handler_failures_are_retried_then_dead_lettered(api, client):
    send(client, [COMMIT, COMMIT])
    c = consumer(api, client, min_idle_time=0.05, max_deliveries=3)
    calls = []

    def handler(message):
        calls.append(message.body)
        if message.body == b"m0":
            raise ValueError("cannot bill")

    worker = threading.Thread(target=c.run, args=(handler,))
    worker.start()
    try:
        wait_until(c.dead_letters)
    finally:
        c.stop()
        worker.join(timeout=10)
    assert not worker.is_alive()
    assert calls.count(b"m1") == 1 and calls.count(b"m0") == 3
    assert [d["body"] for _, d in c.dead_letters()] == [b"m0"]


def test_malformed_entry_is_dead_lettered_and_consumer_goes_on(api, client, caplog):
    client.xadd("orders", {"hello": "world"})
    send(client, [COMMIT])
    c = consumer(api, client)
    assert [m.body for m in drain(c)] == [b"m0"]
    ((_, dead),) = c.dead_letters()
    assert dead["hello"] == b"world" and dead["dead_reason"].startswith(b"malformed entry")
    assert any("malformed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("properties", [b'["not", "an", "object"]', b'{"n": 1}', b"{not json"])
def test_entry_with_malformed_properties_is_dead_lettered_and_the_consumer_goes_on(api, client, properties):
    """Entries another tool wrote with a malformed ``properties`` field: dead-lettered with the reason, and the
    consumer goes on with the next message (SPEC §5, bad input)."""
    client.xadd("orders", {"body": b"foreign", "transaction_id": "t" * 32, "properties": properties})
    send(client, [COMMIT])
    c = consumer(api, client)
    assert [m.body for m in drain(c)] == [b"m0"]
    ((_, dead),) = c.dead_letters()
    assert dead["body"] == b"foreign" and dead["properties"] == properties
    assert b"properties" in dead["dead_reason"]


def test_explicit_dead_letter_is_idempotent(api, client):
    send(client, [COMMIT])
    c = consumer(api, client)
    (message,) = drain(c)
    assert c.dead_letter(message, "poison pill") is True
    assert c.dead_letter(message, "poison pill") is False
    assert len(c.dead_letters()) == 1


def test_iteration_stops(api, client):
    send(client, [COMMIT, COMMIT])
    c = consumer(api, client)
    seen = []
    for message in c:
        seen.append(message.body)
        c.ack(message)
        if len(seen) == 2:
            c.stop()
    assert seen == [b"m0", b"m1"]


def test_dead_stream_shares_the_topic_slot():
    keys = TopicKeys("orders")
    assert keys.consumer_dead_stream("billing") == "txmq:{orders}:consumer-dead:billing"


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"min_idle_time": 0}, {"max_deliveries": 0}])
def test_bad_consumer_settings_refused(api, fake_client, kwargs):
    with pytest.raises(ConfigurationError):
        api.Consumer("orders", "billing", client=fake_client, **kwargs)


def test_bad_group_name_refused(api, fake_client):
    with pytest.raises(ConfigurationError):
        api.Consumer("orders", "bad group", client=fake_client)


def consumer_names(client, stream="orders", group="billing"):
    return sorted(info["name"].decode() for info in client.xinfo_consumers(stream, group))


def test_dead_consumer_is_forgotten_once_its_entries_were_claimed(api, client):
    send(client, [COMMIT])
    dead = consumer(api, client, "dead-one", min_idle_time=0.1)
    assert [m.body for m in dead.poll()] == [b"m0"]
    die(api, dead, client)  # ...without acking
    live = consumer(api, client, "live", min_idle_time=0.1)
    (redelivered,) = wait_until(live.poll)
    live.ack(redelivered)
    wait_until(lambda: live.poll() == [] and consumer_names(client) == ["live"])
    assert client.xpending("orders", "billing")["pending"] == 0


def test_a_consumer_holding_an_entry_is_never_forgotten(api, client):
    """Only consumers that hold nothing are forgotten, however long they were idle: removing one that holds an
    entry would drop that entry from the group's pending list, and nobody would ever be given it again."""
    send(client, [COMMIT])
    holder = consumer(api, client, "holder")
    assert [m.body for m in holder.poll()] == [b"m0"]
    client.xgroup_createconsumer("orders", "billing", "idle")

    assert forget_dead_consumers(client, "orders", "billing", "me", idle_ms=0) == ["idle"]
    assert consumer_names(client) == ["holder"]
    assert client.xpending("orders", "billing")["pending"] == 1


def test_a_consumer_reading_one_at_a_time_takes_over_a_dead_consumers_message(api, client):
    send(client, [COMMIT])
    dead = consumer(api, client, "dead", batch_size=1, min_idle_time=0.1)
    assert [m.body for m in dead.poll()] == [b"m0"]
    die(api, dead, client)  # ...without acking
    live = consumer(api, client, "live", batch_size=1, min_idle_time=0.1)
    (taken_over,) = wait_until(live.poll)
    assert (taken_over.body, taken_over.delivery_count) == (b"m0", 2)


def test_a_consumer_group_on_a_key_of_another_type_is_an_error(client):
    """A damaged key (not a stream) is reported when the group is created, not taken for a created group."""
    client.set("orders", "not a stream")
    with pytest.raises(TxMQConnectionError, match="could not create consumer group"):
        ensure_consumer_group(client, "orders", "billing")


@contextlib.contextmanager
def running(c: Any) -> Iterator[list[bytes]]:
    """``c.run`` in a thread, collecting the bodies it handled; it must still run at the end of the block."""
    handled: list[bytes] = []
    worker = threading.Thread(target=c.run, args=(lambda m: handled.append(m.body),))
    worker.start()
    try:
        yield handled
        assert worker.is_alive(), "run() ended instead of riding it out"
    finally:
        c.close()
        worker.join(timeout=10)
    assert not worker.is_alive()


def blocked_readers(client):
    return [c for c in client.client_list() if c["cmd"] == "xreadgroup" and "b" in c["flags"]]


def test_run_survives_dropped_connections(api, real_client, redis_url, caplog):
    caplog.set_level(logging.INFO, logger=api.logger)
    with running(api.Consumer("orders", "billing", "c1", redis_url=redis_url, block=0.2)) as handled:
        send(real_client, [COMMIT])
        wait_until(lambda: handled == [b"m0"])
        killed = set()
        for _ in range(2):
            readers = wait_until(lambda: [r for r in blocked_readers(real_client) if r["id"] not in killed])
            for reader in readers:
                real_client.client_kill_filter(_id=reader["id"])
                killed.add(reader["id"])
        send(real_client, [COMMIT, COMMIT], first=1)
        wait_until(lambda: len(handled) == 3)
    assert handled == [b"m0", b"m1", b"m2"]
    assert real_client.xpending("orders", "billing")["pending"] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("orders" in w and "billing" in w for w in warnings)


def test_run_goes_on_after_redis_lost_its_data(api, real_client, redis_url, caplog):
    caplog.set_level(logging.INFO, logger=api.logger)
    c = api.Consumer("orders", "billing", "c1", redis_url=redis_url, block=0.05, min_idle_time=0.2)
    with running(c) as handled:
        send(real_client, [COMMIT])
        wait_until(lambda: handled == [b"m0"])
        real_client.flushall()
        wait_until(lambda: real_client.exists("orders") and real_client.xinfo_groups("orders"))
        send(real_client, [COMMIT, ROLLBACK, COMMIT], first=1)
        wait_until(lambda: len(handled) == 3)
    assert handled == [b"m0", b"m1", b"m3"]
    assert real_client.xpending("orders", "billing")["pending"] == 0
    assert any("recreat" in r.getMessage() and "billing" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("min_idle_time", [0.001, 30.0], ids=["claim-first", "read-first"])
def test_poll_recreates_a_lost_group(api, client, min_idle_time):
    send(client, [COMMIT])
    c = consumer(api, client, min_idle_time=min_idle_time)
    (first,) = c.poll()
    c.ack(first)
    assert c.poll() == []  # blocks `block`: with the tiny min_idle_time a claim is due when the next poll starts
    client.flushall()
    assert c.poll() == []
    assert [g["name"] for g in client.xinfo_groups("orders")] == [b"billing"]
    client.xadd("orders", {"transaction_id": "tx-after-loss", "body": b"after"})
    (message,) = wait_until(c.poll)
    assert message.body == b"after" and message.transaction_id == "tx-after-loss"


class RestartableRedis:
    """A redis-server without persistence that a test stops and starts again on the same port (data lost)."""

    def __init__(self, workdir) -> None:
        self.binary = shutil.which("redis-server")
        self.workdir = str(workdir)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = None

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [self.binary, *args, "--dir", self.workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_ping(self.url, process=self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def restartable_redis(tmp_path):
    if not shutil.which("redis-server"):
        pytest.skip("needs the redis-server binary")
    server = RestartableRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def test_iteration_rides_out_a_redis_restart(api, restartable_redis, caplog):
    caplog.set_level(logging.INFO, logger=api.logger)
    server = restartable_redis
    publisher = redis.Redis.from_url(server.url)
    c = api.Consumer("orders", "billing", "c1", redis_url=server.url, block=0.05, min_idle_time=0.2)
    seen = []

    def consume():
        for message in c:
            seen.append(message)
            c.ack(message)

    worker = threading.Thread(target=consume)
    worker.start()
    try:
        send(publisher, [COMMIT])
        wait_until(lambda: len(seen) == 1)
        server.stop()
        wait_until(lambda: sum("retrying" in r.getMessage() for r in caplog.records) >= 2)
        with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
            c.ack(seen[0])
        with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
            c.poll(timeout=0)
        with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
            c.dead_letters()
        with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
            api.Consumer("orders", "billing", redis_url=server.url)
        assert worker.is_alive()
        server.start()
        send(publisher, [COMMIT], first=1)
        wait_until(lambda: len(seen) == 2)
    finally:
        c.close()
        worker.join(timeout=10)
        publisher.close()
    assert not worker.is_alive()
    assert [m.body for m in seen] == [b"m0", b"m1"]


def test_redis_errors_are_wrapped(api, fake_client, monkeypatch):
    send(fake_client, [COMMIT])
    c = consumer(api, fake_client)
    (message,) = drain(c, 1)

    def cluster_down(*args, **kwargs):
        raise RedisClusterException("Redis Cluster cannot be connected")

    for command in ("xack", "xrange", "xgroup_destroy"):
        monkeypatch.setattr(api.twin(fake_client), command, cluster_down)
    with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
        c.ack(message)
    with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
        c.dead_letters()
    with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
        c.delete_group()
    monkeypatch.setattr(api.twin(fake_client), "hget", cluster_down)
    with pytest.raises(TxMQConnectionError, match="'orders'.*'billing'"):
        consumer(api, fake_client)


def test_delete_group_after_data_loss_is_not_an_error(api, client):
    c = consumer(api, client)
    client.flushall()
    c.delete_group()
    assert not client.exists("orders")


def test_partitions_are_read_in_turn_and_acked(api, any_client):
    client = any_client
    create_topic(client, "orders", 3)
    send(client, [COMMIT] * 12)
    c = consumer(api, client)
    seen = []
    for _ in range(10):
        for message in c.poll():
            seen.append((message.partition, message.body))
            c.ack(message)
    assert sorted(body for _, body in seen) == sorted(f"m{i}".encode() for i in range(12))
    assert {partition for partition, _ in seen} == {0, 1, 2}
    for p in range(3):
        assert client.xpending(TopicKeys("orders", p, partitioned=True).topic_stream, "billing")["pending"] == 0


# The asyncio consumer's own behaviour.


@pytest.mark.parametrize("read", ["poll", "iteration"])
def test_a_cancelled_read_leaves_the_asyncio_consumer_usable(real_client, redis_url, read):
    """redis-py's asyncio client drops the connection of a cancelled command: the next read gets a new one, and no
    stale blocked read takes the next message."""

    async def scenario():
        async with AsyncConsumer("orders", "billing", "c1", redis_url=redis_url, block=30) as c:

            async def read_one():
                if read == "poll":
                    return await c.poll()
                async for message in c:
                    return [message]

            blocked = asyncio.create_task(read_one())
            await asyncio.to_thread(wait_until, lambda: blocked_readers(real_client))
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            send(real_client, [COMMIT])
            (message,) = await asyncio.wait_for(read_one(), timeout=10)
            await c.ack(message)
            return message

    message = asyncio.run(scenario())
    assert message.body == b"m0" and message.delivery_count == 1
    assert real_client.xpending("orders", "billing")["pending"] == 0


def test_asyncio_run_awaits_async_handlers_and_calls_plain_ones_on_the_loop(fake_client):
    send(fake_client, [COMMIT] * 4)

    async def scenario():
        loop_thread = threading.get_ident()
        seen = []

        def plain(message):
            seen.append((message.body, threading.get_ident() == loop_thread))

        async def coroutine(message):
            await asyncio.sleep(0)
            seen.append((message.body, True))

        client = async_client_like(fake_client)
        async with AsyncConsumer("orders", "billing", "c1", client=client, block=0.05, batch_size=2) as c:
            assert await c.run(plain, max_messages=2) == 2
            assert await c.run(coroutine, max_messages=2) == 2
        await client.aclose()
        return seen

    assert asyncio.run(scenario()) == [(b"m0", True), (b"m1", True), (b"m2", True), (b"m3", True)]
    assert fake_client.xpending("orders", "billing")["pending"] == 0


def test_asyncio_consumer_sets_itself_up_on_first_use(fake_client):
    send(fake_client, [COMMIT])

    async def scenario():
        client = async_client_like(fake_client)
        c = AsyncConsumer("orders", "billing", "c1", client=client, block=0.05)
        assert c.partitions == [], "the constructor does no I/O"
        (message,) = await c.poll()
        await c.ack(message)
        await c.close()
        await client.aclose()
        return message

    assert asyncio.run(scenario()).body == b"m0"
    assert fake_client.xpending("orders", "billing")["pending"] == 0


def test_each_consumer_refuses_a_client_of_the_other_api(fake_client):
    with pytest.raises(ConfigurationError, match="asyncio"):
        Consumer("orders", "billing", client=fakeredis.FakeAsyncRedis())
    with pytest.raises(ConfigurationError, match="asyncio"):
        AsyncConsumer("orders", "billing", client=fake_client)


def test_a_poll_of_a_partitioned_topic_raises_while_its_only_redis_is_down(api, restartable_redis):
    """On one server every partition is down together: the poll raises (iteration and run() back off) instead of
    returning nothing at once, which made run() spin."""
    server = restartable_redis
    publisher = redis.Redis.from_url(server.url)
    create_topic(publisher, "orders", 2)
    c = api.Consumer("orders", "billing", "c1", redis_url=server.url, block=0.05, min_idle_time=600)
    try:
        c.poll()  # the claim walk runs here; the next one is minutes away
        server.stop()
        with pytest.raises(TxMQConnectionError, match="'orders'"):
            c.poll(timeout=0)
    finally:
        c.close()
        publisher.close()


def test_the_sync_consumer_refuses_an_async_handler_and_acks_nothing(real_client):
    """An ``async def`` handler given to the sync consumer would return a coroutine that never runs, and the message
    would be acked as handled: refused at once; a plain handler returning an awaitable is refused per message, which
    stays pending."""
    send(real_client, [COMMIT])
    c = Consumer("orders", "billing", "c1", client=real_client, block=0.05)

    async def bill(message: Any) -> None:
        raise AssertionError("never runs")

    with pytest.raises(ConfigurationError, match="async def"):
        c.run(bill, max_messages=1)

    def wrapped(message: Any) -> Any:
        return bill(message)

    runner = threading.Thread(target=c.run, args=(wrapped,), daemon=True)
    runner.start()
    wait_until(lambda: real_client.xpending("orders", "billing")["pending"] == 1)
    c.close()
    runner.join(10)
    assert real_client.xpending("orders", "billing")["pending"] == 1, "nothing acked"
