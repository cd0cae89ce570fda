"""The asyncio broker's lane: concurrent script calls share one pipeline, each with its own reply or error."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from redis_txmq.asyncio.lane import ScriptLane
from redis_txmq.transport.embedded import free_port

ECHO = "return ARGV[1]"
REFUSE = "return redis.error_reply('ERR refused ' .. ARGV[1])"
WRITE = "return redis.call('RPUSH', KEYS[1], ARGV[1])"


def test_concurrent_calls_go_out_together_each_with_its_own_reply(redis_url):
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        echo, refuse = client.register_script(ECHO), client.register_script(REFUSE)
        lane = ScriptLane(client)
        sent: list[int] = []
        exchange = lane._exchange_checked_out

        async def counting(batch):
            sent.append(len(batch))
            return await exchange(batch)

        lane._exchange_checked_out = counting
        try:
            calls = [lane.call(refuse if i == 3 else echo, [], [i]) for i in range(10)]
            replies = await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await client.aclose()
        assert [r for i, r in enumerate(replies) if i != 3] == [str(i).encode() for i in range(10) if i != 3]
        assert isinstance(replies[3], redis.ResponseError) and "refused 3" in str(replies[3])
        assert sum(sent) >= 10 and len(sent) < 10, "fewer pipelines than calls"

    asyncio.run(scenario())


def test_a_call_cancelled_while_queued_is_not_sent(real_client, redis_url):
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        write = client.register_script(WRITE)
        lane = ScriptLane(client)
        first = asyncio.ensure_future(lane.call(write, ["sent"], ["first"]))
        queued = asyncio.ensure_future(lane.call(write, ["sent"], ["cancelled"]))
        await asyncio.sleep(0)
        queued.cancel()
        assert await first == 1
        with pytest.raises(asyncio.CancelledError):
            await queued
        await lane.call(write, ["sent"], ["after"])
        await client.aclose()

    asyncio.run(scenario())
    assert real_client.lrange("sent", 0, -1) == [b"first", b"after"]


def test_a_connection_the_server_closed_while_idle_costs_no_call(real_client, redis_url):
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, retry_on_error=[], retry=None)
        echo = client.register_script(ECHO)
        lane = ScriptLane(client)
        assert await lane.call(echo, [], ["warm"]) == b"warm"
        real_client.client_kill_filter(_type="normal", skipme=True)
        replies = await asyncio.gather(*(lane.call(echo, [], [i]) for i in range(5)))
        assert replies == [str(i).encode() for i in range(5)]
        await client.aclose()

    asyncio.run(scenario())


def test_an_unreachable_server_fails_every_call_of_its_batch_and_keeps_no_connection():
    async def scenario() -> None:
        client = redis.asyncio.Redis(port=free_port(), retry_on_error=[], retry=None, socket_connect_timeout=1)
        echo = client.register_script(ECHO)
        lane = ScriptLane(client)
        replies = await asyncio.gather(*(lane.call(echo, [], [i]) for i in range(5)), return_exceptions=True)
        assert all(isinstance(r, redis.ConnectionError) for r in replies), replies
        assert not client.connection_pool._in_use_connections
        await client.aclose()

    asyncio.run(scenario())


def test_scripts_flushed_from_the_server_are_loaded_again(real_client, redis_url):
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        echo, write = client.register_script(ECHO), client.register_script(WRITE)
        lane = ScriptLane(client)
        assert await lane.call(echo, [], ["warm"]) == b"warm"
        real_client.script_flush()
        replies = await asyncio.gather(lane.call(echo, [], ["a"]), lane.call(write, ["flushed"], ["b"]))
        assert replies == [b"a", 1]
        await client.aclose()

    asyncio.run(scenario())
    assert real_client.lrange("flushed", 0, -1) == [b"b"]
