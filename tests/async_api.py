"""Run the asyncio producer behind the sync producer's interface, so that one behaviour test covers both APIs.

A test asks for ``make_producer`` and gets the sync :class:`redis_txmq.TransactionProducer` or, in the ``async``
variant, :class:`redis_txmq.asyncio.TransactionProducer` on a ``redis.asyncio`` client of the same server, driven
from the test's thread through an event loop of its own (the listener the test passes runs in a thread, as the
asyncio producer runs any sync listener).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any

import fakeredis
import pytest
import redis.asyncio
import redis.asyncio.cluster
from redis.cluster import RedisCluster

from redis_txmq import TransactionProducer
from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer


class LoopThread:
    """An event loop in a daemon thread; :meth:`run` waits for a coroutine from any other thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-event-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float | None = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class Synced:
    """Any asyncio object behind a sync interface: a method's coroutine is run to its end on the loop."""

    def __init__(self, runner: LoopThread, target: Any) -> None:
        self._runner = runner
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            return self._runner.run(result) if asyncio.iscoroutine(result) else result

        return call


class SyncTransaction:
    """An :class:`redis_txmq.asyncio.AsyncTransaction` behind the sync handle's interface."""

    def __init__(self, runner: LoopThread, handle: Any) -> None:
        self._runner = runner
        self._handle = handle

    def __enter__(self) -> SyncTransaction:
        self._runner.run(self._handle.__aenter__())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._runner.run(self._handle.__aexit__(exc_type, exc, tb))

    def commit(self) -> Any:
        return self._runner.run(self._handle.commit())

    def rollback(self) -> Any:
        return self._runner.run(self._handle.rollback())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


class SyncFacade:
    """The asyncio producer behind the sync producer's interface."""

    def __init__(self, runner: LoopThread, producer: AsyncTransactionProducer) -> None:
        self._runner = runner
        self.asyncio_producer = producer

    def start(self) -> SyncFacade:
        self._runner.run(self.asyncio_producer.start())
        return self

    def shutdown(self) -> None:
        self._runner.run(self.asyncio_producer.shutdown())

    def __enter__(self) -> SyncFacade:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    def send_message_in_transaction(self, message: Any, arg: Any = None) -> Any:
        return self._runner.run(self.asyncio_producer.send_message_in_transaction(message, arg))

    def transaction(self, message: Any) -> SyncTransaction:
        return SyncTransaction(self._runner, self.asyncio_producer.transaction(message))

    def flush(self, timeout: float | None = None) -> bool:
        return self._runner.run(self.asyncio_producer.flush(timeout))

    @property
    def broker(self) -> Synced:
        return Synced(self._runner, self.asyncio_producer.broker)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.asyncio_producer, name)


def async_client_like(client: Any) -> Any:
    """A ``redis.asyncio`` client of the server (or cluster) ``client`` talks to (fakeredis: the same fake server)."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        return redis.asyncio.cluster.RedisCluster(host=node.host, port=node.port)
    kwargs = client.connection_pool.connection_kwargs
    if isinstance(client, fakeredis.FakeRedis):
        return fakeredis.FakeAsyncRedis(host=kwargs["host"], port=kwargs["port"])
    return redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0))


ProducerFactory = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    """Which producer API a test runs on."""
    return str(request.param)


@pytest.fixture
def make_producer(api: str, request: pytest.FixtureRequest) -> Iterator[ProducerFactory]:
    """``make_producer(group, listener, client=..., redis_url=..., **options)``: a producer of the test's API."""
    if api == "sync":
        yield TransactionProducer
        return
    runner = LoopThread()
    made: list[Any] = []

    def make(producer_group: str, listener: Any = None, *, client: Any = None, **options: Any) -> SyncFacade:
        if client is not None:
            options["client"] = async_client_like(client)
        producer = AsyncTransactionProducer(producer_group, listener, **options)
        made.append(producer)
        return SyncFacade(runner, producer)

    try:
        yield make
    finally:
        for producer in made:
            runner.run(producer.shutdown())
            if "client" in producer.__dict__ and not producer._owns_client:
                runner.run(producer.client.aclose())
        runner.close()
