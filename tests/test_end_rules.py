"""The rules of the end script that the producer alone cannot reach: an ended transaction answered to another
group, UNKNOWN after an outcome, dead-lettered transactions prepared or ended again, the op stream's cap, and the
dedupe window's boundaries (0 and 1 ms, which only a direct caller of the script can ask for). On a real Redis:
these are the scripts' rules."""

from __future__ import annotations

import pytest

from redis_txmq import (
    LocalTransactionState,
    Message,
    ProducerGroupMismatchError,
    Settings,
    TransactionDeadLetteredError,
)
from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys
from redis_txmq.core.scripts import register_topic_script
from redis_txmq.sync.broker import EndSource, RedisBroker

from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")
GROUP = "order_group"


def everything(client) -> dict[bytes, tuple[bytes, bytes]]:
    """Every key with its type and serialized value: equal before and after means nothing was written."""
    return {key: (client.type(key), client.dump(key)) for key in client.keys("*")}


@pytest.fixture
def broker(real_client):
    broker = RedisBroker(real_client, Settings())
    broker.load_scripts()
    yield broker
    broker.close()


@pytest.fixture
def sent(real_client, make_producer):
    """Send one message per outcome, with each producer API; returns ``{outcome: result}``."""
    with make_producer(GROUP, ScriptedListener(), client=real_client) as producer:
        results = {
            state: producer.send_message_in_transaction(Message("orders", b"x"), state) for state in (COMMIT, ROLLBACK)
        }
    return results


@pytest.mark.parametrize("first", [COMMIT, ROLLBACK])
@pytest.mark.parametrize("again", [COMMIT, ROLLBACK, UNKNOWN])
def test_an_ended_transaction_is_refused_to_another_producer_group(real_client, broker, sent, first, again):
    """Whatever the outcome asked: the group check comes before the duplicate and conflict answers."""
    transaction_id = sent[first].transaction_id
    before = everything(real_client)
    with pytest.raises(ProducerGroupMismatchError, match=f"{transaction_id}.*producer group {GROUP}") as raised:
        broker.end_transaction(KEYS, transaction_id, "other_group", again, source=EndSource.PRODUCER)
    assert (raised.value.topic, raised.value.transaction_id) == ("orders", transaction_id)
    assert everything(real_client) == before


@pytest.mark.parametrize("first", [COMMIT, ROLLBACK])
@pytest.mark.parametrize("source", [EndSource.PRODUCER, EndSource.CHECKER])
def test_unknown_after_an_outcome_is_a_duplicate_not_a_conflict(real_client, broker, sent, first, source):
    """A late UNKNOWN (a check answered after the producer's own end) returns the first result and writes nothing,
    not even its remark."""
    result = sent[first]
    before = everything(real_client)
    late = broker.end_transaction(
        KEYS, result.transaction_id, GROUP, UNKNOWN, source=source, remark="the database did not answer"
    )
    assert (late.state, late.half_id, late.committed_id, late.applied) == (
        first.value,
        result.half_id,
        result.committed_id,
        False,
    )
    assert everything(real_client) == before


@pytest.fixture
def dead_lettered(real_client, broker):
    """A transaction the checker gave up on: one check (nobody answers it), then check_max is reached."""
    message = Message("orders", b"given up", keys="order-9", properties={"source": "web"})
    prepared = broker.prepare_half(KEYS, message, "tx-dead", GROUP)
    checker = Checker(real_client, Settings(transaction_timeout=0, check_interval=0.05, check_max=1))

    def given_up() -> bool:
        checker.run_round()
        return bool(real_client.hexists(KEYS.dead_index, "tx-dead"))

    wait_until(given_up)
    assert not real_client.hexists(KEYS.inflight, "tx-dead") and real_client.xlen(KEYS.half_stream) == 0
    return message, prepared


def test_a_retried_prepare_of_a_dead_lettered_transaction_writes_nothing(real_client, dead_lettered):
    """redis-py may retry a prepare whose reply was lost after the checker buried the transaction: the retry must
    not bring it back as a new half message. A fresh broker also registers the topic again (already there)."""
    message, _ = dead_lettered
    retrying = RedisBroker(real_client, Settings())
    before = everything(real_client)
    try:
        retried = retrying.prepare_half(KEYS, message, "tx-dead", GROUP)
    finally:
        retrying.close()
    assert (retried.state, retried.duplicate) == ("DEAD", True)
    assert everything(real_client) == before


@pytest.mark.parametrize("outcome", [COMMIT, ROLLBACK, UNKNOWN])
def test_ending_a_dead_lettered_transaction_raises_the_dead_letter_error(real_client, broker, dead_lettered, outcome):
    before = everything(real_client)
    with pytest.raises(TransactionDeadLetteredError, match="tx-dead.*dead-letter.*txmq dead") as raised:
        broker.end_transaction(KEYS, "tx-dead", GROUP, outcome, source=EndSource.PRODUCER)
    assert (raised.value.topic, raised.value.transaction_id) == ("orders", "tx-dead")
    assert everything(real_client) == before
    assert real_client.xlen("orders") == 0


def test_the_op_stream_keeps_its_cap(real_client, make_producer):
    """``XADD MAXLEN ~`` trims whole nodes of ``stream-node-max-entries``: the op stream holds at most the cap plus
    one node, however many transactions end (three nodes' worth here)."""
    node = int(real_client.config_get("stream-node-max-entries")["stream-node-max-entries"])
    settings = Settings(op_stream_maxlen=10)
    with make_producer(GROUP, ScriptedListener(), client=real_client, settings=settings) as producer:
        results = [
            producer.send_message_in_transaction(Message("orders", b"x"), COMMIT if i % 2 else ROLLBACK)
            for i in range(3 * node + 10)
        ]
        assert real_client.xlen(KEYS.op_stream) <= 10 + node
    newest = real_client.xrevrange(KEYS.op_stream, count=1)[0][1]
    assert newest[b"transaction_id"].decode() == results[-1].transaction_id
    assert real_client.xlen("orders") == len(results) // 2


def _end(script, transaction_id: str, outcome: LocalTransactionState, window_ms: int, remark: str = "") -> list:
    """``lua/end_transaction.lua`` called directly: any dedupe window the script takes, none the settings refuse."""
    args = [transaction_id, GROUP, outcome.value, EndSource.PRODUCER.value, remark, window_ms, 1000, ""]
    return [part.decode() if isinstance(part, bytes) else part for part in script(keys=KEYS.script_keys(), args=args)]


@pytest.fixture
def end_script(real_client, broker):
    """The end script, and a transaction ``tx-w`` in flight whose check-back answered UNKNOWN with a remark (the
    remark a transaction's dead letter would show)."""
    broker.prepare_half(KEYS, Message("orders", b"x"), "tx-w", GROUP)
    script = register_topic_script(real_client, "end_transaction")
    assert _end(script, "tx-w", UNKNOWN, 60_000, remark="the database did not answer")[4] == "RECORDED"
    assert real_client.hget(KEYS.remarks, "tx-w") == b"the database did not answer"
    return script


def test_a_dedupe_window_of_0_remembers_nothing_and_forgets_the_remark(real_client, end_script):
    """A window of 0: the outcome is not remembered (a repeat is NOT_FOUND) and the transaction's remark goes with
    its half message, since no remembered outcome would ever take it away: nothing of it is left."""
    assert _end(end_script, "tx-w", COMMIT, 0)[:2] == ["OK", "COMMIT"]
    assert real_client.xlen("orders") == 1
    for key in (KEYS.ended, KEYS.remarks, KEYS.inflight):
        assert real_client.hlen(key) == 0, key
    assert real_client.zcard(KEYS.ended_at) == 0
    assert _end(end_script, "tx-w", COMMIT, 0)[:2] == ["ERR", "NOT_FOUND"]


def test_a_dedupe_window_of_1_ms_remembers_the_outcome_and_the_remark_until_it_passes(real_client, end_script):
    """A window of 1 ms is a window: the outcome is remembered (a repeat is a DUPLICATE) and the remark stays with
    it; once the window has passed, the next sweep forgets both."""
    ended = _end(end_script, "tx-w", COMMIT, 1)
    assert ended[:2] == ["OK", "COMMIT"] and ended[4] == "APPLIED"
    assert real_client.hexists(KEYS.ended, "tx-w")
    assert real_client.zscore(KEYS.ended_at, "tx-w") is not None
    assert real_client.hget(KEYS.remarks, "tx-w") == b"the database did not answer"
    again = _end(end_script, "tx-w", COMMIT, 1)
    assert again[:2] == ["OK", "COMMIT"] and again[3:5] == [ended[3], "DUPLICATE"]
    remembered_ms = real_client.zscore(KEYS.ended_at, "tx-w")
    claim = register_topic_script(real_client, "claim_checks")

    def swept() -> bool:
        seconds, micros = real_client.time()
        if seconds * 1000 + micros // 1000 <= remembered_ms + 1:
            return False  # the window has not passed yet on the server's clock
        claim(keys=KEYS.script_keys(), args=[0, 1000, 1, 3_600_000, 10, 1])
        return True

    wait_until(swept)
    assert not real_client.hexists(KEYS.ended, "tx-w") and real_client.zcard(KEYS.ended_at) == 0
    assert real_client.hlen(KEYS.remarks) == 0


BAD_NUMBERS = [
    ("nan", 1000),
    ("inf", 1000),
    ("-1", 1000),
    (60_000, "nan"),
    (60_000, "inf"),
    (60_000, "1.5"),
    (60_000, "0"),
    (60_000, "1e300"),
]
"""``(dedupe_window_ms, op_stream_maxlen)`` pairs no end may take: a NaN passes every ``<`` check, and the numbers
reach the op record's ``XADD`` after the topic entry is written (a refusal there left the message published and the
transaction in flight: published again by the next end)."""


@pytest.mark.parametrize(("window_ms", "op_maxlen"), BAD_NUMBERS)
def test_an_end_with_numbers_it_cannot_write_is_refused_before_anything_is_written(
    real_client, broker, window_ms, op_maxlen
):
    broker.prepare_half(KEYS, Message("orders", b"x"), "tx-n", GROUP)
    before = everything(real_client)
    single = register_topic_script(real_client, "end_transaction")
    batch = register_topic_script(real_client, "end_transactions")
    args = ["tx-n", GROUP, "COMMIT", EndSource.PRODUCER.value, "", window_ms, op_maxlen, ""]
    for _ in range(2):  # a retry too
        reply = single(keys=KEYS.script_keys(), args=args)
        assert reply[:2] == [b"ERR", b"BADARG"], reply
        # in a batch: after a good end of another transaction whose numbers it does not share, and alone
        (first, second) = batch(keys=KEYS.script_keys(), args=[8, "tx-other", *args[1:5], 60_000, 1000, "", *args])
        assert first[:2] == [b"ERR", b"NOT_FOUND"] and second[:2] == [b"ERR", b"BADARG"], (first, second)
    assert everything(real_client) == before


@pytest.mark.parametrize(("window_ms", "op_maxlen"), BAD_NUMBERS)
def test_an_operators_decision_with_numbers_it_cannot_write_is_refused(
    real_client, dead_lettered, window_ms, op_maxlen
):
    before = everything(real_client)
    resolve = register_topic_script(real_client, "dead_resolve")
    reply = resolve(keys=KEYS.script_keys(), args=["tx-dead", "COMMIT", window_ms, op_maxlen, "by hand"])
    assert reply[:2] == [b"ERR", b"BADARG"], reply
    assert everything(real_client) == before


@pytest.mark.parametrize("window_ms", [2_000_000_000_000, 2**53])
def test_a_dedupe_window_longer_than_the_clocks_time_forgets_nothing_and_fails_no_end(real_client, broker, window_ms):
    """A window past the server's time in ms (about 57 years) made the sweep's cutoff negative: XTRIM refused it in
    the ends that sweep (one in ten, by the op record's time), after the message was published and before the
    transaction was retired, and the next end published it again. The checker's claim, which sweeps too, failed."""
    script = register_topic_script(real_client, "end_transaction")
    for i in range(40):  # one end in ten sweeps: a run of 40 has one that does with near certainty
        broker.prepare_half(KEYS, Message("orders", b"x"), f"tx-{i}", GROUP)
        args = [f"tx-{i}", GROUP, "COMMIT", EndSource.PRODUCER.value, "", window_ms, 1000, ""]
        reply = script(keys=KEYS.script_keys(), args=args)
        assert reply[:2] == [b"OK", b"COMMIT"] and reply[4] == b"APPLIED", reply
    assert real_client.xlen("orders") == 40 and real_client.hlen(KEYS.inflight) == 0
    assert real_client.hlen(KEYS.ended) == 40, "every outcome is remembered"
    claim = register_topic_script(real_client, "claim_checks")
    reply = claim(keys=KEYS.script_keys(), args=[0, 1000, 1, 3_600_000, 10, window_ms])
    assert not isinstance(reply, Exception) and reply[0] != b"ERR", reply
    assert real_client.hlen(KEYS.ended) == 40 and real_client.xlen(KEYS.op_stream) == 40


@pytest.mark.parametrize("outcome", ["COMMIT", "ROLLBACK"])
@pytest.mark.parametrize("script_name", ["end_transaction", "end_transactions"])
def test_an_op_stream_of_another_type_refuses_the_end_and_leaves_nothing_published(
    real_client, broker, outcome, script_name
):
    """The op record is written after the topic entry: its key written over by another tool used to fail the end
    with the message published and the transaction in flight, published again by every end after it. The entry is
    deleted again in the same call; once the key is repaired, the end publishes the message once."""
    broker.prepare_half(KEYS, Message("orders", b"x"), "tx-o", GROUP)
    real_client.set(KEYS.op_stream, "someone else's value")
    script = register_topic_script(real_client, script_name)
    args = ["tx-o", GROUP, outcome, EndSource.CHECKER.value, "", 60_000, 1000, ""]
    batched = script_name == "end_transactions"
    for _ in range(3):
        reply = script(keys=KEYS.script_keys(), args=[8, *args] if batched else args)
        reply = reply[0] if batched else reply
        assert reply[:2] == [b"ERR", b"WRONGTYPE"] and KEYS.op_stream.encode() in reply[2], reply
        assert real_client.xlen("orders") == 0 and real_client.hexists(KEYS.inflight, "tx-o")
    real_client.delete(KEYS.op_stream)
    reply = script(keys=KEYS.script_keys(), args=[8, *args] if batched else args)
    assert (reply[0] if batched else reply)[:2] == [b"OK", outcome.encode()]
    assert real_client.xlen("orders") == (1 if outcome == "COMMIT" else 0)
    assert not real_client.hexists(KEYS.inflight, "tx-o") and real_client.xlen(KEYS.op_stream) == 1
