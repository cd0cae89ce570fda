"""One-way end: a send returns after the local transaction, a flusher applies the ends in pipelines, ``flush()``
and ``shutdown()`` wait for them, and a failed batch leaves the transactions to the check-back."""

from __future__ import annotations

import collections
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from redis_txmq import ConfigurationError, LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.broker import EndCall, EndSource
from redis_txmq.keys import TopicKeys

from .helpers import ScriptedListener

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")


def committed(client, topic="orders"):
    return collections.Counter(f[b"transaction_id"].decode() for _, f in client.xrange(topic))


def in_flight(client):
    return {k.decode() for k in client.hkeys(KEYS.inflight)}


def outcome_of(i):
    return (COMMIT, ROLLBACK, UNKNOWN)[i % 3]


def test_every_end_applied_once_after_flush(client):
    listener = ScriptedListener()
    with TransactionProducer("order_group", listener, client=client, oneway_end=True) as producer:
        results = [
            producer.send_message_in_transaction(Message("orders", str(i).encode()), outcome_of(i)) for i in range(300)
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
        assert bodies == [i for i in range(300) if i % 3 == 0]


def test_shutdown_applies_queued_ends_without_waiting_for_the_batch_delay(client):
    settings = Settings(end_batch_size=10_000, end_batch_delay=10)
    producer = TransactionProducer("order_group", ScriptedListener(), client=client, settings=settings, oneway_end=True)
    with producer:
        results = [producer.send_message_in_transaction(Message("orders", b"x"), COMMIT) for _ in range(40)]
    assert committed(client) == {r.transaction_id: 1 for r in results}
    assert in_flight(client) == set()


def test_threads_share_a_one_way_producer_with_a_tiny_queue(client):
    """A full queue makes the send wait for the flusher: nothing is dropped, nothing deadlocks."""
    settings = Settings(end_queue_size=2, end_batch_size=2)
    with TransactionProducer(
        "order_group", ScriptedListener(), client=client, settings=settings, oneway_end=True
    ) as producer:

        def send(i):
            return producer.send_message_in_transaction(Message("orders", str(i).encode()), COMMIT)

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(send, range(60)))
        assert producer.flush(timeout=30)
    assert committed(client) == {r.transaction_id: 1 for r in results}


def test_flush_waits_for_its_own_ends_not_for_other_threads_sending_on(client):
    with TransactionProducer("order_group", ScriptedListener(), client=client, oneway_end=True) as producer:
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


def test_flush_of_a_synchronous_producer_returns_at_once(client):
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
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
