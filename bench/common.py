"""What the measurements share: the message body, the listeners, ratio statistics and the keys a run may delete."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import redis.asyncio

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.asyncio import TransactionListener as AsyncTransactionListener
from redis_txmq.checker import Checker
from redis_txmq.core.keys import GROUP_REGISTRY, SCHEDULE, TOPIC_REGISTRY, GroupKeys, TopicKeys
from redis_txmq.transport.connection import connect

BODY = b'{"order_id": 123456, "amount": 42.5, "customer": "someone", "currency": "EUR"}'
"""A typical small order event (79 bytes)."""
TOPIC_PREFIX = "bench-"
"""Every key a measurement writes starts with this (or is a companion key of such a topic): a run against a
shared Redis deletes these and nothing else."""


class Answer(TransactionListener):
    """Answers every local transaction and check-back with one state (None: UNKNOWN, a producer that "crashed")."""

    def __init__(self, state: LocalTransactionState | None) -> None:
        self.state = state

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState | None:
        return self.state

    def check_local_transaction(self, message: Message) -> LocalTransactionState | None:
        return self.state


class AsyncAnswer(AsyncTransactionListener):
    """:class:`Answer` for the asyncio producer: ``async def`` methods, so nothing runs in a thread."""

    def __init__(self, state: LocalTransactionState | None) -> None:
        self.state = state

    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState | None:
        return self.state

    async def check_local_transaction(self, message: Message) -> LocalTransactionState | None:
        return self.state


def delete_topic(client: Any, topic: str) -> None:
    """Delete a bench topic and its companions, one key per call (cluster-safe)."""
    assert topic.startswith(TOPIC_PREFIX), topic
    keys = TopicKeys(topic)
    if client.type(keys.topic_stream) in (b"stream", "stream"):
        for group in client.xinfo_groups(keys.topic_stream):  # the consumers' leases, one hash per group
            name = group["name"]
            client.delete(keys.consumer_leases(name.decode() if isinstance(name, bytes) else name))
    for key in keys.script_keys():
        client.delete(key)
    client.srem(TOPIC_REGISTRY, topic)
    client.zrem(SCHEDULE, topic)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and 10th / 90th percentiles (the median alone for fewer than 4 values)."""
    ordered = sorted(values)
    median = statistics.median(ordered)
    if len(ordered) < 4:
        return {"median": median, "p10": ordered[0], "p90": ordered[-1]}
    deciles = statistics.quantiles(ordered, n=10)
    return {"median": median, "p10": deciles[0], "p90": deciles[-1]}


class TopicChecker(Checker):
    """A checker that scans only the given bench topics: against a shared Redis it must not check (with the
    bench's short timeouts) transactions of real topics."""

    def __init__(self, client: Any, settings: Any, topics: list[str], **options: Any) -> None:
        super().__init__(client, settings, only_topics=topics, **options)
        self._bench_topics = [TopicKeys(topic) for topic in topics]

    def topics(self) -> list[TopicKeys]:
        return self._bench_topics


def delete_groups(client: Any) -> None:
    """Delete the check-request keys of every bench producer group (after its producers have shut down)."""
    for member in client.smembers(GROUP_REGISTRY):
        group = member.decode()
        if group.startswith(TOPIC_PREFIX):
            keys = GroupKeys(group)
            client.delete(keys.check_requests)
            client.delete(keys.producers)
            client.srem(GROUP_REGISTRY, member)


def server_cpu_seconds(client: Any) -> float:
    """The server's CPU time so far: its main thread's where it reports it (Redis >= 7), else the process's."""
    info = client.info("cpu")
    if "used_cpu_user_main_thread" in info:
        return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def answering_producer(url: str, group: str, settings: Settings, ready: Any, stop: Any) -> None:
    """A live instance of producer group ``group``, in its own process as in production, answering COMMIT (a
    ``multiprocessing`` target: ``ready`` is set once it runs, ``stop`` ends it)."""
    client = connect(url)
    with TransactionProducer(group, Answer(LocalTransactionState.COMMIT), client=client, settings=settings):
        ready.set()
        stop.wait(900)
    client.close()


def async_client_of(client: Any, max_connections: int) -> Any:
    """A ``redis.asyncio`` client of the server ``client`` talks to, its pool as deep as the sends in flight."""
    kwargs = client.connection_pool.connection_kwargs
    return redis.asyncio.Redis(
        connection_pool=redis.asyncio.BlockingConnectionPool(
            host=kwargs.get("host", "localhost"),
            port=kwargs.get("port", 6379),
            db=kwargs.get("db", 0),
            password=kwargs.get("password"),
            max_connections=max_connections,
            timeout=None,
        )
    )
