"""Every bad input is refused with a TxMQError subclass, and a refused send writes nothing to Redis."""

from __future__ import annotations

import pytest

from redis_txmq import (
    ConfigurationError,
    DelayNotSupportedError,
    InvalidMessageError,
    InvalidPropertyError,
    InvalidTopicError,
    LocalTransactionState,
    Message,
    MessageTooLargeError,
    ProducerStateError,
    ReservedPropertyError,
    Settings,
    TransactionProducer,
    TxMQError,
)

from .helpers import ScriptedListener

BAD_MESSAGES = [
    pytest.param(Message("", b"x"), InvalidTopicError, id="empty-topic"),
    pytest.param(Message("-orders", b"x"), InvalidTopicError, id="topic-leading-dash"),
    pytest.param(Message("or{ders}", b"x"), InvalidTopicError, id="topic-with-braces"),
    pytest.param(Message("orders#1", b"x"), InvalidTopicError, id="topic-with-hash"),
    pytest.param(Message("a b", b"x"), InvalidTopicError, id="topic-with-space"),
    pytest.param(Message("t" * 128, b"x"), InvalidTopicError, id="topic-too-long"),
    pytest.param(Message(None, b"x"), InvalidTopicError, id="topic-none"),  # type: ignore[arg-type]
    pytest.param(Message("orders", "text"), InvalidMessageError, id="body-str"),  # type: ignore[arg-type]
    pytest.param(Message("orders", None), InvalidMessageError, id="body-none"),  # type: ignore[arg-type]
    pytest.param(Message("orders", b"x" * 1025), MessageTooLargeError, id="body-too-large"),
    pytest.param(Message("orders", b"x", delay_seconds=5), DelayNotSupportedError, id="delay-seconds"),
    pytest.param(Message("orders", b"x", properties={"DELAY": "3"}), DelayNotSupportedError, id="delay-level"),
    pytest.param(
        Message("orders", b"x", properties={"TIMER_DELAY_SEC": "3"}), DelayNotSupportedError, id="timer-delay"
    ),
    pytest.param(Message("orders", b"x", properties={"KEYS": "k"}), ReservedPropertyError, id="reserved-keys"),
    pytest.param(
        Message("orders", b"x", properties={"txmq.anything": "v"}), ReservedPropertyError, id="reserved-prefix"
    ),
    pytest.param(
        Message("orders", b"x", properties={"n": 1}),
        InvalidPropertyError,  # type: ignore[dict-item]
        id="property-int-value",
    ),
    pytest.param(Message("orders", b"x", properties={"": "v"}), InvalidPropertyError, id="property-empty-name"),
    pytest.param(
        Message("orders", b"x", properties={1: "v"}),
        InvalidPropertyError,  # type: ignore[dict-item]
        id="property-int-name",
    ),
    pytest.param(
        Message("orders", b"x", properties=["a"]),
        InvalidPropertyError,  # type: ignore[arg-type]
        id="properties-not-dict",
    ),
    pytest.param(Message("orders", b"x", keys=""), InvalidMessageError, id="keys-empty"),
    pytest.param(Message("orders", b"x", keys=["a b"]), InvalidMessageError, id="key-with-space"),
    pytest.param(Message("orders", b"x", keys=[1]), InvalidMessageError, id="key-int"),  # type: ignore[list-item]
    pytest.param(Message("orders", b"x", tags="a||b"), InvalidMessageError, id="tags-expression"),
    pytest.param(Message("orders", b"x", tags=""), InvalidMessageError, id="tags-empty"),
    pytest.param(Message("orders", b"x", check_immunity_seconds=0), InvalidMessageError, id="immunity-zero"),
    pytest.param(Message("orders", b"x", check_immunity_seconds=-1), InvalidMessageError, id="immunity-negative"),
    pytest.param(
        Message("orders", b"x", check_immunity_seconds=float("inf")), InvalidMessageError, id="immunity-infinite"
    ),
    pytest.param(Message("orders", b"x", check_immunity_seconds=float("nan")), InvalidMessageError, id="immunity-nan"),
    pytest.param(Message("orders", b"x", check_immunity_seconds=1e16), InvalidMessageError, id="immunity-huge"),
]


@pytest.mark.parametrize(("message", "error"), BAD_MESSAGES)
def test_refused_send_raises_and_writes_nothing(client, message, error):
    listener = ScriptedListener()
    settings = Settings(max_message_size=1024)
    with TransactionProducer("orders-group", listener, client=client, settings=settings) as producer:
        before = snapshot(client)
        with pytest.raises(error) as raised:
            producer.send_message_in_transaction(message, LocalTransactionState.COMMIT)
        assert snapshot(client) == before, "a refused send must write nothing"
    assert isinstance(raised.value, TxMQError)
    assert str(raised.value)
    assert listener.executed == [], "the local transaction must not run for a refused message"
    assert not [k for k in client.keys("*") if not k.startswith((b"txmq:group:", b"txmq:groups"))]


def snapshot(client):
    """Every key with its type, and every stream's length: what a send would change."""
    keys = client.keys("*")
    return {key: (client.type(key), client.xlen(key) if client.type(key) == b"stream" else None) for key in keys}


def test_error_names_the_topic():
    with pytest.raises(MessageTooLargeError, match="'orders'.*max_message_size"):
        Message("orders", b"x" * 11).validate(max_message_size=10)


@pytest.mark.parametrize(
    ("message", "says"),
    [
        pytest.param(Message("orders", "text"), r"topic 'orders'.*bytes, not str.*encode it first", id="str-body"),
        pytest.param(Message("orders", b"x", keys=[""]), r"topic 'orders'.*every key.*non-empty", id="empty-key"),
        pytest.param(
            Message("orders", b"x", properties={"n": 1}),
            r"topic 'orders'.*property 'n' must have a str value, got int",
            id="int-property",
        ),
        pytest.param(
            Message("orders", b"x", properties={"Delay": "3"}),
            r"topic 'orders'.*property 'Delay' asks for a delay",
            id="delay-property",
        ),
    ],
)
def test_a_refusal_names_the_message_and_what_is_wrong(message, says):
    """The text a developer reads first says which message and which part is wrong, and how to fix it."""
    with pytest.raises(TxMQError, match=says):
        message.validate()


def test_valid_message_passes():
    Message(
        "orders.eu-1:v2", b"", keys=["a", "b"], tags="t", properties={"source": "web"}, check_immunity_seconds=0.5
    ).validate()
    assert Message("t", b"", keys="a b").keys_list == ["a", "b"]


@pytest.mark.parametrize("group", ["", "a b", "{g}", None])
def test_bad_producer_group_refused(fake_client, group):
    with pytest.raises(ConfigurationError):
        TransactionProducer(group, ScriptedListener(), client=fake_client)


def test_listener_must_be_a_transaction_listener(fake_client):
    with pytest.raises(ConfigurationError, match="TransactionListener"):
        TransactionProducer("g", object(), client=fake_client)  # type: ignore[arg-type]


def test_url_and_client_together_refused(fake_client):
    with pytest.raises(ConfigurationError, match="not both"):
        TransactionProducer("g", ScriptedListener(), client=fake_client, redis_url="redis://localhost:1/0")


def test_decoding_client_refused():
    import fakeredis

    with pytest.raises(ConfigurationError, match="decode_responses"):
        TransactionProducer("g", ScriptedListener(), client=fakeredis.FakeRedis(decode_responses=True))


def test_send_before_start_refused(fake_client):
    producer = TransactionProducer("g", ScriptedListener(), client=fake_client)
    with pytest.raises(ProducerStateError, match="start"):
        producer.send_message_in_transaction(Message("orders", b"x"))
    producer.start()
    producer.shutdown()
    with pytest.raises(ProducerStateError):
        producer.send_message_in_transaction(Message("orders", b"x"))
    with pytest.raises(ProducerStateError, match="shut down"):
        producer.start()
    assert fake_client.keys("*orders*") == []


def test_settings_from_env():
    settings = Settings.from_env(
        {"TXMQ_REDIS_URL": "redis://h:1/2", "TXMQ_MAX_MESSAGE_SIZE": "10", "TXMQ_CLUSTER": "true"}, dedupe_window=90
    )
    assert (settings.redis_url, settings.max_message_size, settings.cluster, settings.dedupe_window) == (
        "redis://h:1/2",
        10,
        True,
        90,
    )
    with pytest.raises(ConfigurationError, match="TXMQ_MAX_MESSAGE_SIZE"):
        Settings.from_env({"TXMQ_MAX_MESSAGE_SIZE": "big"})
    with pytest.raises(ConfigurationError):
        Settings(dedupe_window=-1)


SURROGATE = "\ud800"
"""A lone surrogate: a valid Python str that has no UTF-8 encoding, so Redis could never receive it."""

NOT_UTF8 = [
    pytest.param({"keys": f"order-{SURROGATE}"}, InvalidMessageError, "key", id="keys-str"),
    pytest.param({"keys": ["ok", f"k{SURROGATE}"]}, InvalidMessageError, "key", id="keys-list"),
    pytest.param({"tags": f"t{SURROGATE}"}, InvalidMessageError, "tags", id="tags"),
    pytest.param({"properties": {f"n{SURROGATE}": "v"}}, InvalidPropertyError, "property name", id="property-name"),
    pytest.param({"properties": {"source": f"v{SURROGATE}"}}, InvalidPropertyError, "'source'", id="property-value"),
]


@pytest.mark.parametrize(("fields", "error", "names"), NOT_UTF8)
@pytest.mark.parametrize("partitions", [1, 4], ids=["one-partition", "partitioned"])
def test_str_that_is_not_utf8_is_refused_before_any_write(real_client, fields, error, names, partitions):
    """A lone surrogate used to pass validation, register the topic, then fail with a bare UnicodeEncodeError."""
    from redis_txmq import create_topic

    if partitions > 1:
        create_topic(real_client, "orders", partitions)
    listener = ScriptedListener()
    with TransactionProducer("orders-group", listener, client=real_client) as producer:
        before = contents(real_client)
        with pytest.raises(error, match=f"{names}.*UTF-8") as raised:
            producer.send_message_in_transaction(Message("orders", b"x", **fields), LocalTransactionState.COMMIT)
        assert isinstance(raised.value, TxMQError) and "'orders'" in str(raised.value)
        assert contents(real_client) == before, "nothing written, the topic registry included"
    assert listener.executed == []


def contents(client):
    """Every key with its serialized value, except the producer group's own keys (heartbeats change them)."""
    return {key: client.dump(key) if not key.startswith(b"txmq:group:") else None for key in client.keys("*")}


def test_refused_send_leaves_a_fresh_server_empty_but_for_the_producers_own_keys(real_client):
    assert real_client.dbsize() == 0
    settings = Settings(max_message_size=1024)
    with TransactionProducer("orders-group", ScriptedListener(), client=real_client, settings=settings) as producer:
        own = set(real_client.keys("*"))
        assert own and all(k.startswith((b"txmq:group:", b"txmq:groups")) for k in own)
        for message in [
            Message("orders", b"x", tags=SURROGATE),
            Message("orders", b"x", properties=["not", "a", "mapping"]),  # type: ignore[arg-type]
            Message("orders", b"x" * 1025),
        ]:
            with pytest.raises(InvalidMessageError):
                producer.send_message_in_transaction(message)
        with pytest.raises(InvalidMessageError, match="expected a redis_txmq.Message"):
            producer.send_message_in_transaction({"topic": "orders", "body": b"x"})  # type: ignore[arg-type]
        assert real_client.dbsize() == len(own) and set(real_client.keys("*")) == own


@pytest.mark.parametrize(
    "name",
    ["delay", "Delay", "timer_delay_sec", "Timer_Delay_Ms", "timer_deliver_ms", "__startDeliverTime"],
)
def test_delay_properties_are_refused_whatever_their_case(name):
    with pytest.raises(DelayNotSupportedError, match=name):
        Message("orders", b"x", properties={name: "3"}).validate()


@pytest.mark.parametrize(
    "name", ["keys", "Tags", "uniq_key", "Transaction_Id", "real_topic", "pGroup", "TXMQ.anything", "Txmq.Other"]
)
def test_reserved_property_names_are_refused_whatever_their_case(name):
    with pytest.raises(ReservedPropertyError, match="reserved"):
        Message("orders", b"x", properties={name: "v"}).validate()


def test_names_near_the_reserved_ones_are_allowed():
    Message("orders", b"x", properties={"delayed": "no", "keys2": "k", "txmq": "v", "my.txmq.x": "v"}).validate()


def test_body_size_limit_exactly_at_and_one_past():
    Message("orders", b"x" * 1024).validate(max_message_size=1024)
    with pytest.raises(MessageTooLargeError, match="1025 bytes"):
        Message("orders", b"x" * 1025).validate(max_message_size=1024)


def test_body_size_of_a_memoryview_counts_bytes_not_items():
    import array

    Message("orders", memoryview(array.array("i", [0] * 256))).validate(max_message_size=256 * 4)
    with pytest.raises(MessageTooLargeError, match=f"{257 * 4} bytes"):
        Message("orders", memoryview(array.array("i", [0] * 257))).validate(max_message_size=256 * 4)


@pytest.mark.parametrize("topic", ["t" * 128, "orders\n", "orders\r\n", "\norders"])
def test_topic_name_one_past_the_limit_or_with_a_newline_is_refused(topic):
    with pytest.raises(InvalidTopicError):
        Message(topic, b"x").validate()


def test_check_immunity_one_past_the_limit_is_refused():
    import math

    from redis_txmq.core.message import MAX_CHECK_IMMUNITY_SECONDS

    with pytest.raises(InvalidMessageError, match="check_immunity_seconds"):
        Message("orders", b"x", check_immunity_seconds=math.nextafter(MAX_CHECK_IMMUNITY_SECONDS, math.inf)).validate()
    with pytest.raises(InvalidMessageError, match="check_immunity_seconds"):
        Message("orders", b"x", check_immunity_seconds=MAX_CHECK_IMMUNITY_SECONDS + 1).validate()


def test_values_exactly_at_the_limits_are_sent(real_client):
    """The largest body, the longest topic name and the longest own check immunity go through a real send."""
    from redis_txmq.core.keys import TopicKeys
    from redis_txmq.core.message import MAX_CHECK_IMMUNITY_SECONDS

    longest = "t" * 127
    settings = Settings(max_message_size=1024)
    with TransactionProducer("orders-group", ScriptedListener(), client=real_client, settings=settings) as producer:
        largest = producer.send_message_in_transaction(Message(longest, b"x" * 1024), LocalTransactionState.COMMIT)
        immune = producer.send_message_in_transaction(
            Message("orders", b"x", check_immunity_seconds=MAX_CHECK_IMMUNITY_SECONDS), LocalTransactionState.UNKNOWN
        )
        shortest = producer.send_message_in_transaction(
            Message("orders", b"x", check_immunity_seconds=0.0001), LocalTransactionState.UNKNOWN
        )
    assert largest.committed_id and real_client.xrange(longest)[0][1][b"body"] == b"x" * 1024
    keys = TopicKeys("orders")
    ((_, half), _) = real_client.xrange(keys.half_stream)
    assert half[b"check_immunity_ms"] == str(MAX_CHECK_IMMUNITY_SECONDS * 1000).encode()
    born = int(half[b"born_ms"])
    assert real_client.zscore(keys.due, immune.transaction_id) == born + MAX_CHECK_IMMUNITY_SECONDS * 1000
    assert real_client.xrange(keys.half_stream)[1][1][b"check_immunity_ms"] == b"1", "rounded up to 1 ms, never 0"
    assert real_client.zscore(keys.due, shortest.transaction_id) is not None
