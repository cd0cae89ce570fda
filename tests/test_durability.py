"""Durability levels: what a send waits for after its scripts, and what it reports when that does not come.

The level's own rules (the command, how its reply is read, the server checks) are tested without a server; the
behaviour on real servers: a master whose replica is stopped (SIGSTOP) so that ``WAIT`` times out, and ``aof`` on
whatever server the session runs (Redis 7.0 refuses it at start, Valkey 9 gives it)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from dataclasses import replace

import msgpack
import pytest
import redis
from click.testing import CliRunner

from redis_txmq import (
    ConfigurationError,
    LocalTransactionState,
    Message,
    PrepareError,
    Settings,
    TransactionListener,
    TransactionProducer,
)
from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.cli import main
from redis_txmq.core.durability import Durability
from redis_txmq.core.errors import DurabilityError
from redis_txmq.core.keys import JOB_REGISTRY, TopicKeys
from redis_txmq.jobs import STAGE_ROWS_FIELD, WriteJob, settle_jobs
from redis_txmq.sync.preload import preload
from redis_txmq.transport.embedded import EmbeddedRedis

from .helpers import wait_until
from .replicas import Stopped, replicated_fixture  # noqa: F401 - the fixture 'replicated'

FAST = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, claim_idle=1.0)
COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK


def test_the_levels_and_their_commands() -> None:
    assert Durability.of("master") is None
    replica = Durability.of("replica", 2, 0.5)
    assert replica is not None and replica.command == ("WAIT", 2, 500)
    assert replica.confirmed(2) and not replica.confirmed(1) and not replica.confirmed(redis.ResponseError("x"))
    aof = Durability.of("aof", 1, 1.5)
    assert aof is not None and aof.command == ("WAITAOF", 1, 0, 1500)
    assert aof.confirmed([1, 0]) and not aof.confirmed([0, 0])
    for level, replicas, timeout in (("quorum", 1, 1.0), ("replica", 0, 1.0), ("replica", 1, 0.0)):
        with pytest.raises(ConfigurationError):
            Durability.of(level, replicas, timeout)
    with pytest.raises(ConfigurationError, match="durability must be one of"):
        Settings(durability="everywhere")
    settings = Settings.from_env({"TXMQ_DURABILITY": "replica", "TXMQ_DURABILITY_REPLICAS": "2"})
    assert settings.durability_level() == Durability("replica", 2, 1.0)


def test_aof_is_gated_on_the_protocol_version_and_the_append_only_file() -> None:
    aof = Durability("aof", 0, 1.0)
    assert "Redis >= 7.2" in (aof.server_problem({"redis_version": "7.0.15", "aof_enabled": 1}) or "")
    assert "appendonly yes" in (aof.server_problem({"redis_version": "7.2.4", "aof_enabled": 0}) or "")
    assert aof.server_problem({"redis_version": "7.2.4", "server_name": "valkey", "aof_enabled": 1}) is None
    assert Durability("replica", 1, 1.0).server_problem({"redis_version": "6.0.0"}) is None


class Orders(TransactionListener):
    """Records the local transactions that ran (each commits); the check-back answers from that record."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        self.ran.append(message.transaction_id or "")
        return COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return COMMIT if message.transaction_id in self.ran else ROLLBACK


def topic_entries(url: str) -> list[str]:
    with redis.Redis.from_url(url) as client:
        return [fields[b"transaction_id"].decode() for _id, fields in client.xrange("orders")]


@pytest.mark.real
def test_at_level_replica_a_prepare_no_replica_confirmed_does_not_run_the_local_transaction(
    replicated: tuple[str, int],
) -> None:
    url, replica = replicated
    settings = replace(FAST, redis_url=url, durability="replica", durability_timeout=0.2)
    orders = Orders()
    ran = orders.ran
    with TransactionProducer("durable", orders, settings=settings) as producer:
        confirmed = producer.send_message_in_transaction(Message("orders", b"confirmed"))
        assert confirmed.end_error is None and ran == [confirmed.transaction_id]
        with Stopped(replica), pytest.raises(PrepareError, match=r"0 of 1 replica\(s\)") as refused:
            producer.send_message_in_transaction(Message("orders", b"not replicated"))
        assert "the local transaction was not run" in str(refused.value)
        assert ran == [confirmed.transaction_id]
        stop = threading.Event()
        with redis.Redis.from_url(url) as client:
            worker = threading.Thread(target=Checker(client, settings, scan_interval=0.05).run, args=(stop,))
            worker.start()
            try:
                wait_until(lambda: client.hlen(TopicKeys("orders").inflight) == 0, timeout=15)
            finally:
                stop.set()
                worker.join(10)
    assert topic_entries(url) == [confirmed.transaction_id]


@pytest.mark.real
def test_at_level_replica_an_end_no_replica_confirmed_is_the_sends_end_error(replicated: tuple[str, int]) -> None:
    url, replica = replicated
    settings = replace(FAST, redis_url=url, durability="replica", durability_timeout=0.2)
    with TransactionProducer("durable", checker=lambda m: COMMIT, settings=settings) as producer:
        with producer.transaction(Message("orders", b"committed, not replicated")) as tx:
            os.kill(replica, signal.SIGSTOP)
        os.kill(replica, signal.SIGCONT)
        assert tx.result is not None
        end_error = tx.result.end_error or ""
        assert "COMMIT is applied on the master but not confirmed as durable (replica)" in end_error
        assert tx.transaction_id in end_error
        report = CliRunner().invoke(main, ["status", "--json", "--redis-url", url])
        groups = {g["producer_group"]: g for g in json.loads(report.output)["producer_groups"]}
        assert groups["durable"]["durability"] == {"replica": 1}
        (server,) = json.loads(report.output)["servers"]
        assert "replica" in server["durability_levels"]
    assert topic_entries(url) == [tx.transaction_id]  # applied on the master: visible, exactly once


@pytest.mark.real
def test_the_asyncio_producer_waits_for_its_replicas_too(replicated: tuple[str, int]) -> None:
    url, replica = replicated
    settings = replace(FAST, redis_url=url, durability="replica", durability_timeout=0.2)

    async def sends() -> tuple[str, str]:
        async with AsyncTransactionProducer("durable", checker=lambda m: COMMIT, settings=settings) as producer:
            async with producer.transaction(Message("orders", b"confirmed")) as confirmed:
                pass
            assert confirmed.result is not None and confirmed.result.end_error is None
            with Stopped(replica), pytest.raises(PrepareError, match="replica"):
                async with producer.transaction(Message("orders", b"refused")):
                    raise AssertionError("the local transaction ran without a confirmed prepare")
            async with producer.transaction(Message("orders", b"end not confirmed")) as unconfirmed:
                os.kill(replica, signal.SIGSTOP)
            os.kill(replica, signal.SIGCONT)
            assert unconfirmed.result is not None and "not confirmed as durable" in (unconfirmed.result.end_error or "")
            return confirmed.transaction_id, unconfirmed.transaction_id

    first, second = asyncio.run(sends())
    assert topic_entries(url) == [first, second]


@pytest.mark.real
def test_level_aof_where_the_server_has_waitaof_else_a_clear_error_at_start() -> None:
    with EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", "everysec"]) as server:
        with redis.Redis.from_url(server.url) as client:
            version = client.info("server")["redis_version"]
        settings = replace(FAST, redis_url=server.url, durability="aof")
        has_waitaof = tuple(int(p) for p in version.split(".")[:2]) >= (7, 2)
        producer = TransactionProducer("durable", checker=lambda m: COMMIT, settings=settings)
        if not has_waitaof:
            with pytest.raises(ConfigurationError, match=r"WAITAOF \(Redis >= 7.2 or Valkey\)"):
                producer.start()
            producer.shutdown()
            return
        with producer, producer.transaction(Message("orders", b"fsynced")) as tx:
            pass
        assert tx.result is not None and tx.result.end_error is None
        assert topic_entries(server.url) == [tx.transaction_id]
    with EmbeddedRedis() as no_aof:  # appendonly no
        settings = replace(settings, redis_url=no_aof.url)
        producer = TransactionProducer("durable", checker=lambda m: COMMIT, settings=settings)
        with pytest.raises(ConfigurationError, match="appendonly yes"):
            producer.start()
        producer.shutdown()


@pytest.mark.real
def test_an_instance_gone_for_good_leaves_no_durability_level_behind(real_client: redis.Redis) -> None:
    from redis_txmq.core.heartbeat import Heartbeat
    from redis_txmq.core.keys import GroupKeys

    keys = GroupKeys("durable")
    gone = Heartbeat(real_client, keys.producers, keys.durability_levels, "gone", 0.1, "replica")
    live = Heartbeat(real_client, keys.producers, keys.durability_levels, "live", 0.1, "master")
    preload(gone.script)
    gone.beat()
    assert real_client.hgetall(keys.durability_levels) == {b"gone": b"replica"}
    real_client.zadd(keys.producers, {"gone": 0})  # its last beat long ago: more than 10 live periods
    live.beat()
    assert real_client.hgetall(keys.durability_levels) == {b"live": b"master"}
    live.leave()
    assert real_client.hgetall(keys.durability_levels) == {}


@pytest.mark.real
def test_a_write_job_waits_for_its_replica_and_an_unconfirmed_decision_is_left_to_the_checker(
    replicated: tuple[str, int],
) -> None:
    """Spark's write jobs at level replica: the decision and the publishing are confirmed; a decision the replica
    did not confirm raises, and the job stays listed until the checker settles it by the decision that stands."""
    url, replica = replicated
    settings = Settings(durability="replica", durability_timeout=0.2, transaction_timeout=0)
    with redis.Redis.from_url(url) as client:
        confirmed = WriteJob.new(client, settings)
        confirmed.register()
        stage = confirmed.stage("orders", "p0")
        client.xadd(stage, {STAGE_ROWS_FIELD: msgpack.packb([["transaction_id", "a", "body", "one"]])})
        assert confirmed.commit([stage]).outcome is COMMIT
        confirmed.close()

        unconfirmed = WriteJob.new(client, settings)
        unconfirmed.register()
        stage = unconfirmed.stage("orders", "p0")
        client.xadd(stage, {STAGE_ROWS_FIELD: msgpack.packb([["transaction_id", "b", "body", "two"]])})
        with Stopped(replica), pytest.raises(DurabilityError, match=r"write job .*: decide: .*0 of 1 replica"):
            unconfirmed.commit([stage])
        unconfirmed.close()
        assert client.zscore(JOB_REGISTRY, unconfirmed.keys.decision) is not None, "still listed for the checker"
        assert settle_jobs(client, settings) == 1
        assert [f[b"body"] for _, f in client.xrange("orders")] == [b"one", b"two"]
        assert client.zcard(JOB_REGISTRY) == 0


@pytest.mark.real
def test_the_durability_keyword_of_either_producer_overrides_the_settings(replicated: tuple[str, int]) -> None:
    """``TransactionProducer(..., durability=...)`` as ``oneway_end``: at ``replica`` a prepare no replica confirmed
    is refused although the settings say ``master``, and ``master`` no longer waits for a replica the settings ask."""
    url, replica = replicated
    settings = replace(FAST, redis_url=url, durability_timeout=0.2)
    asking = replace(settings, durability="replica")
    with TransactionProducer("durable", checker=lambda m: COMMIT, settings=settings, durability="replica") as strict:
        assert strict.settings.durability == "replica"
        with Stopped(replica), pytest.raises(PrepareError, match=r"0 of 1 replica\(s\)"):
            with strict.transaction(Message("orders", b"not replicated")):
                raise AssertionError("the local transaction ran without a confirmed prepare")
    with TransactionProducer("durable", checker=lambda m: COMMIT, settings=asking, durability="master") as lax:
        with Stopped(replica), lax.transaction(Message("orders", b"master only")) as unwaited:
            pass
        assert unwaited.result is not None and unwaited.result.end_error is None

    async def asyncio_sends() -> str:
        async with AsyncTransactionProducer(
            "durable", checker=lambda m: COMMIT, settings=settings, durability="replica"
        ) as producer:
            assert producer.settings.durability == "replica"
            with Stopped(replica), pytest.raises(PrepareError, match=r"0 of 1 replica\(s\)"):
                async with producer.transaction(Message("orders", b"not replicated either")):
                    raise AssertionError("the local transaction ran without a confirmed prepare")
        async with AsyncTransactionProducer(
            "durable", checker=lambda m: COMMIT, settings=asking, durability="master"
        ) as producer:
            with Stopped(replica):
                async with producer.transaction(Message("orders", b"master only, asyncio")) as tx:
                    pass
            assert tx.result is not None and tx.result.end_error is None
            return tx.transaction_id

    asyncio_id = asyncio.run(asyncio_sends())
    assert topic_entries(url) == [unwaited.transaction_id, asyncio_id]


@pytest.mark.parametrize("producer_class", [TransactionProducer, AsyncTransactionProducer], ids=["sync", "asyncio"])
def test_an_unknown_durability_keyword_is_refused_naming_the_levels(producer_class: type) -> None:
    with pytest.raises(ConfigurationError, match="durability must be one of master, replica, aof, got 'quorum'"):
        producer_class("durable", checker=lambda m: COMMIT, redis_url="redis://127.0.0.1:1/0", durability="quorum")
    with pytest.raises(ConfigurationError, match="durability_timeout must be > 0"):
        producer_class(
            "durable",
            checker=lambda m: COMMIT,
            settings=Settings(redis_url="redis://127.0.0.1:1/0", durability_timeout=0),
            durability="aof",
        )


def test_a_decision_no_replica_confirmed_still_ends_the_messages_of_its_transaction(
    replicated: tuple[str, int],
) -> None:
    """The decision of a transaction of several messages is on the master but not confirmed: the producer ends the
    messages with the decision the master holds (the shortfalls logged) instead of leaving them all to the
    check-back."""
    url, replica = replicated
    settings = replace(FAST, redis_url=url, durability="replica", durability_timeout=0.2)
    with TransactionProducer("durable", checker=lambda m: COMMIT, settings=settings) as producer:
        with producer.transaction() as tx:
            tx.send(Message("orders", b"first"))
            tx.send(Message("orders", b"second"))
            os.kill(replica, signal.SIGSTOP)
        os.kill(replica, signal.SIGCONT)
        assert [r.local_transaction_state for r in tx.results] == [COMMIT, COMMIT]
        assert all(r.committed_id for r in tx.results)
        assert sorted(topic_entries(url)) == [f"{tx.transaction_id}.0", f"{tx.transaction_id}.1"], (
            "ended by the producer, not left in flight for the checker"
        )
