"""Consumer groups over topic streams: ack, re-delivery after a consumer dies, delivery limit, bad entries."""

from __future__ import annotations

import threading

import pytest

from redis_txmq import ConfigurationError, Consumer, LocalTransactionState, Message, TransactionProducer
from redis_txmq.keys import TopicKeys

from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK


def send(client, outcomes, topic="orders"):
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        return [
            producer.send_message_in_transaction(
                Message(topic, f"m{i}".encode(), keys=f"k{i}", properties={"i": str(i)}), outcome
            )
            for i, outcome in enumerate(outcomes)
        ]


def consumer(client, name="c1", **kwargs):
    kwargs.setdefault("block", 0.05)
    return Consumer("orders", "billing", name, client=client, **kwargs)


def drain(c, rounds=5):
    seen = []
    for _ in range(rounds):
        seen.extend(c.poll())
    return seen


def test_consumer_sees_committed_only_and_ack_clears_pending(client):
    results = send(client, [COMMIT, ROLLBACK, COMMIT])
    c = consumer(client)
    messages = drain(c)
    assert [m.body for m in messages] == [b"m0", b"m2"]
    assert [m.transaction_id for m in messages] == [results[0].transaction_id, results[2].transaction_id]
    assert messages[0].keys == ["k0"] and messages[0].properties == {"i": "0"} and messages[0].delivery_count == 1
    assert messages[0].id == results[0].committed_id and messages[0].timestamp_ms > 0
    assert client.xpending("orders", "billing")["pending"] == 2
    for m in messages:
        c.ack(m)
    assert client.xpending("orders", "billing")["pending"] == 0


def test_group_starts_from_the_beginning_by_default(client):
    send(client, [COMMIT])
    assert [m.body for m in drain(consumer(client))] == [b"m0"]


def test_unacked_message_of_dead_consumer_is_redelivered(client):
    send(client, [COMMIT])
    dead = consumer(client, "dead", min_idle_time=0.1)
    assert [m.body for m in dead.poll()] == [b"m0"]  # ...and it dies without acking
    survivor = consumer(client, "survivor", min_idle_time=0.1)
    redelivered = wait_until(lambda: survivor.poll())
    assert [m.body for m in redelivered] == [b"m0"] and redelivered[0].delivery_count == 2
    survivor.ack(redelivered[0])
    assert client.xpending("orders", "billing")["pending"] == 0


def test_delivery_limit_moves_entry_to_dead_letters(client):
    send(client, [COMMIT, COMMIT])
    c = consumer(client, min_idle_time=0.05, max_deliveries=2)
    first = drain(c, 2)
    ok = next(m for m in first if m.body == b"m1")
    c.ack(ok)
    deliveries = [m.delivery_count for m in first if m.body == b"m0"]
    wait_until(lambda: deliveries.extend(m.delivery_count for m in c.poll()) or len(c.dead_letters()) == 1)
    assert deliveries == [1, 2], "delivered at most max_deliveries times"
    ((dead_id, dead),) = c.dead_letters()
    assert dead["body"] == b"m0" and dead["dead_reason"] == b"delivery limit 2 reached"
    assert dead["dead_delivery_count"] == b"3" and dead["dead_group"] == b"billing"
    assert client.xpending("orders", "billing")["pending"] == 0
    assert client.xlen("orders") == 2, "the topic stream is never changed by a consumer"


def test_handler_failures_are_retried_then_dead_lettered(client):
    send(client, [COMMIT, COMMIT])
    c = consumer(client, min_idle_time=0.05, max_deliveries=3)
    calls = []

    def handler(message):
        calls.append(message.body)
        if message.body == b"m0":
            raise ValueError("cannot bill")

    worker = threading.Thread(target=c.run, args=(handler,))
    worker.start()
    try:
        wait_until(c.dead_letters)
    finally:
        c.stop()
        worker.join(timeout=10)
    assert not worker.is_alive()
    assert calls.count(b"m1") == 1 and calls.count(b"m0") == 3
    assert [d["body"] for _, d in c.dead_letters()] == [b"m0"]


def test_malformed_entry_is_dead_lettered_and_consumer_goes_on(client, caplog):
    client.xadd("orders", {"hello": "world"})
    send(client, [COMMIT])
    c = consumer(client)
    assert [m.body for m in drain(c)] == [b"m0"]
    ((_, dead),) = c.dead_letters()
    assert dead["hello"] == b"world" and dead["dead_reason"].startswith(b"malformed entry")
    assert any("malformed" in r.getMessage() for r in caplog.records)


def test_explicit_dead_letter_is_idempotent(client):
    send(client, [COMMIT])
    c = consumer(client)
    (message,) = drain(c)
    assert c.dead_letter(message, "poison pill") is True
    assert c.dead_letter(message, "poison pill") is False
    assert len(c.dead_letters()) == 1


def test_iteration_stops(client):
    send(client, [COMMIT, COMMIT])
    c = consumer(client)
    seen = []
    for message in c:
        seen.append(message.body)
        c.ack(message)
        if len(seen) == 2:
            c.stop()
    assert seen == [b"m0", b"m1"]


def test_dead_stream_shares_the_topic_slot():
    keys = TopicKeys("orders")
    assert keys.consumer_dead_stream("billing") == "txmq:{orders}:consumer-dead:billing"


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"min_idle_time": 0}, {"max_deliveries": 0}])
def test_bad_consumer_settings_refused(fake_client, kwargs):
    with pytest.raises(ConfigurationError):
        Consumer("orders", "billing", client=fake_client, **kwargs)


def test_bad_group_name_refused(fake_client):
    with pytest.raises(ConfigurationError):
        Consumer("orders", "bad group", client=fake_client)
