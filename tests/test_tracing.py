"""OpenTelemetry: a send's span is current in its local transaction, its trace context travels with the message, and
the consumer's, the producer's check and the checker's spans link back to it; with no tracer provider configured,
nothing is added to a message."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the OpenTelemetry SDK (the dev extra)")

import redis  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402
from opentelemetry.util._once import Once  # noqa: E402

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionProducer  # noqa: E402
from redis_txmq import asyncio as txmq_asyncio  # noqa: E402
from redis_txmq.checker import Checker  # noqa: E402
from redis_txmq.core.keys import TopicKeys  # noqa: E402
from redis_txmq.core.tracing import STATE_ATTRIBUTE, TRACEPARENT  # noqa: E402

from .helpers import wait_until  # noqa: E402

CHECK_NOW = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)
KEYS = TopicKeys("orders")
COMMIT = LocalTransactionState.COMMIT


def _reset_global_provider() -> None:
    """OpenTelemetry sets its global provider once per process; the tests put it back as they found it."""
    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_global_provider()


def named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def links_to(span: Any, target: Any) -> bool:
    return any(link.context.span_id == target.context.span_id for link in span.links)


def test_a_send_its_local_transaction_and_its_consumer(spans: InMemorySpanExporter, real_client: Any, redis_url: str):
    tracer = trace.get_tracer("the service")
    with TransactionProducer("order_group", checker=lambda m: COMMIT, redis_url=redis_url) as producer:
        with producer.transaction(Message("orders", b"1")) as tx, tracer.start_as_current_span("INSERT orders"):
            pass
    (send,) = named(spans, "send orders")
    (insert,) = named(spans, "INSERT orders")
    assert send.kind is SpanKind.PRODUCER and send.attributes[STATE_ATTRIBUTE] == "COMMIT"
    assert send.attributes["messaging.destination.name"] == "orders"
    assert send.attributes["messaging.message.id"] == tx.transaction_id
    assert insert.parent is not None and insert.parent.span_id == send.context.span_id, "the local transaction's span"

    with Consumer("orders", "billing", redis_url=redis_url, block=0.05) as consumer:
        assert consumer.run(lambda message: None, max_messages=1) == 1
    (process,) = named(spans, "process orders")
    assert process.kind is SpanKind.CONSUMER and links_to(process, send)
    assert process.attributes["messaging.consumer.group.name"] == "billing"


def test_a_rolled_back_send_and_a_failed_prepare_are_recorded(
    spans: InMemorySpanExporter, real_client: Any, redis_url: str
):
    with TransactionProducer("order_group", checker=lambda m: COMMIT, redis_url=redis_url) as producer:
        with pytest.raises(RuntimeError), producer.transaction(Message("orders", b"1")):
            raise RuntimeError("the insert failed")
        producer.broker.runner.run = _refuse
        with pytest.raises(Exception, match="could not write the half message"):
            with producer.transaction(Message("orders", b"2")):
                pass
    rolled_back, failed = named(spans, "send orders")
    assert rolled_back.attributes[STATE_ATTRIBUTE] == "ROLLBACK"
    assert not failed.status.is_ok and STATE_ATTRIBUTE not in failed.attributes


def _refuse(script: Any, keys: Any, args: Any) -> Any:
    raise redis.ConnectionError("Redis is gone")


def test_the_check_back_links_to_the_send(spans: InMemorySpanExporter, real_client: Any, redis_url: str):
    with TransactionProducer(
        "order_group", checker=lambda m: COMMIT, redis_url=redis_url, settings=CHECK_NOW
    ) as producer:
        real_run = producer.broker.runner.run

        def end_lost(script: Any, keys: Any, args: Any) -> Any:
            if script is producer.broker._end:
                raise redis.ConnectionError("lost")
            return real_run(script, keys, args)

        producer.broker.runner.run = end_lost
        with producer.transaction(Message("orders", b"1")) as tx:
            pass
        producer.broker.runner.run = real_run
        assert tx.result.end_error
        checker = Checker(real_client, CHECK_NOW)
        wait_until(lambda: checker.run_round() is not None and real_client.hlen(KEYS.inflight) == 0, timeout=20)
    (send,) = named(spans, "send orders")
    assert not send.status.is_ok, "the end call failed"
    check, settle = named(spans, "check orders")[0], named(spans, "settle orders")[0]
    assert links_to(check, send) and links_to(settle, send)
    assert check.attributes[STATE_ATTRIBUTE] == "COMMIT" and settle.attributes[STATE_ATTRIBUTE] == "COMMIT"
    ((_, fields),) = real_client.xrange(KEYS.topic_stream)
    assert TRACEPARENT.encode() in fields[b"properties"], "the committed message carries the send's context"


def test_asyncio_send_and_consumer(spans: InMemorySpanExporter, real_client: Any, redis_url: str) -> None:
    tracer = trace.get_tracer("the service")

    async def scenario() -> None:
        async with txmq_asyncio.TransactionProducer("order_group", checker=lambda m: COMMIT, redis_url=redis_url) as p:
            await asyncio.gather(*(one(p, i) for i in range(3)))
        async with txmq_asyncio.Consumer("orders", "billing", redis_url=redis_url, block=0.05) as consumer:
            assert await consumer.run(lambda message: None, max_messages=3) == 3

    async def one(producer: Any, i: int) -> None:
        async with producer.transaction(Message("orders", b"%d" % i)):
            with tracer.start_as_current_span(f"INSERT {i}"):
                await asyncio.sleep(0)

    asyncio.run(scenario())
    sends = named(spans, "send orders")
    assert len(sends) == 3
    for i in range(3):
        (insert,) = named(spans, f"INSERT {i}")
        assert insert.parent.span_id in {send.context.span_id for send in sends}, "each under its own send"
    assert len({named(spans, f"INSERT {i}")[0].parent.span_id for i in range(3)}) == 3
    processes = named(spans, "process orders")
    assert len(processes) == 3 and all(any(links_to(p, s) for s in sends) for p in processes)


def test_without_a_tracer_provider_nothing_is_added(real_client: Any, redis_url: str) -> None:
    _reset_global_provider()
    with TransactionProducer("order_group", checker=lambda m: COMMIT, redis_url=redis_url) as producer:
        with producer.transaction(Message("orders", b"1")):
            pass
    ((_, fields),) = real_client.xrange(KEYS.topic_stream)
    assert TRACEPARENT.encode() not in fields.get(b"properties", b"")


def test_each_message_of_a_transaction_of_several_has_its_send_span(
    spans: InMemorySpanExporter, real_client: Any, redis_url: str
):
    with TransactionProducer("order_group", checker=lambda m: COMMIT, redis_url=redis_url) as producer:
        with producer.transaction() as tx:
            tx.send(Message("orders", b"1"))
            tx.send(Message("orders", b"2"))
    sends = named(spans, "send orders")
    assert sorted(span.attributes["messaging.message.id"] for span in sends) == [
        f"{tx.transaction_id}.0",
        f"{tx.transaction_id}.1",
    ]
    assert all(span.attributes[STATE_ATTRIBUTE] == "COMMIT" for span in sends)
