"""``Settings(...)`` built in code without ``redis_url`` reads ``TXMQ_REDIS_URL``, as the CLI and ``Settings.from_env``
do: a service configured through its environment must not silently go to ``localhost:6379``."""

from __future__ import annotations

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.core.config import DEFAULT_REDIS_URL

from .helpers import ScriptedListener

ELSEWHERE = "redis://10.0.0.7:6380/3"
"""Never connected to: only compared."""


def test_settings_without_redis_url_read_the_environment(monkeypatch):
    monkeypatch.setenv("TXMQ_REDIS_URL", ELSEWHERE)
    assert Settings(check_interval=5.0).redis_url == ELSEWHERE
    assert Settings().redis_url == ELSEWHERE
    assert Settings(redis_url="redis://h:1/0").redis_url == "redis://h:1/0", "an explicit URL wins"
    assert Settings.from_env().redis_url == ELSEWHERE


def test_without_the_variable_the_default_applies(monkeypatch):
    monkeypatch.delenv("TXMQ_REDIS_URL", raising=False)
    assert Settings(check_interval=5.0).redis_url == DEFAULT_REDIS_URL
    monkeypatch.setenv("TXMQ_REDIS_URL", "")
    assert Settings().redis_url == DEFAULT_REDIS_URL, "an empty variable counts as unset, as in from_env"


def test_from_env_with_its_own_mapping_reads_only_that_mapping(monkeypatch):
    monkeypatch.setenv("TXMQ_REDIS_URL", ELSEWHERE)
    assert Settings.from_env({}).redis_url == DEFAULT_REDIS_URL
    assert Settings.from_env({"TXMQ_REDIS_URL": "redis://h:2/0"}).redis_url == "redis://h:2/0"


def test_a_producer_given_settings_in_code_uses_the_environments_redis(monkeypatch, redis_url, real_client):
    """The case that went to a machine's own Redis: settings tuned in code, the server named by the environment."""
    monkeypatch.setenv("TXMQ_REDIS_URL", redis_url)
    settings = Settings(transaction_timeout=30.0, heartbeat_interval=0.5)
    assert settings.redis_url == redis_url  # checked before connecting: a wrong URL would be localhost:6379
    with TransactionProducer("env_group", ScriptedListener(), settings=settings) as producer:
        assert producer.settings.redis_url == redis_url
        result = producer.send_message_in_transaction(Message("env_orders", b"x"), LocalTransactionState.COMMIT)
    assert real_client.xrange("env_orders")[0][1][b"transaction_id"].decode() == result.transaction_id
