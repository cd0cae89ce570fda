"""One-way end: a send returns after the local transaction, a flusher applies the ends in pipelines, ``flush()``
and ``shutdown()`` wait for them, and a failed batch leaves the transactions to the check-back.

The tests through the public API run on both producers (``make_producer``); those that reach into the sync
flusher thread (``EndFlusher``, the broker's runner, ``os.fork``) stay on the sync one."""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import fakeredis
import pytest
import redis

from redis_txmq import (
    ConfigurationError,
    LocalTransactionState,
    Message,
    ProducerStateError,
    Settings,
    TransactionProducer,
)
from redis_txmq.core.keys import TopicKeys
from redis_txmq.sync.broker import EndCall, EndResult, EndSource
from redis_txmq.sync.oneway import EndFlusher

from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")


def committed(client, topic="orders"):
    return collections.Counter(f[b"transaction_id"].decode() for _, f in client.xrange(topic))


def in_flight(client):
    return {k.decode() for k in client.hkeys(KEYS.inflight)}


def outcome_of(i):
    return (COMMIT, ROLLBACK, UNKNOWN)[i % 3]


def test_every_end_applied_once_after_flush(client, make_producer, api):
    listener = ScriptedListener()
    # more ends than one batch (256); fakeredis behind the asyncio client takes ~90 ms a send: fewer there
    count = 60 if api == "async" and isinstance(client, fakeredis.FakeRedis) else 300
    with make_producer("order_group", listener, client=client, oneway_end=True) as producer:
        results = [
            producer.send_message_in_transaction(Message("orders", str(i).encode()), outcome_of(i))
            for i in range(count)
        ]
        assert producer.flush(timeout=30)
        assert producer.pending_ends == 0
        queued = [r for r in results if r.local_transaction_state is not UNKNOWN]
        assert all(r.end_queued and r.committed_id is None and r.end_error is None for r in queued)
        assert not any(r.end_queued for r in results if r.local_transaction_state is UNKNOWN)
        commits = {r.transaction_id for r in results if r.local_transaction_state is COMMIT}
        assert committed(client) == {tx: 1 for tx in commits}
        assert in_flight(client) == {r.transaction_id for r in results if r.local_transaction_state is UNKNOWN}
        bodies = sorted(int(f[b"body"]) for _, f in client.xrange("orders"))
        assert bodies == [i for i in range(count) if i % 3 == 0]


def test_shutdown_applies_queued_ends_without_waiting_for_the_batch_delay(client, make_producer):
    settings = Settings(end_batch_size=10_000, end_batch_delay=10)
    producer = make_producer("order_group", ScriptedListener(), client=client, settings=settings, oneway_end=True)
    with producer:
        results = [producer.send_message_in_transaction(Message("orders", b"x"), COMMIT) for _ in range(40)]
    assert committed(client) == {r.transaction_id: 1 for r in results}
    assert in_flight(client) == set()


def test_threads_share_a_one_way_producer_with_a_tiny_queue(client, make_producer):
    """A full queue makes the send wait for the flusher: nothing is dropped, nothing deadlocks."""
    settings = Settings(end_queue_size=2, end_batch_size=2)
    with make_producer(
        "order_group", ScriptedListener(), client=client, settings=settings, oneway_end=True
    ) as producer:

        def send(i):
            return producer.send_message_in_transaction(Message("orders", str(i).encode()), COMMIT)

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(send, range(60)))
        assert producer.flush(timeout=30)
    assert committed(client) == {r.transaction_id: 1 for r in results}


def test_flush_waits_for_its_own_ends_not_for_other_threads_sending_on(client, make_producer):
    with make_producer("order_group", ScriptedListener(), client=client, oneway_end=True) as producer:
        stop = threading.Event()

        def keep_sending():
            while not stop.is_set():
                producer.send_message_in_transaction(Message("orders", b"background"), COMMIT)

        with ThreadPoolExecutor(1) as pool:
            background = pool.submit(keep_sending)
            try:
                mine = [producer.send_message_in_transaction(Message("orders", b"mine"), COMMIT) for _ in range(20)]
                assert producer.flush(timeout=30)
                assert set(committed(client)) >= {r.transaction_id for r in mine}
            finally:
                stop.set()
            background.result(timeout=30)
        assert producer.flush(timeout=30)
    assert all(n == 1 for n in committed(client).values())


def test_a_failed_batch_is_logged_and_left_to_the_check_back(client, caplog):
    with TransactionProducer("order_group", ScriptedListener(), client=client, oneway_end=True) as producer:
        real_run_many = producer.broker.runner.run_many

        def lost_connection(calls, **kwargs):
            raise redis.ConnectionError("connection reset")

        producer.broker.runner.run_many = lost_connection
        with caplog.at_level(logging.WARNING, logger="redis_txmq"):
            results = [producer.send_message_in_transaction(Message("orders", b"x"), COMMIT) for _ in range(5)]
            assert producer.flush(timeout=30)
        producer.broker.runner.run_many = real_run_many
        assert producer._flusher.failed == 5
        assert client.xlen("orders") == 0
        assert in_flight(client) == {r.transaction_id for r in results}
        assert any(
            "check-back will resolve" in r.getMessage() and results[0].transaction_id in r.getMessage()
            for r in caplog.records
        )


def test_an_end_the_broker_refuses_is_counted_with_its_transaction_id(client, caplog):
    with TransactionProducer("order_group", ScriptedListener(), client=client, oneway_end=True) as producer:
        good = producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
        with caplog.at_level(logging.WARNING, logger="redis_txmq"):
            producer._flusher.submit(EndCall(KEYS, "0" * 32, "order_group", COMMIT, EndSource.PRODUCER))
            assert producer.flush(timeout=30)
        assert producer._flusher.failed == 1 and producer._flusher.applied == 1
    assert committed(client) == {good.transaction_id: 1}
    assert any("0" * 32 in r.getMessage() and "no in-flight transaction" in r.getMessage() for r in caplog.records)


def test_flush_of_a_synchronous_producer_returns_at_once(client, make_producer):
    with make_producer("order_group", ScriptedListener(), client=client) as producer:
        result = producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
        assert producer.flush(timeout=0) and producer.pending_ends == 0
    assert result.committed_id and not result.end_queued


@pytest.mark.parametrize(
    "overrides", [{"end_batch_size": 0}, {"end_queue_size": 0}, {"end_batch_delay": -1}, {"end_batch_delay": 11}]
)
def test_one_way_settings_are_validated(overrides):
    with pytest.raises(ConfigurationError, match=next(iter(overrides))):
        Settings(**overrides)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_an_error_not_a_hang(real_client):
    with TransactionProducer("order_group", ScriptedListener(), client=real_client, oneway_end=True) as producer:
        pid = os.fork()
        if pid == 0:  # the child: its send must come back (end_error set), never block on a thread it lacks
            code = 1
            try:
                result = producer.send_message_in_transaction(Message("orders", b"child"), COMMIT)
                code = 0 if result.end_error and "create the producer in the child" in result.end_error else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_shutdown_over_a_slow_network_applies_every_end_queued_before_it(real_client, redis_url):
    """Every end queued when ``shutdown()`` begins is applied when it returns, however many batches are left."""
    settings = Settings(end_batch_size=2, end_batch_delay=0)
    producer = TransactionProducer(
        "order_group", ScriptedListener(), redis_url=redis_url, settings=settings, oneway_end=True
    ).start()
    flusher = producer._flusher
    shutdown_began = threading.Event()
    real_run_many, real_close = producer.broker.runner.run_many, flusher.close

    def slow_network(calls, **kwargs):
        shutdown_began.wait(30)  # the first batch is still on its way when shutdown() is called
        time.sleep(0.02)  # network latency: each batch takes a while
        return real_run_many(calls, **kwargs)

    def close(timeout=None):
        shutdown_began.set()
        return real_close(timeout)

    producer.broker.runner.run_many = slow_network
    flusher.close = close
    results = [producer.send_message_in_transaction(Message("orders", str(i).encode()), COMMIT) for i in range(30)]
    assert producer.pending_ends == 30, "nothing applied before shutdown: all 15 batches are left to it"
    producer.shutdown()
    assert committed(real_client) == {r.transaction_id: 1 for r in results}
    assert in_flight(real_client) == set() and flusher.applied == 30 and producer.pending_ends == 0


class WaitCountingCondition(threading.Condition):
    """A Condition that knows which threads wait on it: proof that a call blocks, without a timed guess."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: set[str] = set()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.add(threading.current_thread().name)
        try:
            return super().wait(timeout)
        finally:
            self.waiting.discard(threading.current_thread().name)


class StalledNetwork:
    """Stands in for the broker behind an :class:`EndFlusher`: each batch waits for a permit."""

    def __init__(self) -> None:
        self.permits = threading.Semaphore(0)
        self.applied: list[str] = []

    def end_transactions(self, batch: list[EndCall]) -> list[EndResult]:
        assert self.permits.acquire(timeout=30), "the test never let this batch through"
        self.applied.extend(end.transaction_id for end in batch)
        return [EndResult("COMMIT", "1-0", "2-0", True) for _ in batch]


def an_end(i: int) -> EndCall:
    return EndCall(KEYS, f"tx-{i}", "order_group", COMMIT, EndSource.PRODUCER)


def stalled_flusher(**settings) -> tuple[EndFlusher, StalledNetwork]:
    network = StalledNetwork()
    flusher = EndFlusher(network, Settings(**settings), "order_group")  # type: ignore[arg-type]
    flusher._cond = WaitCountingCondition()
    flusher.start()
    return flusher, network


def in_thread(name: str, call) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, outcome


def test_submit_after_close_fails_loudly():
    flusher, network = stalled_flusher()
    assert flusher.close(timeout=10)
    with pytest.raises(ProducerStateError, match="tx-1: the producer is shutting down"):
        flusher.submit(an_end(1))
    assert flusher.pending == 0 and network.applied == []


def test_a_send_waiting_for_room_fails_loudly_when_the_producer_closes():
    flusher, network = stalled_flusher(end_queue_size=1, end_batch_size=1)
    flusher.submit(an_end(1))
    waiting, outcome = in_thread("waiting-submit", lambda: flusher.submit(an_end(2)))
    wait_until(lambda: "waiting-submit" in flusher._cond.waiting)
    closing, _ = in_thread("closing", flusher.close)
    wait_until(lambda: "error" in outcome)  # before the stalled batch is let through
    assert isinstance(outcome["error"], ProducerStateError) and "tx-2" in str(outcome["error"])
    network.permits.release()
    closing.join(10)
    assert not closing.is_alive() and network.applied == ["tx-1"]


def test_the_queue_bound_is_exact():
    """``end_queue_size`` 3: three ends queue while the network is stalled, the fourth send waits for room."""
    flusher, network = stalled_flusher(end_queue_size=3, end_batch_size=1)
    first_three, outcome = in_thread("first-three", lambda: [flusher.submit(an_end(i)) for i in range(3)])
    wait_until(lambda: not first_three.is_alive())
    assert "error" not in outcome and flusher.pending == 3
    fourth, fourth_outcome = in_thread("fourth-submit", lambda: flusher.submit(an_end(3)))
    wait_until(lambda: "fourth-submit" in flusher._cond.waiting or not fourth.is_alive())
    assert fourth.is_alive() and fourth_outcome == {}, "the fourth end must wait while three are pending"
    network.permits.release()  # one batch of one end goes through: room for one
    wait_until(lambda: not fourth.is_alive())
    assert "error" not in fourth_outcome and flusher.pending == 3
    for _ in range(3):
        network.permits.release()
    assert flusher.flush(timeout=10) and network.applied == [f"tx-{i}" for i in range(4)]
    assert flusher.close(timeout=10)


def test_the_first_queued_end_wakes_the_flusher(client, make_producer):
    with make_producer("order_group", ScriptedListener(), client=client, oneway_end=True) as producer:
        result = producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
        wait_until(lambda: committed(client) == {result.transaction_id: 1})  # no flush(): the flusher woke by itself


def test_a_full_batch_is_sent_without_waiting_for_the_batch_delay(client, make_producer):
    settings = Settings(end_batch_size=3, end_batch_delay=10)
    with make_producer(
        "order_group", ScriptedListener(), client=client, settings=settings, oneway_end=True
    ) as producer:
        results = [producer.send_message_in_transaction(Message("orders", b"x"), COMMIT) for _ in range(3)]
        wait_until(lambda: committed(client) == {r.transaction_id: 1 for r in results}, timeout=5)


def test_flush_cuts_the_batch_delay(client, make_producer):
    settings = Settings(end_batch_size=10_000, end_batch_delay=10)
    with make_producer(
        "order_group", ScriptedListener(), client=client, settings=settings, oneway_end=True
    ) as producer:
        results = [producer.send_message_in_transaction(Message("orders", b"x"), COMMIT) for _ in range(5)]
        assert producer.flush(timeout=5), "flush() must not wait out the 10 s batch delay"
        assert committed(client) == {r.transaction_id: 1 for r in results}
