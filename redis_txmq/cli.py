"""``txmq``: the command line, and the composition root (the only module that may import the workers)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from . import __version__
from .config import Settings
from .connection import connect, redact_url
from .errors import TxMQError

console = Console()

redis_url_option = click.option(
    "--redis-url",
    envvar="TXMQ_REDIS_URL",
    default=None,
    show_envvar=True,
    help="Redis URL (redis://, rediss://, unix://); default redis://localhost:6379/0.",
)
cluster_option = click.option(
    "--cluster/--no-cluster",
    envvar="TXMQ_CLUSTER",
    default=None,
    show_envvar=True,
    help="Connect with redis.cluster.RedisCluster.",
)


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings.from_env(**overrides)
    except TxMQError as exc:
        raise click.UsageError(str(exc)) from None


def _client(settings: Settings) -> Any:
    return connect(settings.redis_url, cluster=settings.cluster)


def _fail_cleanly(action: Callable[[], None]) -> None:
    """Run a command body; a TxMQError becomes one red line and exit status 1, not a traceback."""
    try:
        action()
    except TxMQError as exc:
        console.print(f"[red]error[/]: {exc}", soft_wrap=True, highlight=False)
        sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    envvar="TXMQ_LOG_LEVEL",
    default="WARNING",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def main(log_level: str) -> None:
    """redis-txmq: transactional messages on Redis Streams."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
def version() -> None:
    """Print the version."""
    click.echo(f"redis-txmq {__version__}")


def _spark_read(redis_url: str) -> None:
    """Read what the demo committed with the Spark source, when the spark extra and Java are there."""
    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        console.print("(install the spark extra, with Java 17, to see the Spark read of the topic)")
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_connector

    console.print("Spark reads the committed 'orders' stream (format redis-txmq, local[2])...")
    spark = (
        SparkSession.builder.master("local[2]").appName("txmq-demo").config("spark.ui.enabled", "false").getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        spark_connector.register(spark)
        orders = spark.read.format("redis-txmq").option("redis.url", redis_url).option("topics", "orders").load()
        parsed = orders.select(
            "id", "keys", F.get_json_object(F.col("body").cast("string"), "$.amount").alias("amount")
        )
        table = Table(title="spark.read.format('redis-txmq') of 'orders'")
        for column in ("entry id", "keys", "amount"):
            table.add_column(column)
        for row in parsed.orderBy("id").collect():
            table.add_row(row.id, row["keys"], row.amount)
        console.print(table)
    finally:
        spark.stop()


def _run_checker(redis_url: str, settings: Settings, stop: threading.Event) -> None:
    from checker import Checker

    Checker(connect(redis_url), settings, scan_interval=0.1).run(stop)


@main.command()
@click.option(
    "--redis-url",
    envvar="TXMQ_REDIS_URL",
    default=None,
    help="Redis to use; without it the demo starts its own (redis-server, else fakeredis).",
)
@click.option("--spark/--no-spark", default=True, help="End with a Spark read (when the spark extra is installed).")
def demo(redis_url: str | None, spark: bool) -> None:
    """Run the order-service story: commits, rollbacks, a check-back, a consumer reading what was committed."""
    from .demo import run_demo
    from .embedded import EmbeddedRedis

    embedded: EmbeddedRedis | None = None
    if redis_url is None:
        embedded = EmbeddedRedis().start()
        redis_url = embedded.url
        console.print(f"[bold]Embedded Redis[/] ({embedded.kind}) at {redis_url}")
    else:
        console.print(f"[bold]Redis[/] at {redact_url(redis_url)}")
    try:
        outcome = run_demo(redis_url, console, run_checker=_run_checker)
        if outcome.ok and spark:
            _spark_read(redis_url)
    finally:
        if embedded is not None:
            embedded.stop()
    if outcome.ok:
        console.print(
            f"[green]OK[/]: orders {outcome.committed} committed and consumed once each; "
            f"orders {outcome.rolled_back} rolled back and never seen."
        )
        return
    console.print(f"[red]FAILED[/]: committed {outcome.committed}, consumed {outcome.consumed}")
    sys.exit(1)


@main.command()
@redis_url_option
@cluster_option
@click.option(
    "--transaction-timeout",
    type=float,
    envvar="TXMQ_TRANSACTION_TIMEOUT",
    show_envvar=True,
    help="Check immunity in seconds: no check before a half message is this old (default 6).",
)
@click.option(
    "--check-interval",
    type=float,
    envvar="TXMQ_CHECK_INTERVAL",
    show_envvar=True,
    help="Seconds between two checks of one transaction (default 30).",
)
@click.option(
    "--check-max",
    type=int,
    envvar="TXMQ_CHECK_MAX",
    show_envvar=True,
    help="Checks before a transaction is dead-lettered (default 15).",
)
@click.option(
    "--max-age",
    type=float,
    envvar="TXMQ_MAX_AGE",
    show_envvar=True,
    help="Seconds after which a transaction is dead-lettered (default 259200 = 72 h).",
)
@click.option(
    "--claim-idle",
    type=float,
    envvar="TXMQ_CLAIM_IDLE",
    show_envvar=True,
    help="Seconds after which answers read by a dead checker are taken over (default 30).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    envvar="TXMQ_CHECKER_BATCH_SIZE",
    show_envvar=True,
    help="Transactions claimed per script call.",
)
@click.option(
    "--metrics-port",
    type=int,
    envvar="TXMQ_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port.",
)
def checker(
    redis_url: str | None,
    cluster: bool | None,
    transaction_timeout: float | None,
    check_interval: float | None,
    check_max: int | None,
    max_age: float | None,
    claim_idle: float | None,
    batch_size: int,
    metrics_port: int | None,
) -> None:
    """Run the check-back worker until SIGTERM or SIGINT; run several for availability."""
    from checker import Checker

    settings = _settings(
        redis_url=redis_url,
        cluster=cluster,
        transaction_timeout=transaction_timeout,
        check_interval=check_interval,
        check_max=check_max,
        max_age=max_age,
        claim_idle=claim_idle,
    )
    worker = Checker(_client(settings), settings, batch_size=batch_size)
    if metrics_port is not None:
        worker.metrics.serve(metrics_port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    console.print(
        f"checker {worker.instance_id} on {redact_url(settings.redis_url)}: "
        f"transaction_timeout={settings.transaction_timeout}s check_interval={settings.check_interval}s "
        f"check_max={settings.check_max} max_age={settings.max_age}s",
        highlight=False,
    )
    _fail_cleanly(lambda: worker.run(stop))


@main.command()
@redis_url_option
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(redis_url: str | None, cluster: bool | None, as_json: bool) -> None:
    """Topics, producer groups and checkers at a glance."""
    from .admin import status as read_status

    settings = _settings(redis_url=redis_url, cluster=cluster)
    report = read_status(_client(settings), live_seconds=settings.heartbeat_interval * 3)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    topics = Table(title="topics")
    for column in ("topic", "committed", "in flight", "oldest in flight (s)", "dead letters"):
        topics.add_column(column)
    for t in report["topics"]:
        age = t["oldest_in_flight_age_seconds"]
        topics.add_row(
            t["stream"],
            str(t["committed"]),
            str(t["in_flight"]),
            "-" if age is None else f"{age:.1f}",
            str(t["dead_letters"]),
        )
    groups = Table(title="producer groups")
    for column in ("producer group", "live instances", "pending check requests"):
        groups.add_column(column)
    for g in report["producer_groups"]:
        groups.add_row(g["producer_group"], str(g["live_instances"]), str(g["pending_check_requests"]))
    console.print(topics, groups)
    console.print(f"live checkers: {report['checkers']['live_instances']}")


@main.group()
def dead() -> None:
    """List and resolve dead-lettered transactions."""


@dead.command("list")
@redis_url_option
@cluster_option
@click.option("--topic", help="Only this topic.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def dead_list(redis_url: str | None, cluster: bool | None, topic: str | None, as_json: bool) -> None:
    """Dead-lettered transactions, oldest first."""
    from .admin import dead_letters

    settings = _settings(redis_url=redis_url, cluster=cluster)
    rows = dead_letters(_client(settings), topic)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="dead-lettered transactions")
    for column in ("transaction id", "topic", "producer group", "checks", "reason", "remark"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["transaction_id"] or "-",
            row["stream"],
            row["producer_group"] or "-",
            str(row["check_times"]),
            row["reason"] or "-",
            row["remark"] or "",
        )
    console.print(table)


def _dead_action(name: str, help_text: str) -> None:
    from .broker import DeadAction

    action = DeadAction(name.upper())

    @dead.command(name, help=help_text)
    @click.argument("transaction_id")
    @redis_url_option
    @cluster_option
    @click.option("--topic", help="The topic, when the id could be in several.")
    def command(transaction_id: str, redis_url: str | None, cluster: bool | None, topic: str | None) -> None:
        from .admin import resolve_dead
        from .broker import RedisBroker

        settings = _settings(redis_url=redis_url, cluster=cluster)

        def resolve() -> None:
            keys, result = resolve_dead(RedisBroker(_client(settings), settings), transaction_id, action, topic)
            repeat = "" if result.applied else " (already done: nothing changed)"
            committed = f", topic entry {result.committed_id}" if result.committed_id else ""
            console.print(
                f"transaction {transaction_id} on {keys.topic_stream}: {result.state}{committed}{repeat}",
                highlight=False,
            )

        _fail_cleanly(resolve)


_dead_action("commit", "Commit a dead-lettered transaction: its message is appended to the topic once.")
_dead_action("rollback", "Roll back a dead-lettered transaction: its message is dropped, with an op record.")
_dead_action("recheck", "Put a dead-lettered transaction back in flight, check count reset, checked right away.")


@main.group()
def topic() -> None:
    """Topics and their partitions."""


@topic.command("create")
@click.argument("name")
@click.option(
    "--partitions",
    type=click.IntRange(1, 1024),
    default=1,
    show_default=True,
    help="Partitions: streams in their own hash slots; one key keeps its order within one.",
)
@redis_url_option
@cluster_option
def topic_create(name: str, partitions: int, redis_url: str | None, cluster: bool | None) -> None:
    """Create a topic with N partitions, before anything is sent to it (idempotent for the same N)."""
    from .topics import create_topic

    settings = _settings(redis_url=redis_url, cluster=cluster)

    def create() -> None:
        count = create_topic(_client(settings), name, partitions)
        console.print(f"topic {name}: {count} partition{'s' if count > 1 else ''}", highlight=False)

    _fail_cleanly(create)


def _counts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected comma-separated numbers >= 1, got {text!r}")
    return values


@main.command()
@click.option(
    "--redis-url",
    default=None,
    help="Measure this Redis (only bench-* topics are written and deleted); "
    "default: a redis-server of its own on a free port.",
)
@click.option("--quick", is_flag=True, help="A smoke run: a few hundred transactions per part.")
@click.option("--rounds", type=click.IntRange(2), help="Interleaved send rounds (default 60).")
@click.option("--per-round", type=click.IntRange(1), help="Sends of each kind per round (default 200).")
@click.option("--processes", help="Producer process counts, comma-separated (default 1,2,4).")
@click.option("--seconds", type=click.FloatRange(0.1), help="Length of one multi-process load (default 2).")
@click.option("--repeats", type=click.IntRange(1), help="Interleaved repeats of the multi-process loads (default 3).")
@click.option("--in-flight", help="Check-back runs: transactions in flight, comma-separated (default 1000,100000).")
@click.option("--memory-transactions", type=click.IntRange(1), help="Transactions of the memory probe (10000).")
@click.option(
    "--memory-wait/--no-memory-wait",
    default=None,
    help="Wait out the 60 s dedupe window to measure finished transactions after it (default: yes).",
)
@click.option("--cluster", is_flag=True, help="Also run the multi-process loads on a 3-master cluster of its own.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), help="Write the results here.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a PNG chart of throughput per producer processes (needs the bench extra: matplotlib).",
)
def bench(
    redis_url: str | None,
    quick: bool,
    rounds: int | None,
    per_round: int | None,
    processes: str | None,
    seconds: float | None,
    repeats: int | None,
    in_flight: str | None,
    memory_transactions: int | None,
    memory_wait: bool | None,
    cluster: bool,
    json_path: str | None,
    plot_path: str | None,
) -> None:
    """Measure send rates against plain XADD, producer processes, the checker at scale and memory per transaction."""
    from pathlib import Path

    from bench.report import print_table, write_json, write_plot
    from bench.run import BenchOptions, run_bench

    overrides: dict[str, Any] = {
        "redis_url": redis_url,
        "rounds": rounds,
        "per_round": per_round,
        "processes": _counts(processes) if processes else None,
        "seconds": seconds,
        "repeats": repeats,
        "in_flight": _counts(in_flight) if in_flight else None,
        "memory_transactions": memory_transactions,
        "memory_wait": memory_wait,
        "cluster": cluster,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    options = BenchOptions.quick(**given) if quick else BenchOptions(**given)
    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install 'redis-txmq[bench]'") from None

    # SIGTERM unwinds like Ctrl-C: the servers and worker processes the run started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    def run() -> None:
        results = run_bench(options)
        print_table(results, console)
        if json_path:
            write_json(results, Path(json_path))
            console.print(f"results written to {json_path}", highlight=False)
        if plot_path:
            write_plot(results, Path(plot_path))
            console.print(f"chart written to {plot_path}", highlight=False)

    _fail_cleanly(run)
