"""OpenTelemetry spans of a transaction, after the messaging semantic conventions (the ``otel`` extra).

- ``send <topic>`` (PRODUCER) from the half message to the end call, current while the local transaction runs, so
  the service's own spans (its database calls) are its children; ``messaging.redis_txmq.transaction.state`` is the
  outcome (COMMIT, ROLLBACK, UNKNOWN) and an end call that failed is the span's error.
- ``process <topic>`` (CONSUMER) around a handler of ``Consumer.run``, linked to the send.
- ``check <topic>`` (CONSUMER) around a producer's answer to a check-back, and ``settle <topic>`` (INTERNAL) where a
  checker applies that answer, both linked to the send.

The send's W3C trace context travels with the message in the reserved properties ``txmq.traceparent`` (and
``txmq.tracestate``): in the half message, the check requests made from it, and the committed entry a consumer
reads, in any process. Without ``opentelemetry-api``, or while no tracer provider is configured, nothing here runs
beyond one check per send: no span, no property.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from .message import LocalTransactionState, Message, TransactionSendResult

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    _OFF = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    _PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
except ImportError:  # pragma: no cover - the otel extra is optional
    trace = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

TRACEPARENT = "txmq.traceparent"
TRACESTATE = "txmq.tracestate"
SYSTEM = "redis-txmq"
STATE_ATTRIBUTE = "messaging.redis_txmq.transaction.state"
PRODUCER_GROUP = "messaging.redis_txmq.producer_group"
CONSUMER_GROUP = "messaging.consumer.group.name"
_CARRIED = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}


_NO_GLOBAL = object()
_tracers: dict[int, Any] = {}


def _tracer() -> Any:
    """The library's tracer, or None while tracing is off (no API installed, no provider configured).

    On every send, so it must cost next to nothing when off: ``trace.get_tracer_provider()`` looks up an environment
    variable each time (1.7 us here); the API's global is read directly, and the public call is made only when that
    global is not there (another API version) or is still unset while the variable (read once) names a provider."""
    if trace is None:
        return None
    provider = getattr(trace, "_TRACER_PROVIDER", _NO_GLOBAL)
    if provider is None:
        if not _PROVIDER_FROM_ENVIRONMENT:
            return None
        provider = trace.get_tracer_provider()
    elif provider is _NO_GLOBAL:
        provider = trace.get_tracer_provider()
    if isinstance(provider, _OFF):
        return None
    tracer = _tracers.get(id(provider))
    if tracer is None:
        _tracers.clear()
        tracer = _tracers[id(provider)] = provider.get_tracer("redis_txmq")
    return tracer


def _attributes(operation: str, topic: str, transaction_id: str | None, group: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.destination.name": topic,
    }
    if transaction_id:
        attributes["messaging.message.id"] = transaction_id
    if group:
        # a consumer group for `process`; the producer group whose transaction it is for the others
        attributes[CONSUMER_GROUP if operation == "process" else PRODUCER_GROUP] = group
    return attributes


class SendTrace:
    """The span of one send, current from the half message until the end call."""

    __slots__ = ("span", "_token")

    def __init__(self, span: Any) -> None:
        self.span = span
        self._token = otel_context.attach(trace.set_span_in_context(span))

    def finish(self, result: TransactionSendResult | None = None, error: BaseException | None = None) -> None:
        span = self.span
        if result is not None:
            span.set_attribute("messaging.message.id", result.transaction_id)
            span.set_attribute(STATE_ATTRIBUTE, result.local_transaction_state.value)
            if result.end_error:
                span.set_status(Status(StatusCode.ERROR, result.end_error))
        elif error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
        try:
            otel_context.detach(self._token)
        except ValueError:  # ended in another context than it began (a task switch): the span is still complete
            pass


def start_send(message: Message, producer_group: str) -> SendTrace | None:
    """Open the send's span and put its trace context in the send's own copy of the message (before the half message
    is written); None when tracing is off."""
    tracer = _tracer()
    if tracer is None:
        return None
    span = tracer.start_span(
        f"send {message.topic}",
        kind=SpanKind.PRODUCER,
        attributes=_attributes("send", message.topic, message.transaction_id, producer_group),
    )
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    properties = dict(message.properties or {})
    for header, name in _CARRIED.items():
        if header in carrier:
            properties[name] = carrier[header]
    message.properties = properties
    return SendTrace(span)


def finish_send(
    send: SendTrace | None, result: TransactionSendResult | None, error: BaseException | None = None
) -> None:
    if send is not None:
        send.finish(result, error)


def _link(properties: Mapping[str, str] | None) -> list[Any]:
    """A link to the send whose trace context ``properties`` carry; none when they carry none."""
    if not properties or TRACEPARENT not in properties:
        return []
    carrier = {header: properties[name] for header, name in _CARRIED.items() if name in properties}
    span_context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    return [Link(span_context)] if span_context.is_valid else []


_OFF_SPAN = nullcontext(None)


def span_for(
    operation: str,
    topic: str,
    *,
    transaction_id: str | None,
    group: str | None,
    properties: Mapping[str, str] | None,
    consumer: bool = True,
) -> AbstractContextManager[Any]:
    """A current span linked to the send (``process``, ``check``, ``settle``); a context that yields None when
    tracing is off."""
    tracer = _tracer()
    if tracer is None:
        return _OFF_SPAN
    return tracer.start_as_current_span(
        f"{operation} {topic}",
        kind=SpanKind.CONSUMER if consumer else SpanKind.INTERNAL,
        links=_link(properties),
        attributes=_attributes(operation, topic, transaction_id, group),
    )


def carried(properties: Mapping[str, str] | None) -> dict[str, str]:
    """The trace-context properties of a message, to copy into an entry that is not a message (a check answer)."""
    if not properties:
        return {}
    return {name: properties[name] for name in _CARRIED.values() if name in properties}


def context_of_fields(fields: Mapping[str, bytes]) -> dict[str, str]:
    """The trace-context properties an entry's fields carry (a check answer), decoded."""
    return {name: fields[name].decode() for name in _CARRIED.values() if name in fields}


def set_state(span: Any, state: LocalTransactionState) -> None:
    if span is not None:
        span.set_attribute(STATE_ATTRIBUTE, state.value)
