"""``redis+sentinel://`` URLs: what they mean, what is refused, and that passwords never show."""

from __future__ import annotations

import pytest

from redis_txmq import ConfigurationError
from redis_txmq.core.clients import redact_url
from redis_txmq.spark.options import parse_options
from redis_txmq.transport.connection import connect
from redis_txmq.transport.sentinel import parse


def test_a_sentinel_url_names_the_sentinels_the_service_the_db_and_two_sets_of_credentials() -> None:
    target = parse(
        "rediss+sentinel://app:data%40pw@10.0.0.1:26379,[::1]:26380/orders-master/3"
        "?sentinel_username=watch&sentinel_password=s3cret&socket_timeout=2.5&ssl_ca_certs=/etc/ca.pem"
    )
    assert target.sentinels == [("10.0.0.1", 26379), ("::1", 26380)]
    assert (target.service_name, target.db, target.ssl) == ("orders-master", 3, True)
    assert (target.username, target.password) == ("app", "data@pw")
    assert (target.sentinel_username, target.sentinel_password) == ("watch", "s3cret")
    assert target.options == {"socket_timeout": 2.5, "ssl_ca_certs": "/etc/ca.pem"}
    assert "data@pw" not in repr(target) and "s3cret" not in repr(target)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis+sentinel://h1:26379", "/service_name"),
        ("redis+sentinel://h1/master", "not host:port"),
        ("redis+sentinel:///master", "no Sentinel"),
        ("redis+sentinel://h1:26379/master/x", "/service_name/db"),
        ("redis+sentinel://:pw@h1:26379/master?colour=blue", "unknown query parameter 'colour'"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_with_what_is_wrong_and_no_password(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint) as refused:
        parse(url)
    assert ":pw@" not in str(refused.value)


def test_passwords_are_redacted_from_every_kind_of_url() -> None:
    shown = redact_url("redis+sentinel://app:pw1@h1:1,h2:2/m?sentinel_password=pw2&socket_timeout=1")
    assert shown == "redis+sentinel://app:***@h1:1,h2:2/m?sentinel_password=***&socket_timeout=1"
    assert redact_url("rediss://:pw@host:6380/0") == "rediss://:***@host:6380/0"


def test_a_sentinel_url_is_not_a_cluster() -> None:
    with pytest.raises(ConfigurationError, match="not a cluster"):
        connect("redis+sentinel://h1:26379/master", cluster=True)


def test_spark_takes_the_sentinels_password_as_its_own_option_and_never_shows_it() -> None:
    options = parse_options(
        {"redis.url": "redis+sentinel://h1:26379/master", "redis.sentinelPassword": "s3cret", "topics": "orders"},
        streaming=False,
    )
    assert options.sentinel_password == "s3cret"
    assert "s3cret" not in repr(options)
