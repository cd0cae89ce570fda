"""The check-back keeps going: a producer's check pool frees its slots once an answer is sent, a producer keeps
answering after its check-request group was lost or a read of it failed, and a checker lives on after a step
failed (counted in its metrics)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.core.keys import CHECKER_INSTANCES, GroupKeys, TopicKeys

from .helpers import wait_until
from .test_checker import running

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
TOPIC = "orders"
GROUP = "order_group"
KEYS = TopicKeys(TOPIC)
FAST = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, claim_idle=1.0)


class ByBody(TransactionListener):
    """Executes with ``arg``; answers a check with the state its body names (UNKNOWN for any other body)."""

    def execute_local_transaction(self, message: Message, arg: LocalTransactionState) -> LocalTransactionState:
        return arg

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return {b"paid": COMMIT, b"void": ROLLBACK}.get(message.body, UNKNOWN)


def test_a_producer_with_a_check_pool_of_one_answers_every_check(real_client):
    """``check_queue_size`` bounds the requests a producer holds at once, not the requests it answers in its life:
    each answered request frees its slot."""
    settings = Settings(
        transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, check_threads=1, check_queue_size=1
    )
    checker = Checker(real_client, settings, scan_interval=0.05)
    with TransactionProducer(GROUP, ByBody(), client=real_client, settings=settings) as producer:
        sent = [producer.send_message_in_transaction(Message(TOPIC, b"paid"), UNKNOWN) for _ in range(4)]
        with running(checker):
            wait_until(lambda: real_client.xlen(TOPIC) == 4, 30)
    committed = {f[b"transaction_id"].decode() for _, f in real_client.xrange(TOPIC)}
    assert committed == {r.transaction_id for r in sent}


def test_a_producer_keeps_answering_after_its_check_request_group_was_lost(real_client):
    """Redis lost the producer group's request stream (and its consumer group) while the producer was reading it:
    the producer creates the group again and answers the next check-back."""
    requests = GroupKeys(GROUP).check_requests
    checker = Checker(real_client, FAST, scan_interval=0.05)
    with TransactionProducer(GROUP, ByBody(), client=real_client, settings=FAST) as producer:
        wait_until(lambda: real_client.exists(requests) and real_client.xinfo_groups(requests))
        real_client.delete(requests)
        late = producer.send_message_in_transaction(Message(TOPIC, b"paid"), UNKNOWN)
        with running(checker):
            wait_until(lambda: real_client.xlen(TOPIC) == 1, 30)
    ((_, fields),) = real_client.xrange(TOPIC)
    assert fields[b"transaction_id"].decode() == late.transaction_id


def test_a_producer_keeps_answering_after_a_read_of_its_requests_failed(real_client, caplog):
    """A read that Redis refuses (here the request stream's key holds another type for a while) is retried after a
    pause, not given up: once the key is a stream again the producer answers the next check-back."""
    caplog.set_level(logging.WARNING, logger="redis_txmq.sync.check_handler")
    requests = GroupKeys(GROUP).check_requests
    checker = Checker(real_client, FAST, scan_interval=0.05)
    with TransactionProducer(GROUP, ByBody(), client=real_client, settings=FAST) as producer:
        wait_until(lambda: real_client.exists(requests) and real_client.xinfo_groups(requests))
        real_client.delete(requests)
        real_client.set(requests, "not a stream")
        wait_until(lambda: "reading check requests failed" in caplog.text, 30)
        real_client.delete(requests)
        late = producer.send_message_in_transaction(Message(TOPIC, b"paid"), UNKNOWN)
        with running(checker):
            wait_until(lambda: real_client.xlen(TOPIC) == 1, 30)
    ((_, fields),) = real_client.xrange(TOPIC)
    assert fields[b"transaction_id"].decode() == late.transaction_id


def test_a_failing_step_is_counted_and_retried_and_the_checker_lives_on(real_client):
    """A step of the loop that Redis refuses (here the heartbeat, its key holding another type) is counted in
    ``txmq_checker_errors{step}`` and retried after a pause; once Redis accepts it again the checker works on."""
    checker = Checker(real_client, FAST, scan_interval=0.05)
    with TransactionProducer(GROUP, ByBody(), client=real_client, settings=FAST) as producer:
        with running(checker) as thread:
            wait_until(lambda: real_client.zcard(CHECKER_INSTANCES) >= 1)
            real_client.delete(CHECKER_INSTANCES)
            real_client.set(CHECKER_INSTANCES, "not a zset")
            wait_until(lambda: checker.metrics.errors.labels("heartbeat")._value.get() >= 2, 30)
            real_client.delete(CHECKER_INSTANCES)
            producer.send_message_in_transaction(Message(TOPIC, b"paid"), UNKNOWN)
            wait_until(lambda: real_client.xlen(TOPIC) == 1, 30)
            assert thread.is_alive()


@pytest.mark.parametrize("how", ["raised", "refused"])
def test_a_request_deleted_unread_then_a_send_that_failed_spends_no_check(real_client, monkeypatch, how):
    """A checker retires the request it replaces (deleted: nobody read it) and then fails to send the new one (a
    dropped connection, a failover: the pipeline raises; or the server refuses the XADD: out of memory, a moved
    slot): neither check reached a producer, so neither counts. Before, the unread one stayed counted, one check of
    ``check_max`` spent per such failure, and a transaction no producer ever saw a request for was dead-lettered."""
    import redis

    from redis_txmq.sync.broker import RedisBroker

    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=3)
    broker = RedisBroker(real_client, settings)
    broker.load_scripts()
    broker.prepare_half(KEYS, Message(TOPIC, b"x"), "tx1", GROUP)
    real_client.xgroup_create(GroupKeys(GROUP).check_requests, "producers", "0", mkstream=True)  # nobody reads
    failing = {"sends": 0}
    execute = redis.client.Pipeline.execute

    def send_fails(pipe, *args, **kwargs):
        if failing["sends"] and any(command[0][0] == "XADD" for command in pipe.command_stack):
            failing["sends"] -= 1
            count = len(pipe.command_stack)
            pipe.reset()
            if how == "raised":
                raise redis.ConnectionError("connection lost before the XADDs reached the server")
            return [redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")] * count
        return execute(pipe, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", send_fails)
    checker = Checker(real_client, settings)

    requests = GroupKeys(GROUP).check_requests

    def rounds_until(condition: Any) -> None:
        wait_until(lambda: (checker.run_round(), condition())[1], 10)

    rounds_until(lambda: real_client.xlen(requests) == 1)  # the first request: nobody reads it
    for _ in range(5):
        failing["sends"] = 1
        rounds_until(lambda: failing["sends"] == 0)  # retires the unread request, then its send fails
        assert real_client.xlen(requests) == 0
        assert int(real_client.hget(KEYS.checks, "tx1") or 0) <= 1
        rounds_until(lambda: real_client.xlen(requests) == 1)  # sent again
    assert real_client.xlen(KEYS.dead_stream) == 0, "dead-lettered for checks no producer read"
    assert real_client.hexists(KEYS.inflight, "tx1")


def test_a_producer_deletes_an_answered_request_before_it_acks_it(real_client):
    """Off a MULTI (a cluster) the producer's delete and ack are two commands, and the checker may retire the
    request between them: deleted first, it is still pending then, and the checker counts it as read. Acked first,
    it would be neither pending nor deleted, read as never read, its check given back: a producer that keeps
    answering UNKNOWN would never reach ``check_max``."""
    from redis_txmq.core.check_requests import queue_finish

    calls: list[str] = []

    class Recording:
        def __getattr__(self, name: str):
            return lambda *args, **kwargs: calls.append(name)

    queue_finish(Recording(), "requests", "1-1", None)
    assert calls == ["xdel", "xack"]
    stream = GroupKeys(GROUP).check_requests
    real_client.xgroup_create(stream, "producers", "0", mkstream=True)
    request_id = real_client.xadd(stream, {"transaction_id": "tx1"})
    real_client.xreadgroup("producers", "p1", {stream: ">"})
    real_client.xdel(stream, request_id)  # the producer's first command
    acked, deleted = real_client.xack(stream, "producers", request_id), real_client.xdel(stream, request_id)  # checker
    assert (acked, deleted) == (1, 0), "the checker's retire must see it read (acked, not deleted by it)"


def test_a_checker_whose_retire_of_replaced_requests_fails_goes_on(real_client, monkeypatch):
    """Deleting the requests a round replaces fails (a dropped connection; on a cluster, that stream's master is
    down): the round's checks are not sent, and the checker goes on with its next round instead of dying."""
    import redis

    from redis_txmq.sync.broker import RedisBroker

    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=50)
    broker = RedisBroker(real_client, settings)
    broker.load_scripts()
    broker.prepare_half(KEYS, Message(TOPIC, b"x"), "tx1", GROUP)
    requests = GroupKeys(GROUP).check_requests
    real_client.xgroup_create(requests, "producers", "0", mkstream=True)
    failing = {"retires": 0}
    execute = redis.client.Pipeline.execute

    def retire_fails(pipe, *args, **kwargs):
        if failing["retires"] and any(command[0][0] == "XDEL" for command in pipe.command_stack):
            failing["retires"] -= 1
            pipe.reset()
            raise redis.ConnectionError("connection lost while deleting replaced requests")
        return execute(pipe, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", retire_fails)
    checker = Checker(real_client, settings)
    wait_until(lambda: (checker.run_round(), real_client.xlen(requests) == 1)[1], 10)
    failing["retires"] = 1
    wait_until(lambda: (checker.run_round(), failing["retires"] == 0)[1], 10)
    first = real_client.xrange(requests)[0][0]
    wait_until(lambda: (checker.run_round(), real_client.xrange(requests)[-1][0] != first)[1], 10)
    assert real_client.hexists(KEYS.inflight, "tx1")
