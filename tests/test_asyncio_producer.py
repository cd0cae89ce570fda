"""What only the asyncio producer has: ``async def`` listeners, cancellation and timeouts as outcomes (never losses),
sends in flight together. The behaviour it shares with the sync producer runs in test_producer.py on both."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis
import redis.asyncio

from redis_txmq import LocalTransactionState, Message, Settings
from redis_txmq.asyncio import TransactionListener, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys

from .helpers import ScriptedListener

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")
FAST = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)


class AsyncOrders(TransactionListener):
    """``async def`` methods; the local transaction waits on ``gate`` when one is set."""

    def __init__(self, answer: Any = COMMIT) -> None:
        self.answer = answer
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.checked: list[str] = []

    async def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        return arg

    async def check_local_transaction(self, message: Message) -> Any:
        self.checked.append(message.transaction_id or "")
        return self.answer


def committed(client: redis.Redis) -> list[str]:
    return [fields[b"transaction_id"].decode() for _, fields in client.xrange("orders")]


async def until(condition: Any, timeout: float = 10.0) -> None:
    """Poll a condition from the loop until it holds; fail at the deadline."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_async_listener_sends_and_answers_check_backs(real_client, redis_url):
    async def scenario() -> None:
        listener = AsyncOrders(answer=COMMIT)
        async with TransactionProducer("order_group", listener, redis_url=redis_url, settings=FAST) as producer:
            sent = await producer.send_message_in_transaction(Message("orders", b"now"), COMMIT)
            late = await producer.send_message_in_transaction(Message("orders", b"later"), UNKNOWN)
            checker = Checker(real_client, FAST)
            await until(lambda: checker.run_round() is not None and late.transaction_id in committed(real_client))
        assert sent.committed_id and committed(real_client) == [sent.transaction_id, late.transaction_id]
        assert listener.checked == [late.transaction_id]

    asyncio.run(scenario())


def test_a_sync_listener_runs_in_a_thread_not_on_the_loop(real_client, redis_url):
    seen: list[threading.Thread] = []

    def execute(message: Message) -> LocalTransactionState:
        seen.append(threading.current_thread())
        return COMMIT

    async def scenario() -> None:
        loop_thread = threading.current_thread()
        async with TransactionProducer("order_group", ScriptedListener(), redis_url=redis_url) as producer:
            await producer.send_message_in_transaction(Message("orders", b"x"), execute)
        assert seen and seen[0] is not loop_thread

    asyncio.run(scenario())


def test_cancelled_before_the_half_message_is_written_writes_nothing(real_client, redis_url):
    """The first send's registry write is held by the server (CLIENT PAUSE WRITE) when the task is cancelled: nothing
    is written, and the next send works (redis-py drops a connection whose command was cancelled)."""

    async def scenario() -> None:
        listener = AsyncOrders()
        async with TransactionProducer("order_group", listener, redis_url=redis_url) as producer:
            real_client.client_pause(10_000, all=False)
            try:
                task = asyncio.create_task(producer.send_message_in_transaction(Message("orders", b"x"), COMMIT))
                await until(lambda: any(c.get("cmd") == "sadd" for c in real_client.client_list()))
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                real_client.client_unpause()
            assert not listener.started.is_set(), "the local transaction did not run"
            assert real_client.xlen(KEYS.half_stream) == 0
            after = await producer.send_message_in_transaction(Message("orders", b"after"), COMMIT)
        assert committed(real_client) == [after.transaction_id]
        assert real_client.xlen(KEYS.half_stream) == 0 and real_client.hlen(KEYS.inflight) == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_cancelled_during_the_local_transaction_is_left_to_the_check_back(real_client, redis_url, how):
    """Never a blind COMMIT or ROLLBACK: the transaction stays in flight and the check-back finishes it."""

    async def scenario() -> None:
        listener = AsyncOrders(answer=COMMIT)
        listener.gate = asyncio.Event()
        async with TransactionProducer("order_group", listener, redis_url=redis_url, settings=FAST) as producer:
            send = producer.send_message_in_transaction(Message("orders", b"slow"), COMMIT)
            if how == "timeout":
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await send
            else:
                task = asyncio.create_task(send)
                await listener.started.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            (txid,) = [k.decode() for k in real_client.hkeys(KEYS.inflight)]
            assert committed(real_client) == [] and not real_client.xrange(KEYS.op_stream), "no end was sent"
            checker = Checker(real_client, FAST)
            await until(lambda: checker.run_round() is not None and committed(real_client) == [txid])
        assert listener.checked == [txid]

    asyncio.run(scenario())


@pytest.mark.parametrize("style", ["send", "handle"])
def test_cancelled_during_the_end_call_the_end_still_lands_once(real_client, redis_url, style):
    """Cancelled while its end call is under way, the end goes on in the background (shielded; the handle's result
    says so) and the commit lands once; shutdown waits for it."""

    async def scenario() -> None:
        async with TransactionProducer("order_group", AsyncOrders(), redis_url=redis_url) as producer:
            broker = producer.broker
            real_run, under_way, go_on = broker.runner.run, asyncio.Event(), asyncio.Event()

            async def held_end(script: Any, *args: Any) -> Any:
                if script is broker._end:
                    under_way.set()
                    await go_on.wait()
                return await real_run(script, *args)

            broker.runner.run = held_end
            handle = producer.transaction(Message("orders", b"ended while cancelled"))

            async def in_handle() -> None:
                async with handle:
                    pass

            async def by_send() -> None:
                await producer.send_message_in_transaction(Message("orders", b"ended while cancelled"), COMMIT)

            task = asyncio.create_task(in_handle() if style == "handle" else by_send())
            await under_way.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert committed(real_client) == []
            if style == "handle":
                assert handle.result is not None and "cancelled" in (handle.result.end_error or "")
            go_on.set()
        assert len(committed(real_client)) == 1, "the end landed once, before shutdown returned"
        assert real_client.hlen(KEYS.inflight) == 0

    asyncio.run(scenario())


def test_many_sends_in_flight_together_each_commit_once(real_client, redis_url):
    async def scenario() -> None:
        async with TransactionProducer("order_group", AsyncOrders(), redis_url=redis_url) as producer:
            results = await asyncio.gather(
                *(producer.send_message_in_transaction(Message("orders", b"%d" % i), COMMIT) for i in range(200))
            )
        assert sorted(committed(real_client)) == sorted(r.transaction_id for r in results)

    asyncio.run(scenario())


def test_one_way_ends_are_applied_by_flush(real_client, redis_url):
    async def scenario() -> None:
        settings = Settings(end_batch_delay=5)
        async with TransactionProducer(
            "order_group", AsyncOrders(), redis_url=redis_url, settings=settings, oneway_end=True
        ) as producer:
            results = await asyncio.gather(
                *(producer.send_message_in_transaction(Message("orders", b"%d" % i), COMMIT) for i in range(50))
            )
            assert all(r.end_queued and r.committed_id is None for r in results)
            assert await producer.flush(timeout=5), "flush cuts the batch delay"
            assert producer.pending_ends == 0
            assert sorted(committed(real_client)) == sorted(r.transaction_id for r in results)

    asyncio.run(scenario())
