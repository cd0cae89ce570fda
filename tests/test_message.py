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
