"""The check-back keeps going: a producer's check pool frees its slots once an answer is sent, a producer keeps
answering after its check-request group was lost or a read of it failed, and a checker lives on after a step
failed (counted in its metrics)."""

from __future__ import annotations

import logging

from checker import Checker
from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.keys import CHECKER_INSTANCES, GroupKeys, TopicKeys

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
    caplog.set_level(logging.WARNING, logger="redis_txmq.check_handler")
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
