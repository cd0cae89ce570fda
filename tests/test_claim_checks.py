"""``lua/claim_checks.lua``'s argument check, on a real Redis: every argument out of its range, or not a number, is
refused with BADARG before anything is read or written (a checker of another version, or another tool, calling
it with a bad setting must not claim, count or forget anything), and each argument at its boundary is taken."""

from __future__ import annotations

import pytest

from redis_txmq import LocalTransactionState, Message, Settings
from redis_txmq.core.keys import TopicKeys
from redis_txmq.core.scripts import register_topic_script
from redis_txmq.sync.broker import EndSource, RedisBroker

from .helpers import wait_until

pytestmark = pytest.mark.real

KEYS = TopicKeys("orders")
GOOD = [0, 1, 1, 1, 1, 0]
"""transaction_timeout_ms, check_interval_ms, check_max, max_age_ms, limit, dedupe_window_ms: each at its boundary."""
NAMES = ["transaction_timeout_ms", "check_interval_ms", "check_max", "max_age_ms", "limit", "dedupe_window_ms"]
OUT_OF_RANGE = [-1, 0, 0, 0, 0, -1]


def everything(client) -> dict[bytes, tuple[bytes, bytes]]:
    return {key: (client.type(key), client.dump(key)) for key in client.keys("*")}


@pytest.fixture
def claim(real_client):
    """The script, with a transaction in flight (due at once) and an outcome remembered past a 0 ms window."""
    broker = RedisBroker(real_client, Settings())
    broker.load_scripts()
    try:
        broker.prepare_half(KEYS, Message("orders", b"due"), "tx-due", "order_group")
        broker.prepare_half(KEYS, Message("orders", b"ended"), "tx-ended", "order_group")
        broker.end_transaction(KEYS, "tx-ended", "order_group", LocalTransactionState.COMMIT, source=EndSource.PRODUCER)
    finally:
        broker.close()
    return register_topic_script(real_client, "claim_checks")


def server_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def _reply(script, args: list) -> list:
    reply = script(keys=KEYS.script_keys(), args=args)
    return [part.decode() if isinstance(part, bytes) else part for part in reply]


@pytest.mark.parametrize("bad", ["out of range", "not a number"])
@pytest.mark.parametrize("position", range(len(GOOD)), ids=NAMES)
def test_a_bad_argument_is_refused_and_nothing_is_touched(real_client, claim, position, bad):
    args = list(GOOD)
    args[position] = OUT_OF_RANGE[position] if bad == "out of range" else "x"
    before = everything(real_client)
    reply = _reply(claim, args)
    assert reply[:2] == ["ERR", "BADARG"], reply
    assert NAMES[position] in reply[2]
    assert everything(real_client) == before


def test_every_argument_at_its_boundary_is_taken(real_client, claim):
    """The same call with every argument at its boundary, once the server's clock is past the transactions' times:
    it gives up the due transaction (older than max_age 1 ms: dead-lettered) and forgets the outcome whose 0 ms
    window has passed."""
    latest = max(real_client.zscore(KEYS.ended_at, "tx-ended"), *[t for _, t in real_client.zscan_iter(KEYS.unchecked)])
    wait_until(lambda: server_ms(real_client) > latest + 1)
    reply = claim(keys=KEYS.script_keys(), args=GOOD)
    assert reply[0] == b"OK"
    assert [entry[0] for entry in reply[2]] == [b"tx-due"]
    assert real_client.hexists(KEYS.dead_index, "tx-due")
    assert not real_client.hexists(KEYS.ended, "tx-ended")
