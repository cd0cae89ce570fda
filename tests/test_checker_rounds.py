"""The checker's one line per round: a round that did something says what (check-backs sent, committed, rolled
back, dead-lettered, its time) in one INFO line of its own logger, an idle round says nothing, and ``txmq checker``
shows that line without any flag."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.checker.worker import ROUND_LOGGER
from redis_txmq.core.keys import TopicKeys
from tests.helpers import ScriptedListener, wait_until

UNKNOWN = LocalTransactionState.UNKNOWN
CHECK_NOW = Settings(transaction_timeout=0, check_interval=0.2, heartbeat_interval=0.2, claim_idle=1)
"""A transaction in flight is due for its check-back at once."""
ROUND = re.compile(
    r"checker \S+ round: (\d+) check-backs sent, (\d+) committed, (\d+) rolled back, (\d+) dead-lettered"
    r"(?:, \d+ answers? changed nothing)?, \d+ ms"
)


WITHOUT_LOG_LEVEL = {name: value for name, value in os.environ.items() if name != "TXMQ_LOG_LEVEL"}
"""The environment of a ``txmq`` started with its default log level."""


def answer_by_body(message: Message) -> LocalTransactionState:
    """The producer's check-back: ``commit`` bodies were saved, the others not."""
    return LocalTransactionState.COMMIT if message.body == b"commit" else LocalTransactionState.ROLLBACK


def round_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == ROUND_LOGGER]


def test_a_round_that_did_something_says_so_in_one_line(real_client: Any, redis_url: str, caplog) -> None:
    """Three transactions left in flight, the producer answering two COMMIT and one ROLLBACK: each round that sent
    checks or applied answers logs exactly one line at INFO, and together they count three check-backs, two commits
    and a rollback."""
    caplog.set_level(logging.INFO, logger=ROUND_LOGGER)
    keys = TopicKeys("round-orders")
    with TransactionProducer(
        "round-service", ScriptedListener(answer_by_body), redis_url=redis_url, settings=CHECK_NOW
    ) as producer:
        for body in (b"commit", b"commit", b"rollback"):
            producer.send_message_in_transaction(Message(keys.topic, body), UNKNOWN)
        checker = Checker(real_client, CHECK_NOW)
        busy_rounds = 0

        def settled() -> bool:
            nonlocal busy_rounds
            stats = checker.run_round()
            busy_rounds += not stats.idle
            return real_client.hlen(keys.inflight) == 0

        wait_until(settled, timeout=30)

    lines = round_lines(caplog)
    records = [record for record in caplog.records if record.name == ROUND_LOGGER]
    assert len(lines) == busy_rounds >= 1, "one line per round that did something, none for the others"
    assert all(record.levelno == logging.INFO for record in records)
    counts = [ROUND.fullmatch(line) for line in lines]
    assert all(counts), lines
    sent, committed, rolled_back, dead = (sum(int(m.group(i)) for m in counts if m) for i in (1, 2, 3, 4))
    assert (committed, rolled_back, dead) == (2, 1, 0), lines
    assert sent >= 3, lines
    assert [fields[b"body"] for _, fields in real_client.xrange(keys.topic_stream)] == [b"commit", b"commit"]


def test_a_stream_of_answers_makes_one_line_per_scan_not_per_answer(real_client: Any, redis_url: str, caplog) -> None:
    """200 transactions in flight answered one by one while the checker runs (its loop wakes for each answer): the
    lines follow its scans, each round's answers counted in its one line, never a line per answer."""
    caplog.set_level(logging.INFO, logger=ROUND_LOGGER)
    keys = TopicKeys("round-stream")
    settings = Settings(transaction_timeout=0, check_interval=2.0, heartbeat_interval=0.2, claim_idle=1)
    with TransactionProducer(
        "round-stream-service", ScriptedListener(answer_by_body), redis_url=redis_url, settings=settings
    ) as producer:
        for _ in range(200):
            producer.send_message_in_transaction(Message(keys.topic, b"commit"), UNKNOWN)
        checker = Checker(real_client, settings, scan_interval=1.0)
        scans = 0
        scan = checker.scan

        def counted_scan() -> Any:
            nonlocal scans
            scans += 1
            return scan()

        checker.scan = counted_scan  # type: ignore[method-assign]
        stop = threading.Event()
        worker = threading.Thread(target=checker.run, args=(stop,), daemon=True)
        worker.start()
        try:
            wait_until(lambda: real_client.hlen(keys.inflight) == 0, timeout=60)
        finally:
            stop.set()
            worker.join(30)
    lines = round_lines(caplog)
    assert 1 <= len(lines) <= scans, (len(lines), scans)
    counts = [ROUND.fullmatch(line) for line in lines]
    assert all(counts), lines
    assert sum(int(m.group(2)) for m in counts if m) == 200, lines


def test_an_idle_round_says_nothing(real_client: Any, caplog) -> None:
    """Nothing in flight, no answer waiting: rounds go by without a line (a checker left running all day stays
    quiet)."""
    caplog.set_level(logging.DEBUG, logger=ROUND_LOGGER)
    checker = Checker(real_client, CHECK_NOW)
    for _ in range(3):
        assert checker.run_round().idle
    assert round_lines(caplog) == []


def test_txmq_checker_shows_the_round_line_without_flags(real_client: Any, redis_url: str, tmp_path: Path) -> None:
    """The operator starts ``txmq checker`` with its defaults (log level WARNING): the round that committed the
    transaction left in flight is there in its output, the per-transaction INFO lines are not."""
    keys = TopicKeys("round-cli")
    with TransactionProducer(
        "round-cli-service", ScriptedListener(LocalTransactionState.COMMIT), redis_url=redis_url, settings=CHECK_NOW
    ) as producer:
        producer.send_message_in_transaction(Message(keys.topic, b"commit"), UNKNOWN)
        txmq = str(Path(sys.executable).with_name("txmq"))
        log = tmp_path / "checker.log"
        args = [txmq, "checker", "--redis-url", redis_url, "--transaction-timeout", "0", "--check-interval", "0.2"]
        with log.open("wb") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=WITHOUT_LOG_LEVEL)
            try:
                wait_until(lambda: " 1 committed" in log.read_text(), timeout=30)
            finally:
                process.send_signal(signal.SIGTERM)
                status = process.wait(15)
    text = log.read_text()
    assert status == 0, text
    (line,) = [line for line in text.splitlines() if " 1 committed" in line]
    assert f"INFO {ROUND_LOGGER}: checker " in line and ROUND.search(line), text
    assert "resolved by check-back" not in text, "the per-transaction lines stay at INFO of their own logger"
    assert real_client.xlen(keys.topic_stream) == 1
