"""The life of a transaction through the public names: commit, rollback, UNKNOWN, repeated and refused ends."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from redis_txmq import (
    ConfigurationError,
    CorruptEntryError,
    InvalidPropertyError,
    LocalTransactionState,
    Message,
    PrepareError,
    ProducerGroupMismatchError,
    SendStatus,
    Settings,
    TransactionConflictError,
    TransactionNotFoundError,
)
from redis_txmq.core.keys import TOPIC_REGISTRY, TopicKeys
from redis_txmq.sync.broker import EndSource

from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
KEYS = TopicKeys("orders")


@pytest.fixture
def listener():
    return ScriptedListener()


@pytest.fixture
def producer(client, listener, make_producer):
    with make_producer("order_group", listener, client=client) as producer:
        yield producer


def topic_entries(client, topic="orders"):
    return client.xrange(topic)


def in_flight(client):
    return {k.decode(): v.decode() for k, v in client.hgetall(KEYS.inflight).items()}


def test_commit_is_visible_once_with_its_fields(client, producer, listener):
    message = Message(
        "orders", b'{"order_id": 1}\x00\xff', keys="order-1", tags="created", properties={"source": "web"}
    )
    result = producer.send_message_in_transaction(message, COMMIT)

    assert result.local_transaction_state is COMMIT
    assert result.send_status is SendStatus.SEND_OK
    assert result.committed_id and result.half_id and result.end_error is None
    assert listener.executed[0].transaction_id == result.transaction_id
    entries = topic_entries(client)
    assert len(entries) == 1
    entry_id, fields = entries[0]
    assert entry_id.decode() == result.committed_id
    assert fields == {
        b"transaction_id": result.transaction_id.encode(),
        b"body": b'{"order_id": 1}\x00\xff',
        b"keys": b"order-1",
        b"tags": b"created",
        b"properties": b'{"source":"web"}',
    }
    assert client.xlen(KEYS.half_stream) == 0, "a committed half message is retired"
    assert in_flight(client) == {}
    ops = client.xrange(KEYS.op_stream)
    assert len(ops) == 1 and ops[0][1][b"outcome"] == b"COMMIT" and ops[0][1][b"source"] == b"producer"
    assert client.smembers(TOPIC_REGISTRY) == {b"orders"}


def test_minimal_message_has_only_id_and_body(client, producer):
    producer.send_message_in_transaction(Message("orders", b""), COMMIT)
    ((_, fields),) = topic_entries(client)
    assert set(fields) == {b"transaction_id", b"body"} and fields[b"body"] == b""


def test_rollback_is_invisible_and_leaves_nothing_in_flight(client, producer):
    result = producer.send_message_in_transaction(Message("orders", b"cancelled"), ROLLBACK)
    assert result.local_transaction_state is ROLLBACK and result.committed_id is None
    assert topic_entries(client) == []
    assert client.xlen(KEYS.half_stream) == 0 and in_flight(client) == {}
    assert client.xrange(KEYS.op_stream)[0][1][b"outcome"] == b"ROLLBACK"


@pytest.mark.parametrize("answer", [UNKNOWN, None, "not-a-state"], ids=["unknown", "none", "garbage"])
def test_unknown_leaves_the_half_message_in_flight(client, producer, answer):
    result = producer.send_message_in_transaction(Message("orders", b"pending", keys="k"), answer)
    assert result.local_transaction_state is UNKNOWN and result.committed_id is None
    assert topic_entries(client) == []
    assert in_flight(client) == {result.transaction_id: result.half_id}
    ((half_id, half),) = client.xrange(KEYS.half_stream)
    assert half_id.decode() == result.half_id
    assert half[b"transaction_id"] == result.transaction_id.encode()
    assert half[b"producer_group"] == b"order_group" and half[b"body"] == b"pending" and half[b"keys"] == b"k"
    assert client.zscore(KEYS.unchecked, result.transaction_id) is not None, "waits for its first check"


def test_listener_exception_is_unknown_with_remark(client, producer, caplog):
    def boom(message):
        raise RuntimeError("database is down")

    result = producer.send_message_in_transaction(Message("orders", b"x"), boom)
    assert result.local_transaction_state is UNKNOWN
    assert "RuntimeError: database is down" in result.remark
    assert client.hget(KEYS.remarks, result.transaction_id).decode() == result.remark
    assert in_flight(client) == {result.transaction_id: result.half_id}
    assert any(result.transaction_id in r.getMessage() for r in caplog.records), "logged with the transaction id"


def test_string_answers_are_accepted(client, producer):
    result = producer.send_message_in_transaction(Message("orders", b"x"), "COMMIT")
    assert result.local_transaction_state is COMMIT and len(topic_entries(client)) == 1


def test_duplicate_end_with_same_outcome_appends_nothing(client, producer):
    result = producer.send_message_in_transaction(Message("orders", b"once"), COMMIT)
    for _ in range(3):
        again = producer.broker.end_transaction(
            KEYS, result.transaction_id, "order_group", COMMIT, source=EndSource.CHECKER
        )
        assert (again.state, again.committed_id, again.applied) == ("COMMIT", result.committed_id, False)
    assert len(topic_entries(client)) == 1
    assert client.xlen(KEYS.op_stream) == 1


def test_conflicting_end_is_refused(client, producer):
    committed = producer.send_message_in_transaction(Message("orders", b"c"), COMMIT)
    rolled_back = producer.send_message_in_transaction(Message("orders", b"r"), ROLLBACK)
    with pytest.raises(TransactionConflictError, match=f"{committed.transaction_id}.*already ended with COMMIT"):
        producer.broker.end_transaction(
            KEYS, committed.transaction_id, "order_group", ROLLBACK, source=EndSource.CHECKER
        )
    with pytest.raises(TransactionConflictError, match="ROLLBACK"):
        producer.broker.end_transaction(
            KEYS, rolled_back.transaction_id, "order_group", COMMIT, source=EndSource.CHECKER
        )
    assert [f[b"body"] for _, f in topic_entries(client)] == [b"c"]


def test_end_from_another_group_is_refused(client, producer):
    pending = producer.send_message_in_transaction(Message("orders", b"p"), UNKNOWN)
    with pytest.raises(ProducerGroupMismatchError, match="order_group"):
        producer.broker.end_transaction(KEYS, pending.transaction_id, "other_group", COMMIT, source=EndSource.CHECKER)
    assert topic_entries(client) == [] and pending.transaction_id in in_flight(client)


def test_end_of_unknown_transaction_is_refused(client, producer):
    with pytest.raises(TransactionNotFoundError, match="'orders', transaction nope"):
        producer.broker.end_transaction(KEYS, "nope", "order_group", COMMIT, source=EndSource.CHECKER)
    assert topic_entries(client) == []


def test_late_commit_of_unknown_transaction_appends_once(client, producer):
    pending = producer.send_message_in_transaction(Message("orders", b"late"), UNKNOWN)
    first = producer.broker.end_transaction(
        KEYS, pending.transaction_id, "order_group", COMMIT, source=EndSource.CHECKER
    )
    second = producer.broker.end_transaction(
        KEYS, pending.transaction_id, "order_group", COMMIT, source=EndSource.PRODUCER
    )
    assert first.applied and not second.applied and first.committed_id == second.committed_id
    assert len(topic_entries(client)) == 1 and in_flight(client) == {}


def test_retried_prepare_makes_one_half_message(client, producer):
    """redis-py retries a timed-out command: the same transaction id must not create a second half message."""
    message = Message("orders", b"retry")
    first = producer.broker.prepare_half(KEYS, message, "tx-retry", "order_group")
    second = producer.broker.prepare_half(KEYS, message, "tx-retry", "order_group")
    assert not first.duplicate and second.duplicate and first.half_id == second.half_id
    assert client.xlen(KEYS.half_stream) == 1
    producer.broker.end_transaction(KEYS, "tx-retry", "order_group", COMMIT, source=EndSource.PRODUCER)
    third = producer.broker.prepare_half(KEYS, message, "tx-retry", "order_group")
    assert third.duplicate and third.state == "COMMIT" and client.xlen(KEYS.half_stream) == 0


def test_scripts_reload_after_script_flush(client, producer):
    producer.send_message_in_transaction(Message("orders", b"before"), COMMIT)
    client.script_flush()
    result = producer.send_message_in_transaction(Message("orders", b"after"), COMMIT)
    assert result.committed_id
    assert [f[b"body"] for _, f in topic_entries(client)] == [b"before", b"after"]


def test_outcome_forgotten_after_dedupe_window(client, producer):
    result = producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
    client.zadd(KEYS.ended_at, {result.transaction_id: 0})  # older than the window
    client.hset(KEYS.remarks, result.transaction_id, "a remark left by an UNKNOWN before the commit")

    def forgotten() -> bool:
        # one end in ten (by the server's clock) forgets expired outcomes, in a batch
        producer.send_message_in_transaction(Message("orders", b"y"), ROLLBACK)
        return not client.hexists(KEYS.ended, result.transaction_id)

    wait_until(forgotten, timeout=20)
    assert not client.hexists(KEYS.remarks, result.transaction_id), "its remark goes with it"
    with pytest.raises(TransactionNotFoundError):
        producer.broker.end_transaction(KEYS, result.transaction_id, "order_group", COMMIT, source=EndSource.CHECKER)
    assert len(topic_entries(client)) == 1


def test_dedupe_window_outlives_redis_py_retries():
    with pytest.raises(ConfigurationError, match="dedupe_window"):
        Settings(dedupe_window=0)


@pytest.mark.parametrize(
    ("setting", "value", "what"),
    [
        ("op_stream_maxlen", float("nan"), "finite"),
        ("op_stream_maxlen", 1.5, "whole"),
        ("dedupe_window", float("nan"), "finite"),
        ("dedupe_window", float("inf"), "finite"),
        ("max_age", float("nan"), "finite"),
        ("check_max", 2.5, "whole"),
    ],
)
def test_settings_refuse_numbers_no_script_can_write(setting, value, what):
    """A NaN passes every bound (each comparison with it is false); the op stream's cap reaches an XADD after the topic
    entry is written, where a refusal would leave the message published and the transaction in flight."""
    with pytest.raises(ConfigurationError, match=f"{setting} must be a {what} number"):
        Settings(**{setting: value})
    assert Settings(op_stream_maxlen=10_000.0).op_stream_maxlen == 10_000


def test_settings_refuse_numbers_past_what_a_script_reads_exactly():
    """Past 2^53 a script's double is not the number sent: the end scripts refuse it, so every end would fail."""
    with pytest.raises(ConfigurationError, match="op_stream_maxlen must be from 1 to 2\\^53"):
        Settings(op_stream_maxlen=10**16)
    with pytest.raises(ConfigurationError, match="dedupe_window must be at most 2\\^53 ms"):
        Settings(dedupe_window=1e13)
    assert Settings(op_stream_maxlen=2**53).op_stream_maxlen == 2**53


def test_topic_key_of_another_type_refuses_before_the_local_transaction(client, producer, listener):
    client.set("orders", "not a stream")
    with pytest.raises(PrepareError, match="WRONGTYPE"):
        producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
    assert listener.executed == [] and client.xlen(KEYS.half_stream) == 0


def test_commit_onto_a_key_turned_into_another_type_keeps_the_transaction(client, producer):
    pending = producer.send_message_in_transaction(Message("orders", b"x"), UNKNOWN)
    client.delete("orders")
    client.set("orders", "someone else's value")
    with pytest.raises(CorruptEntryError, match="another type"):
        producer.broker.end_transaction(KEYS, pending.transaction_id, "order_group", COMMIT, source=EndSource.CHECKER)
    assert in_flight(client) == {pending.transaction_id: pending.half_id}, "nothing is lost: still in flight"
    assert client.xlen(KEYS.half_stream) == 1


def test_end_refuses_a_half_message_of_another_transaction(client, producer):
    first = producer.send_message_in_transaction(Message("orders", b"first"), UNKNOWN)
    second = producer.send_message_in_transaction(Message("orders", b"second"), UNKNOWN)
    client.hset(KEYS.inflight, first.transaction_id, second.half_id)  # a corrupted index
    with pytest.raises(CorruptEntryError, match=f"belongs to transaction {second.transaction_id}"):
        producer.broker.end_transaction(KEYS, first.transaction_id, "order_group", COMMIT, source=EndSource.CHECKER)
    assert topic_entries(client) == []


@pytest.mark.parametrize("immunity", ["nan", "inf", "1.5", "-1", "0x1f", "99999999999999999999"])
def test_prepare_script_refuses_bad_immunity_before_writing(client, producer, immunity):
    from redis_txmq.core.entries import prepare_args

    args = prepare_args(Message("orders", b"x"), "tx-bad", "order_group", 0)
    args[-1] = immunity
    reply = producer.broker._prepare(keys=KEYS.script_keys(), args=args)
    assert reply[0] == b"ERR" and reply[1] == b"BADARG"
    assert client.xlen(KEYS.half_stream) == 0 and in_flight(client) == {}


def test_ended_outcomes_expire_as_new_ends_arrive(client, listener, make_producer):
    with make_producer("order_group", listener, client=client) as producer:
        for _ in range(5):
            producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
        assert client.hlen(KEYS.ended) == 5
        aged = client.zrange(KEYS.ended_at, 0, -1)
        client.zadd(KEYS.ended_at, {m: 0 for m in aged})  # age them past the window
        later = []

        def forgotten() -> bool:
            later.append(producer.send_message_in_transaction(Message("orders", b"y"), ROLLBACK).transaction_id)
            return client.hlen(KEYS.ended) == len(later)

        wait_until(forgotten, timeout=20)
    assert {m.decode() for m in client.zrange(KEYS.ended_at, 0, -1)} == set(later), "only the aged ones forgotten"


def test_failed_end_returns_result_and_leaves_transaction_in_flight(client, producer, caplog, api):
    if api == "async":
        broker = producer.asyncio_producer.broker
        real_run = broker.runner.run

        async def lost_connection_on_end(script, *args):
            if script is broker._end:
                raise redis.ConnectionError("connection reset")
            return await real_run(script, *args)

        broker.runner.run = lost_connection_on_end
        result = producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
        broker.runner.run = real_run
    else:
        result = _send_with_end_lost(producer)
    assert result.local_transaction_state is COMMIT and result.committed_id is None
    assert "check-back will resolve it" in result.end_error
    assert in_flight(client) == {result.transaction_id: result.half_id}
    assert any("end COMMIT failed" in r.getMessage() for r in caplog.records)


def _send_with_end_lost(producer):
    real_run = producer.broker.runner.run

    def lost_connection_on_end(script, keys, args):
        if script is producer.broker._end:
            raise redis.ConnectionError("connection reset")
        return real_run(script, keys, args)

    producer.broker.runner.run = lost_connection_on_end
    result = producer.send_message_in_transaction(Message("orders", b"x"), COMMIT)
    producer.broker.runner.run = real_run
    return result


def test_concurrent_sends_from_threads(client, listener, make_producer):
    with make_producer("order_group", listener, client=client) as producer:

        def send(i):
            return producer.send_message_in_transaction(
                Message("orders", str(i).encode()), COMMIT if i % 3 else ROLLBACK
            )

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(send, range(90)))
    committed = {r.committed_id for r in results if r.committed_id}
    assert len(committed) == 60
    bodies = sorted(int(f[b"body"]) for _, f in topic_entries(client))
    assert bodies == [i for i in range(90) if i % 3]
    assert in_flight(client) == {} and client.xlen(KEYS.half_stream) == 0


def test_producer_closes_the_client_it_made(real_client, redis_url, listener, make_producer, request):
    """Counts the connections of this producer only, named through its URL: the shared server also holds those of
    earlier tests, some still closing on a busy machine, so counting them all (as this test did) was not about
    this producer."""
    name = f"closes-{request.node.callspec.id}"
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}client_name={name}"

    def connections() -> int:
        return sum(1 for client in real_client.client_list() if client.get("name") == name)

    with make_producer("order_group", listener, redis_url=url) as producer:
        assert producer.send_message_in_transaction(Message("orders", b"x"), COMMIT).committed_id
        assert connections() > 0
    wait_until(lambda: connections() == 0)


def test_redis_url_wins_over_settings(real_client, redis_url, listener, make_producer):
    """A URL given beside settings is the one used (settings carry the other knobs)."""
    settings = Settings(redis_url="redis://127.0.0.1:1/0", dedupe_window=120)
    with make_producer("order_group", listener, redis_url=redis_url, settings=settings) as producer:
        assert producer.settings.redis_url == redis_url and producer.settings.dedupe_window == 120
        assert producer.send_message_in_transaction(Message("orders", b"x"), COMMIT).committed_id
    assert real_client.xlen("orders") == 1


def test_the_callers_message_is_left_unchanged(client, producer, listener):
    properties = {"source": "web"}
    keys = ["order-1", "customer-2"]
    message = Message("orders", b"x", keys=keys, tags="created", properties=properties)
    before = dict(vars(message))

    def meddle(seen: Message) -> LocalTransactionState:
        seen.properties["added-by-listener"] = "yes"
        seen.keys.append("extra")
        seen.tags = "changed"
        return COMMIT

    result = producer.send_message_in_transaction(message, meddle)
    assert message.transaction_id is None, "the id is in the result and in the listener's message, not the caller's"
    assert vars(message) == before and message.properties is properties and message.keys is keys
    assert properties == {"source": "web"} and keys == ["order-1", "customer-2"]
    (seen,) = listener.executed
    assert seen is not message and seen.transaction_id == result.transaction_id
    ((_, fields),) = topic_entries(client)
    assert fields[b"tags"] == b"created" and fields[b"properties"] == b'{"source":"web"}', "written before the listener"


def test_threads_sending_one_message_each_see_their_own_transaction_id(client, listener, make_producer):
    """The producer used to set ``transaction_id`` on the caller's object: two threads sending it saw each other's
    ids, and a listener stored the wrong one, so the check-back answered for another transaction."""
    import threading

    message = Message("orders", b"shared")
    both_prepared = threading.Barrier(2, timeout=10)
    stored: dict[int, str] = {}  # send -> the transaction id its listener saw

    def execute_for(send_number: int):
        def execute(seen: Message) -> LocalTransactionState:
            both_prepared.wait()  # both half messages written before either listener reads its id
            stored[send_number] = seen.transaction_id
            return UNKNOWN

        return execute

    with make_producer("order_group", listener, client=client) as producer:

        def send(send_number):
            return send_number, producer.send_message_in_transaction(message, execute_for(send_number)).transaction_id

        with ThreadPoolExecutor(2) as pool:
            sent = dict(pool.map(send, range(2)))
    assert len(set(sent.values())) == 2
    assert stored == sent, "each listener saw the id of its own transaction"
    assert message.transaction_id is None
    assert set(in_flight(client)) == set(sent.values())


@pytest.mark.parametrize("kind", ["mappingproxy", "userdict", "mapping"])
def test_any_mapping_of_properties_is_accepted_whole(client, producer, listener, kind):
    import collections
    import types
    from collections.abc import Mapping

    class Frozen(Mapping):
        def __init__(self, data):
            self._data = dict(data)

        def __getitem__(self, key):
            return self._data[key]

        def __iter__(self):
            return iter(self._data)

        def __len__(self):
            return len(self._data)

    data = {"source": "web", "région": "île-de-france"}
    properties = {
        "mappingproxy": types.MappingProxyType(data),
        "userdict": collections.UserDict(data),
        "mapping": Frozen(data),
    }[kind]
    result = producer.send_message_in_transaction(Message("orders", b"x", properties=properties), COMMIT)
    assert result.committed_id
    ((_, fields),) = topic_entries(client)
    assert fields[b"properties"].decode() == '{"région":"île-de-france","source":"web"}'
    (seen,) = listener.executed
    assert type(seen.properties) is dict and seen.properties == data


def test_a_mapping_with_a_value_that_is_not_str_is_refused(client, producer):
    import types

    with pytest.raises(InvalidPropertyError, match="'n' must have a str value"):
        producer.send_message_in_transaction(
            Message("orders", b"x", properties=types.MappingProxyType({"n": 1})), COMMIT
        )
    assert client.keys("orders*") == [] and not client.exists(TOPIC_REGISTRY)
