"""redis-py's asyncio connection raises ``AttributeError`` (``'NoneType' object has no attribute 'writelines'``) when
a socket is closed under a write, e.g. a cluster node reset during its connect handshake (seen in the fault suite's
cluster run): the library takes it for the connection error it is, so a send raises ``PrepareError`` (retry) and a
consumer rides it out, instead of crashing with an error outside its hierarchy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio

from redis_txmq import Message, PrepareError
from redis_txmq.asyncio import TransactionProducer
from redis_txmq.core.clients import connection_error_of

from .helpers import ScriptedListener

INSIDE_REDIS = "/site-packages/redis/asyncio/connection.py"


def raised_inside_redis(error: type[Exception], message: str) -> Exception:
    """An exception whose last frame is in redis-py's connection module, as the real one's is."""
    code = compile(f"def write(writer):\n    raise {error.__name__}({message!r})\n", INSIDE_REDIS, "exec")
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # noqa: S102 - a function whose frame says it is redis-py's
    try:
        namespace["write"](None)
    except error as exc:
        return exc
    raise AssertionError("unreachable")


def test_an_attribute_error_inside_redis_connection_code_is_a_connection_error() -> None:
    exc = raised_inside_redis(AttributeError, "'NoneType' object has no attribute 'writelines'")
    error = connection_error_of(exc)
    assert isinstance(error, redis.ConnectionError) and error.__cause__ is exc
    assert connection_error_of(AttributeError("a bug of ours")) is None, "only redis-py's connection code"
    assert connection_error_of(ValueError("not this kind")) is None


def test_an_asyncio_send_whose_socket_is_closed_under_its_write_raises_prepare_error(redis_url: str) -> None:
    async def scenario() -> None:
        async with TransactionProducer("order_group", ScriptedListener(), redis_url=redis_url) as producer:

            async def closed_under_write(*args: Any, **kwargs: Any) -> Any:
                raise raised_inside_redis(AttributeError, "'NoneType' object has no attribute 'writelines'")

            producer.broker.runner._lane.call = closed_under_write  # type: ignore[union-attr,method-assign]
            with pytest.raises(PrepareError, match="connection lost under a write"):
                await producer.send_message_in_transaction(Message("orders", b"x"))

    asyncio.run(scenario())
