"""Memory follows in-flight transactions, not history: a finished transaction's outcome and op record are
forgotten once the dedupe window has passed, by later ends or, when traffic stops, by the checker's rounds."""

from __future__ import annotations

import pytest

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.core import config
from redis_txmq.core.keys import TopicKeys

from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")


@pytest.fixture
def short_window(monkeypatch):
    """A dedupe window of 0.5 s: the 60 s floor exists for redis-py's retries, which these tests do not need."""
    monkeypatch.setattr(config, "MIN_DEDUPE_WINDOW", 0.1)
    return Settings(dedupe_window=0.5, transaction_timeout=3600)


def companion_keys_left(client):
    return [k for k in KEYS.script_keys() if k != KEYS.topic_stream and client.exists(k) and _holds_anything(client, k)]


def _holds_anything(client, key):
    kind = client.type(key)
    return client.xlen(key) > 0 if kind == b"stream" else True


def test_finished_transactions_are_forgotten_by_the_checker_once_the_window_passed(client, short_window):
    """The producer remembers outcomes for an hour, so its own ends forget nothing however slowly the 200 sends
    run; the checker's rounds, with the short window, then forget them all."""
    remembering = Settings(dedupe_window=3600, transaction_timeout=3600)
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=remembering) as producer:
        results = [
            producer.send_message_in_transaction(Message("orders", b"x"), COMMIT if i % 2 else ROLLBACK)
            for i in range(200)
        ]
    assert client.hlen(KEYS.ended) == 200 and client.xlen(KEYS.op_stream) == 200, "remembered within the window"
    checker = Checker(client, short_window)

    def forgotten():
        checker.run_round()
        return companion_keys_left(client) == []

    wait_until(forgotten, timeout=15, interval=0.1)
    assert client.xlen("orders") == 100, "committed messages stay in the topic stream"
    assert all(r.committed_id for r in results[1::2])


def test_later_ends_forget_earlier_outcomes_and_in_flight_ones_are_kept(client, short_window):
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=short_window) as producer:
        first = [producer.send_message_in_transaction(Message("orders", b"x"), COMMIT) for _ in range(10)]
        waiting = producer.send_message_in_transaction(Message("orders", b"y"), UNKNOWN)
        wait_until(lambda: client.time()[0] * 1000 + client.time()[1] // 1000 > _ended_at_ms(client) + 600)
        first_ids = {r.transaction_id for r in first}

        def forgotten() -> bool:
            # one end in ten, by the server's clock, forgets what has expired, in one batch
            producer.send_message_in_transaction(Message("orders", b"z"), COMMIT)
            return not first_ids & {k.decode() for k in client.hkeys(KEYS.ended)}

        wait_until(forgotten, timeout=20)
    op_records = {f[b"transaction_id"].decode() for _, f in client.xrange(KEYS.op_stream)}
    assert op_records and not op_records & first_ids, "their op records are trimmed too"
    assert client.hget(KEYS.inflight, waiting.transaction_id) == waiting.half_id.encode()


def _ended_at_ms(client):
    ((_, score),) = client.zrange(KEYS.ended_at, -1, -1, withscores=True)
    return int(score)
