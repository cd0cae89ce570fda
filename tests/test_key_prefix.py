"""Every key the library writes begins with ``txmq:`` or is a topic stream: what an ACL user limited to ``~txmq:*``
and its topics' streams (what the README advised before ``txmq acl``) needs to run every part."""

from __future__ import annotations

import pytest
import redis

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionProducer, create_topic
from redis_txmq.checker import Checker
from redis_txmq.core.keys import CHECKER_LEVELS, PREFIX, TopicKeys

from .helpers import wait_until
from .test_checker import COMMIT, UNKNOWN, Answers, running

pytestmark = pytest.mark.real

FAST = Settings(transaction_timeout=0, check_interval=0.3, heartbeat_interval=0.3, claim_idle=1.0)
TOPIC_STREAMS = {"orders", "payments#0", "payments#1"}


def test_every_key_of_a_full_run_begins_with_the_prefix_or_is_a_topic_stream(real_client: redis.Redis) -> None:
    """A producer sends transactions of one message and of several (committed, and left UNKNOWN for the
    check-back), a checker runs its rounds, a consumer reads, acknowledges and dead-letters; then a SCAN of the
    server finds no other key."""
    create_topic(real_client, "payments", 2)
    listener = Answers(default=COMMIT)
    in_flight = [TopicKeys("orders").inflight, *(TopicKeys("payments", p, True).inflight for p in (0, 1))]
    with running(Checker(real_client, FAST, scan_interval=0.05)):
        with TransactionProducer("shop", listener, client=real_client, settings=FAST) as producer:
            producer.send_message_in_transaction(Message("orders", b"one"), COMMIT)
            producer.send_message_in_transaction(Message("orders", b"one, by check-back"), UNKNOWN)
            several = [Message("orders", b"several"), Message("payments", b"several", keys="k")]
            producer.send_messages_in_transaction(several, COMMIT)
            producer.send_messages_in_transaction(several, UNKNOWN)
            producer.send_messages_in_transaction(several, LocalTransactionState.ROLLBACK)
            wait_until(lambda: all(real_client.hlen(key) == 0 for key in in_flight), timeout=30)
            keys = scan(real_client)  # the live instances' keys too (they leave theirs on shutdown)
    assert real_client.xlen("orders") == 4
    with Consumer("orders", "billing", client=real_client, block=0.1) as consumer:
        received = wait_until(consumer.poll)
        consumer.ack(received[0])
        assert consumer.dead_letter(received[1], "a reason")

    keys |= scan(real_client)
    assert CHECKER_LEVELS in keys and TopicKeys("orders").consumer_dead_stream("billing") in keys  # all was run
    outside = sorted(key for key in keys if not key.startswith(f"{PREFIX}:") and key not in TOPIC_STREAMS)
    assert outside == []
    assert {real_client.type(key) for key in keys & TOPIC_STREAMS} == {b"stream"}


def scan(client: redis.Redis) -> set[str]:
    return {key.decode() for key in client.scan_iter(count=1000)}
