"""A Redis URL's password never reaches an error message or a log line: errors name the URL with ``***``."""

from __future__ import annotations

import pytest

from redis_txmq import ConfigurationError
from redis_txmq.core.clients import redact_url
from redis_txmq.transport.connection import connect


def test_an_invalid_url_is_refused_without_its_password():
    with pytest.raises(ConfigurationError) as refused:
        connect("nonsense://operator:s3cret-pw@cache.internal:6380/0")
    assert "s3cret-pw" not in str(refused.value)
    assert "nonsense://operator:***@cache.internal:6380/0" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://operator:s3cret-pw@cache.internal:6380/0", "redis://operator:***@cache.internal:6380/0"),
        ("redis://:s3cret-pw@cache.internal/2", "redis://:***@cache.internal/2"),
        ("redis://cache.internal:6380/0", "redis://cache.internal:6380/0"),
        # redis-py also reads a password from the query string
        ("redis://operator@cache.internal/0?password=s3cret-pw", "redis://operator@cache.internal/0?password=***"),
        ("redis://cache.internal/0?db=1&PassWord=s3cret-pw", "redis://cache.internal/0?db=1&PassWord=***"),
        ("redis://cache.internal/0?pass%77ord=s3cret-pw", "redis://cache.internal/0?pass%77ord=***"),
        ("rediss://:a@cache.internal/0?password=s3cret-pw", "rediss://:***@cache.internal/0?password=***"),
        # a URL redis-py refuses (a bad port) is still shown, for the operator to see what is wrong
        (
            "redis://op:s3cret-pw@cache.internal:abc/0?password=s3cret-pw",
            "redis://op:***@cache.internal:abc/0?password=***",
        ),
        (
            "redis+sentinel://s1:26379/mymaster?password=s3cret-pw&sentinel_password=s3cret-pw",
            "redis+sentinel://s1:26379/mymaster?password=***&sentinel_password=***",
        ),
    ],
)
def test_urls_are_shown_without_their_password(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("redis://:ab/cdSecret==@host:6379/0", "ab/cdSecret=="),  # typed unencoded, with a "/": a bad port
        ("redis://:ab?cdSecret@host:6379/0", "ab?cdSecret"),
        ("redis://:p@ssw0rdSecret@host:notaport/0", "p@ssw0rdSecret"),
        ("redis://user:pa:ss/Secret@host:6379/0?db=1", "pa:ss/Secret"),
        ("redis://:s3cret-pw@host:abc/0?password=s3cret-pw", "s3cret-pw"),
        # redis-py takes these (the user name as the host): the parser reads the password's start as a port
        ("redis://user:/Secr3t@host:6379/0", "/Secr3t"),
        ("redis://user:?Secr3t@host:6379/0", "?Secr3t"),
        ("redis://user:#Secr3t@host:6379/0", "#Secr3t"),
        ("redis://user:2024/Summer@host:6379/0", "2024/Summer"),
        ("redis+sentinel://:pa/ssword@h1:26379,h2:26379/svc", "pa/ssword"),
        ("redis+sentinel://:pa?ssword@h1:26379/svc", "pa?ssword"),
    ],
)
def test_a_url_redis_py_refuses_never_shows_its_password(url, password):
    from redis_txmq.core.clients import scrub, url_secrets

    assert password not in redact_url(url)
    text = scrub(f"invalid Redis URL {url!r}: Port could not be cast; the password was {password}", url_secrets(url))
    assert password not in text and "invalid Redis URL" in text


@pytest.mark.parametrize("command", [["status"], ["dead", "list"]], ids=["status", "dead list"])
def test_the_cli_never_prints_the_password_of_a_url_it_refuses(command):
    from click.testing import CliRunner

    from redis_txmq.cli import main

    for url in ("redis://:ab/cdSecret==@127.0.0.1:6379/0", "redis://:ab?cdSecret@127.0.0.1:6379/0"):
        result = CliRunner().invoke(main, [*command, "--redis-url", url])
        assert result.exit_code != 0 and "cdSecret" not in result.output, result.output


@pytest.mark.parametrize(
    "url", ["redis+sentinel://:pa/ssword@127.0.0.1:1,127.0.0.1:2/svc", "redis+sentinel://:pa?ssword@127.0.0.1:1/svc"]
)
def test_a_sentinel_url_it_cannot_read_is_refused_without_any_part_of_its_password(url):
    from redis_txmq.transport.sentinel import parse

    with pytest.raises(ConfigurationError) as refused:
        parse(url)
    message = str(refused.value)
    assert not any(part in message for part in ("pa/ssword", "pa?ssword", "':pa'", "ssword@")), message
    assert "percent-encoded" in message
