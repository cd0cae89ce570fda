"""A refused message says which message and which part is wrong, and how to fix it: the text a developer reads
first (test_message.py checks the exception types and that nothing is written)."""

from __future__ import annotations

import pytest

from redis_txmq import Message, TxMQError


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
    with pytest.raises(TxMQError, match=says):
        message.validate()
