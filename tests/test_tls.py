"""Every part on a TLS-only Redis with mutual TLS: producers (sync, asyncio), the checker, a consumer, the CLI and
Spark, each given only a ``rediss://`` URL that names the CA and the client certificate."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace

import pytest
import redis
from click.testing import CliRunner

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.cli import main
from redis_txmq.core.keys import TopicKeys
from redis_txmq.transport.connection import connect

from .helpers import wait_until
from .tls_fixture import TlsRedis

pytestmark = pytest.mark.real

FAST = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.3, claim_idle=1.0)
COMMIT, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.UNKNOWN


class Decide(TransactionListener):
    """The local transaction ends as the send's argument says; the check-back commits."""

    def execute_local_transaction(self, message: Message, arg: LocalTransactionState) -> LocalTransactionState:
        return arg

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return COMMIT


def test_every_part_works_over_mutual_tls(tls_redis: TlsRedis, spark) -> None:
    url = tls_redis.url
    with connect(url) as admin:
        admin.flushall()
    settings = replace(FAST, redis_url=url)
    stop = threading.Event()
    checker_client = connect(url)
    checking = threading.Thread(target=Checker(checker_client, settings, scan_interval=0.05).run, args=(stop,))
    checking.start()
    try:
        with TransactionProducer("tls-orders", Decide(), settings=settings) as producer:
            committed = producer.send_message_in_transaction(Message("orders", b"sync"), COMMIT)
            unknown = producer.send_message_in_transaction(Message("orders", b"left to the check-back"), UNKNOWN)

            async def send_async() -> str:
                async with AsyncTransactionProducer("tls-orders", checker=lambda m: COMMIT, settings=settings) as ap:
                    async with ap.transaction(Message("orders", b"asyncio")) as tx:
                        pass
                return tx.transaction_id

            async_id = asyncio.run(send_async())
            with connect(url) as client:
                wait_until(lambda: client.hlen(TopicKeys("orders").inflight) == 0, timeout=15)
    finally:
        stop.set()
        checking.join(10)
        checker_client.close()
    expected = {committed.transaction_id, unknown.transaction_id, async_id}
    with Consumer("orders", "billing", redis_url=url, block=0.1) as consumer:
        assert {m.transaction_id for m in consumer.poll()} == expected
    report = CliRunner().invoke(main, ["status", "--json", "--redis-url", url])
    assert report.exit_code == 0, report.output
    (topic,) = json.loads(report.output)["topics"]
    assert topic["committed"] == 3 and topic["in_flight"] == 0
    rows = spark.read.format("redis-txmq").option("redis.url", url).option("topics", "orders").load()
    assert {r.transaction_id for r in rows.select("transaction_id").collect()} == expected


def test_without_the_client_certificate_the_server_refuses_and_the_error_says_so(tls_redis: TlsRedis) -> None:
    no_client_cert = f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_redis.ca}"
    out = CliRunner().invoke(main, ["status", "--redis-url", no_client_cert])
    assert out.exit_code == 1
    assert out.output.startswith("error: cannot reach Redis at rediss://127.0.0.1:")
    with pytest.raises(redis.ConnectionError):
        with connect(f"redis://127.0.0.1:{tls_redis.port}/0", socket_timeout=2) as plain:
            plain.ping()
