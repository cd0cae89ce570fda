"""Entries another tool wrote with a malformed ``properties`` field: dead-lettered with the reason, and the consumer
goes on with the next message (SPEC §5, bad input). test_consumer.py covers entries without a body."""

from __future__ import annotations

import pytest

from redis_txmq import Consumer, LocalTransactionState, Message, TransactionProducer

from .helpers import ScriptedListener


@pytest.mark.parametrize("properties", [b'["not", "an", "object"]', b'{"n": 1}', b"{not json"])
def test_entry_with_malformed_properties_is_dead_lettered_and_the_consumer_goes_on(client, properties):
    client.xadd("orders", {"body": b"foreign", "transaction_id": "t" * 32, "properties": properties})
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        producer.send_message_in_transaction(Message("orders", b"good"), LocalTransactionState.COMMIT)
    consumer = Consumer("orders", "billing", "c1", client=client, block=0.05)
    seen = [m.body for _ in range(5) for m in consumer.poll()]
    assert seen == [b"good"]
    ((_, dead),) = consumer.dead_letters()
    assert dead["body"] == b"foreign" and dead["properties"] == properties
    assert b"properties" in dead["dead_reason"]
