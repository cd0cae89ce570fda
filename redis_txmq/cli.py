"""``txmq``: the command line, and the composition root (the only module that may import the workers).

Every failure of a command is one line ``error: <what happened>; <what to do>`` on stderr and a non-zero exit
status (2 for a usage error, 1 otherwise), never a traceback; passwords in Redis URLs are never shown.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

import click
import redis
from click.core import ParameterSource
from redis.exceptions import RedisClusterException
from rich.console import Console, ConsoleDimensions
from rich.table import Table

from . import __version__
from .core.clients import REDIS_ERRORS, instance_id, redact_url, scrub, url_secrets
from .core.config import Settings
from .core.durability import LEVELS
from .core.durability import describe as describe_durability
from .core.errors import ConfigurationError, TxMQConnectionError, TxMQError
from .core.groups import Backoff
from .ops.acl import ROLES as ACL_ROLES
from .transport.connection import connect

UNCUT_WIDTH = 10_000
"""The width of the output when it is no terminal: more than any table of the commands takes, so none is cut."""


class FittedConsole(Console):
    """Rich's console, as wide as the terminal when stdout is one (``COLUMNS``, else the terminal's own width, read at
    each print); anywhere else (a pipe, a file, a CI log) as wide as what it prints, where rich would take 80 columns
    and cut the tables' ids short."""

    @property
    def size(self) -> ConsoleDimensions:
        if self.is_terminal:
            return Console(file=self.file).size
        return ConsoleDimensions(UNCUT_WIDTH, super().size.height)


console = FittedConsole()

URL_HINT = "give --redis-url (or TXMQ_REDIS_URL) as redis://[[user]:password@]host:port/db, rediss://... or unix://path"
SOURCE_CHECKOUT_HINT = (
    "txmq bench runs from a source checkout: clone the redis-txmq repository, then run "
    "`pip install -e '.[bench]'` in it"
)
_URL_META = "txmq.redis_url"

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


class CommandError(click.ClickException):
    """A command failed: shown as one line ``error: ...`` on stderr."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)


class CommandUsageError(CommandError):
    """The command line itself is wrong (an unknown option, a bad value): exit status 2, as click's own."""

    exit_code = 2


class TxMQGroup(click.Group):
    """The ``txmq`` group: turns every failure of a command into a ``CommandError``, in one place."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _usage_error(exc, info_name or self.name or "txmq") from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CommandError:
            raise
        except click.UsageError as exc:
            raise _usage_error(exc, ctx.command_path) from None
        except click.ClickException as exc:
            raise CommandError(_one_line(exc.format_message(), None)) from None
        except (TxMQError, redis.RedisError, RedisClusterException, OSError) as exc:
            url = ctx.meta.get(_URL_META)
            raise CommandError(_one_line(_describe(exc, url), url)) from None


def _usage_error(exc: click.UsageError, command_path: str) -> click.ClickException:
    if type(exc).__name__ == "NoArgsIsHelpError":
        return exc  # a bare group prints its help
    path = exc.ctx.command_path if exc.ctx is not None else command_path
    return CommandUsageError(f"{exc.format_message().rstrip('.')}; see '{path} -h'")


def _describe(exc: BaseException, redis_url: str | None) -> str:
    """What happened and what to do, for the exceptions a command can meet."""
    where = f"Redis at {redact_url(redis_url)}" if redis_url else "Redis"
    if isinstance(exc, TxMQConnectionError) and isinstance(exc.__cause__, (redis.RedisError, RedisClusterException)):
        exc = exc.__cause__
    if isinstance(exc, redis.AuthenticationError):
        return (
            f"{where} refused the credentials ({exc}); put the right user and password in the URL "
            "(redis://user:password@host:port/db)"
        )
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach {where} ({exc}); start Redis there, or point --redis-url (or TXMQ_REDIS_URL) at one"
    if isinstance(exc, RedisClusterException):
        return (
            f"cannot use {where} as a Redis Cluster ({exc}); point --redis-url at a node of a running cluster, "
            "or leave out --cluster (TXMQ_CLUSTER) for a standalone Redis"
        )
    if isinstance(exc, redis.ResponseError):
        return f"{where} refused a command ({exc}); txmq needs Redis >= 7.0 or Valkey, and --cluster for a cluster"
    if isinstance(exc, redis.RedisError):
        return f"{where} failed ({exc}); check that it is up and reachable, then try again"
    if isinstance(exc, TxMQConnectionError):
        return f"{exc}; check that {where} is up and reachable, then try again"
    return str(exc)


def _one_line(text: str, redis_url: str | None) -> str:
    """``text`` on one line, without the password of ``redis_url``."""
    return scrub(text, url_secrets(redis_url))


def _remember_url(redis_url: str) -> None:
    """Let the error handler name (and redact) the Redis a failure is about."""
    context = click.get_current_context(silent=True)
    if context is not None:
        context.meta[_URL_META] = redis_url


def _settings(**overrides: Any) -> Settings:
    settings = Settings.from_env(**overrides)
    _remember_url(settings.redis_url)
    return settings


def _client(settings: Settings) -> Any:
    return _connect(settings.redis_url, cluster=settings.cluster)


def _connect(redis_url: str, *, cluster: bool = False) -> Any:
    _remember_url(redis_url)
    try:
        return connect(redis_url, cluster=cluster)
    except ConfigurationError as exc:
        raise CommandError(_one_line(f"{exc}; {URL_HINT}", redis_url)) from None
    except ValueError as exc:
        message = f"invalid Redis URL {redact_url(redis_url)!r}: {exc}; {URL_HINT}"
        raise CommandError(_one_line(message, redis_url)) from None


@click.group(cls=TxMQGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="redis-txmq", message="%(prog)s %(version)s")
@click.option(
    "--log-level",
    envvar="TXMQ_LOG_LEVEL",
    default="WARNING",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    show_envvar=True,
    help="Log records of this level and above go to stderr.",
)
def main(log_level: str) -> None:
    """redis-txmq: transactional messages on Redis Streams."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
def version() -> None:
    """Print the version."""
    click.echo(f"redis-txmq {__version__}")


def _spark_read(redis_url: str, transaction_ids: list[str]) -> None:
    """Read what this demo run committed with the Spark source, when the spark extra and Java are there."""
    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        console.print("(install the spark extra, with Java 17, to see the Spark read of the topic)")
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import redis_txmq.spark

    from .ops.demo import TOPIC

    console.print(f"Spark reads the committed '{TOPIC}' stream (format redis-txmq, local[2]), this run's orders...")
    already_running = SparkSession.getActiveSession() is not None  # the caller's session: not ours to stop
    # the JVM's own start-up lines (its module warnings, Spark's log level notice) go to a log file, not between the
    # tables: it inherits the standard error it is started with; and no progress bar
    log = Path(tempfile.mkdtemp(prefix="txmq-demo-")) / "spark.log"
    saved = os.dup(2)
    try:
        with log.open("wb") as sink:
            os.dup2(sink.fileno(), 2)
            spark = (
                SparkSession.builder.master("local[2]")
                .appName("txmq-demo")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .getOrCreate()
            )
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    try:
        spark.sparkContext.setLogLevel("ERROR")
        redis_txmq.spark.register(spark)
        orders = spark.read.format("redis-txmq").option("redis.url", redis_url).option("topics", TOPIC).load()
        parsed = orders.where(F.col("transaction_id").isin(transaction_ids)).select(
            "id", "keys", F.get_json_object(F.col("body").cast("string"), "$.amount").alias("amount")
        )
        table = Table(title=f"spark.read.format('redis-txmq') of '{TOPIC}'")
        for column in ("entry id", "keys", "amount"):
            table.add_column(column)
        for row in parsed.orderBy("id").collect():
            table.add_row(row.id, row["keys"], row.amount)
        console.print(table)
    finally:
        if not already_running:
            spark.stop()


def _run_checker(redis_url: str, settings: Settings, topic: str, stop: threading.Event) -> None:
    """A checker of ``topic`` only: the demo must not check (or time) other services' transactions."""
    from redis_txmq.checker import Checker

    client = connect(redis_url)
    try:
        Checker(client, settings, scan_interval=0.1, only_topics={topic}).run(stop)
    finally:
        client.close()


@main.command()
@click.option(
    "--redis-url",
    envvar="TXMQ_REDIS_URL",
    default=None,
    help="Redis to use; without it the demo starts its own (redis-server, else fakeredis).",
)
@click.option("--spark/--no-spark", default=True, help="End with a Spark read (when the spark extra is installed).")
def demo(redis_url: str | None, spark: bool) -> None:
    """Run the order-service story: commits, rollbacks, a check-back, a consumer reading what was committed.

    On a given Redis it writes to the topic 'orders': each run has its own producer and consumer groups (removed at
    the end), answers checks for its own transactions only and leaves none of them in flight."""
    from .ops.demo import run_demo
    from .transport.embedded import EmbeddedRedis

    embedded: EmbeddedRedis | None = None
    if redis_url is None:
        embedded = EmbeddedRedis().start()
        redis_url = embedded.url
        console.print(f"[bold]Embedded Redis[/] ({embedded.kind}) at {redis_url}")
    else:
        _connect(redis_url).close()
        console.print(f"[bold]Redis[/] at {redact_url(redis_url)}")
    try:
        outcome = run_demo(redis_url, console, run_checker=_run_checker)
        if outcome.ok and spark:
            _spark_read(redis_url, outcome.committed_transaction_ids)
    finally:
        if embedded is not None:
            embedded.stop()
    if not outcome.ok:
        raise CommandError(
            f"the demo failed: orders {outcome.committed} committed, {outcome.consumed} consumed; "
            "run it again with --log-level INFO to see what the producer and the checker did"
        )
    console.print(
        f"[green]OK[/]: orders {outcome.committed} committed and consumed once each; "
        f"orders {outcome.rolled_back} rolled back and never seen."
    )


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
    help="Checks that reached a producer before a transaction is dead-lettered (default 15).",
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
    "--durability",
    type=click.Choice(LEVELS),
    envvar="TXMQ_DURABILITY",
    show_envvar=True,
    help="What an end must reach before it counts as done: the master (default), replicas (WAIT), the AOF (WAITAOF).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    envvar="TXMQ_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics (/metrics) and the probes /healthz (the loop goes round) and /readyz (Redis "
    "reached, scripts loaded, heartbeat fresh, no topic failing) on this port: 200, or 503 with what failed, as JSON.",
)
@click.option(
    "--stall-after",
    type=click.FloatRange(min=1.0),
    default=60.0,
    show_default=True,
    envvar="TXMQ_CHECKER_STALL_AFTER",
    show_envvar=True,
    help="Seconds without a round of the checker's loop after which /healthz answers 503.",
)
@click.option(
    "--ready-topic-failures",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    envvar="TXMQ_CHECKER_READY_TOPIC_FAILURES",
    show_envvar=True,
    help="Failed scans in a row of one topic stream after which /readyz answers 503.",
)
@click.option(
    "--full-pass-interval",
    type=click.FloatRange(min=1.0),
    default=60.0,
    show_default=True,
    envvar="TXMQ_CHECKER_FULL_PASS_INTERVAL",
    show_envvar=True,
    help="Seconds between two passes over every registered topic (cheap reads in pipelines) that find what the "
    "schedule of due topics missed: on Redis Cluster, a transaction whose producer died between its prepare and "
    "waking its topic waits this long for its check-back at most.",
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
    durability: str | None,
    metrics_port: int | None,
    stall_after: float,
    ready_topic_failures: int,
    full_pass_interval: float,
) -> None:
    """Run the check-back worker until SIGTERM or SIGINT; run several for availability.

    With --metrics-port: /metrics, /healthz for a liveness probe, /readyz for a readiness probe."""
    from redis_txmq.checker import Checker, CheckerMetrics
    from redis_txmq.checker.worker import ROUND_LOGGER

    if click.get_current_context().find_root().get_parameter_source("log_level") is ParameterSource.DEFAULT:
        # without --log-level, one line per round that did something (INFO); an idle round says nothing
        logging.getLogger(ROUND_LOGGER).setLevel(logging.INFO)

    settings = _settings(
        redis_url=redis_url,
        cluster=cluster,
        transaction_timeout=transaction_timeout,
        check_interval=check_interval,
        check_max=check_max,
        max_age=max_age,
        claim_idle=claim_idle,
        durability=durability,
    )
    metrics = CheckerMetrics(stall_after=stall_after, topic_failures=ready_topic_failures)
    if metrics_port is not None:
        try:
            metrics.serve(metrics_port)
        except OSError as exc:
            raise CommandError(
                f"cannot serve metrics on port {metrics_port} ({exc.strerror or exc}): another process (another "
                "checker?) listens there; give this checker another --metrics-port (or TXMQ_METRICS_PORT)"
            ) from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    instance = instance_id("checker")
    console.print(
        f"checker {instance} on {redact_url(settings.redis_url)}: "
        f"transaction_timeout={settings.transaction_timeout}s check_interval={settings.check_interval}s "
        f"check_max={settings.check_max} max_age={settings.max_age}s "
        f"durability={describe_durability(settings.durability_level())}",
        highlight=False,
    )
    client = _client_once_reachable(settings, stop, metrics)
    if client is not None:
        Checker(
            client,
            settings,
            instance_id=instance,
            batch_size=batch_size,
            full_pass_interval=full_pass_interval,
            metrics=metrics,
        ).run(stop)


def _client_once_reachable(settings: Settings, stop: threading.Event, metrics: Any = None) -> Any:
    """The client, retried with backoff while it cannot be made (a cluster client asks the cluster for its slots
    when it is made); None if stopped first. A standalone client connects on first use: the checker retries then."""
    backoff = Backoff(first=0.5, cap=30.0)
    while True:
        try:
            return _client(settings)
        except REDIS_ERRORS as exc:
            delay = backoff.next()
            logging.getLogger("redis_txmq.checker").warning(
                "cannot reach Redis at %s (%s); retrying in %.1f s", redact_url(settings.redis_url), exc, delay
            )
            if metrics is not None:  # a try to start: the probes see the loop going round, and why it fails
                metrics.step_failed("start", exc)
                metrics.round_done()
            if stop.wait(delay):
                return None


@main.command()
@redis_url_option
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(redis_url: str | None, cluster: bool | None, as_json: bool) -> None:
    """Topics, producer groups and checkers at a glance."""
    from .ops.admin import status as read_status

    settings = _settings(redis_url=redis_url, cluster=cluster)
    report = read_status(_client(settings), live_seconds=settings.heartbeat_interval * 3)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    servers = Table(title="servers")
    for column in ("address", "server", "version", "role", "replicas"):
        servers.add_column(column)
    for server in report["servers"]:
        replicas = ", ".join(server["replicas"]) or "none"
        servers.add_row(server["address"], server["server"], server["version"], server["role"], replicas)
    topics = Table(title="topics")
    topics.add_column("topic", overflow="fold")  # names whole: folded in a narrow terminal, never cut
    for column in ("committed", "in flight", "oldest in flight (s)", "dead letters"):
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
    consumers = _consumer_groups_table(report["consumer_groups"])
    groups = Table(title="producer groups")
    groups.add_column("producer group", overflow="fold")
    for column in ("live instances", "pending check requests", "durability"):
        groups.add_column(column)
    for g in report["producer_groups"]:
        groups.add_row(
            g["producer_group"], str(g["live_instances"]), str(g["pending_check_requests"]), _levels(g["durability"])
        )
    console.print(servers)
    for server in report["servers"]:
        levels = ", ".join(server["durability_levels"]) or "unknown (no INFO)"
        console.print(f"durability levels {server['address']} can give: {levels}", highlight=False)
    console.print(topics, consumers, groups)
    checkers = report["checkers"]
    console.print(f"live checkers: {checkers['live_instances']} (durability: {_levels(checkers['durability'])})")
    jobs = report["write_jobs"]
    if jobs["unsettled"]:
        oldest = jobs["oldest_age_seconds"]
        console.print(
            f"write jobs not settled: {jobs['unsettled']} ({jobs['decided']} decided, publishing)"
            + (f", oldest {oldest:.1f} s" if oldest is not None else ""),
            highlight=False,
        )
    if jobs.get("parked"):
        console.print(
            f"write jobs parked for an operator: {jobs['parked']} (rows that cannot be published; HGET <job> parked)",
            highlight=False,
        )
        for parked in jobs.get("parked_reasons", []):
            console.print(f"  {parked['job']}: {parked['reason']}", highlight=False, markup=False)


def _consumer_groups_table(rows: list[dict[str, Any]]) -> Table:
    """Each consumer group of each topic (all partitions): not yet delivered, pending, the oldest pending's idle
    time, dead letters."""
    table = Table(title="consumer groups")
    for name in ("topic", "consumer group"):
        table.add_column(name, overflow="fold")  # names whole: folded in a narrow terminal, never cut
    for column in ("consumers", "undelivered", "pending", "oldest pending (s)", "dead letters"):
        table.add_column(column)
    for row in rows:
        undelivered, unknown = row["undelivered"], row["undelivered_unknown_partitions"]
        if undelivered is None:
            lag = "unknown"
        elif unknown:
            lag = f">={undelivered} ({unknown} partition{'s' if unknown > 1 else ''} unknown)"
        else:
            lag = str(undelivered)
        idle = row["oldest_pending_idle_seconds"]
        dead = row["dead_letters"]
        table.add_row(
            row["topic"],
            row["group"],
            str(row["consumers"]),
            lag,
            str(row["pending"]),
            "-" if idle is None else f"{idle:.1f}",
            "-" if dead is None else str(dead),
        )
    return table


def _levels(counts: dict[str, int]) -> str:
    """``replica ×2, master ×1``: the durability levels live instances write with."""
    return ", ".join(f"{level} ×{count}" for level, count in counts.items()) or "-"


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
    from .ops.admin import dead_letters

    settings = _settings(redis_url=redis_url, cluster=cluster)
    rows = dead_letters(_client(settings), topic)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        where = f" on topic {topic!r}" if topic else ""
        console.print(f"no dead-lettered transactions{where}", highlight=False)
        return
    table = Table(title="dead-lettered transactions")
    id_width = max(len(row["transaction_id"] or "-") for row in rows)
    # whole ids on one line, to copy into `txmq dead commit|rollback|recheck`; the other columns fold, never cut
    table.add_column("transaction id", no_wrap=True, min_width=id_width, overflow="fold")
    for column in ("topic", "producer group", "checks", "reason", "remark"):
        table.add_column(column, overflow="fold")
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
    from .core.protocol import DeadAction

    action = DeadAction(name.upper())

    @dead.command(name, help=help_text)
    @click.argument("transaction_id")
    @redis_url_option
    @cluster_option
    @click.option("--topic", help="The topic, when the id could be in several.")
    def command(transaction_id: str, redis_url: str | None, cluster: bool | None, topic: str | None) -> None:
        from .ops.admin import resolve_dead_transaction
        from .sync.broker import RedisBroker

        settings = _settings(redis_url=redis_url, cluster=cluster)
        broker = RedisBroker(_client(settings), settings)
        parent, resolved = resolve_dead_transaction(broker, transaction_id, action, topic)
        if parent:
            console.print(
                f"transaction {parent} of several messages: its dead-lettered messages follow {action.value}",
                highlight=False,
                soft_wrap=True,
            )
        for one in resolved:
            result = one.result
            repeat = "" if result.applied else " (already done: nothing changed)"
            committed = f", topic entry {result.committed_id}" if result.committed_id else ""
            console.print(
                f"transaction {one.transaction_id} on {one.keys.topic_stream}: {result.state}{committed}{repeat}",
                highlight=False,
                soft_wrap=True,
            )


_dead_action(
    "commit",
    "Commit a dead-lettered transaction (its id, or a unique prefix of it): its message is appended to the topic once. "
    "A message of a transaction of several commits that transaction (its decision) and all its dead-lettered messages.",
)
_dead_action(
    "rollback",
    "Roll back a dead-lettered transaction (its id, or a unique prefix of it): its message is dropped, with an op "
    "record. A message of a transaction of several rolls back that transaction and all its dead-lettered messages.",
)
_dead_action(
    "recheck",
    "Put a dead-lettered transaction (its id, or a unique prefix of it) back in flight, check count reset, checked "
    "right away; for a message of a transaction of several, all its dead-lettered messages.",
)


CONSOLE_TOKEN_ENV = "TXMQ_CONSOLE_OPERATOR_TOKEN"
CONSOLE_ACTION_URL_ENV = "TXMQ_CONSOLE_OPERATOR_REDIS_URL"


@main.command("console")
@redis_url_option
@cluster_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen on this address (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(1, 65535), default=8640, show_default=True, help="Listen on this port.")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name requests may name the console by, besides --host and localhost (repeat for more): the name "
    "of a proxy in front of it. '*' allows any.",
)
def console_command(
    redis_url: str | None, cluster: bool | None, host: str, port: int, allowed_hosts: tuple[str, ...]
) -> None:
    """Serve the web console: overview, topics, transactions, dead letters, write jobs, audit (and their JSON).

    Read-only unless TXMQ_CONSOLE_OPERATOR_TOKEN is set (an environment variable, never an option: an option's value
    shows in the process list): operators log in with it to commit, roll back or recheck dead letters. Actions run
    on TXMQ_CONSOLE_OPERATOR_REDIS_URL when set (the operator's Redis user), else on --redis-url. It answers
    requests naming it by --host, localhost, 127.0.0.1, ::1 or an --allowed-host only."""
    try:
        import uvicorn

        from .ops.console.app import create_app
    except ImportError as exc:
        raise CommandError(
            f"the console needs the console extra ({exc.name or exc} is missing): pip install 'redis-txmq[console]'"
        ) from None
    settings = _settings(redis_url=redis_url, cluster=cluster)
    token = os.environ.get(CONSOLE_TOKEN_ENV) or None
    action_url = os.environ.get(CONSOLE_ACTION_URL_ENV) or None
    client = _client(settings)
    try:
        action_client = _connect(action_url, cluster=settings.cluster) if action_url else None
    except CommandError as exc:
        raise CommandError(f"{CONSOLE_ACTION_URL_ENV}: {exc.format_message()}") from None
    except REDIS_ERRORS as exc:  # a cluster client asks for the slots when it is made
        raise CommandError(f"{CONSOLE_ACTION_URL_ENV}: {_one_line(_describe(exc, action_url), action_url)}") from None
    _remember_url(settings.redis_url)
    try:
        app = create_app(
            client,
            settings,
            operator_token=token,
            action_client=action_client,
            redis_url=settings.redis_url,
            action_redis_url=action_url,
            allowed_hosts=[f"[{host}]" if ":" in host else host, *allowed_hosts],  # an IPv6 Host is bracketed
        )
    except ConfigurationError as exc:  # an --allowed-host
        raise CommandError(str(exc)) from None
    except TxMQError as exc:
        raise CommandError(f"{exc} ({CONSOLE_TOKEN_ENV})") from None
    mode = "operators may act after logging in" if token else f"read-only (set {CONSOLE_TOKEN_ENV} to allow actions)"
    console.print(
        f"txmq console on http://{host}:{port}/ for Redis at {redact_url(settings.redis_url)}: {mode}", highlight=False
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False, proxy_headers=False)


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
    from .core.topics import create_topic

    settings = _settings(redis_url=redis_url, cluster=cluster)
    count = create_topic(_client(settings), name, partitions)
    console.print(f"topic {name}: {count} partition{'s' if count > 1 else ''}", highlight=False)


@main.command()
@click.argument("role", type=click.Choice(ACL_ROLES))
@click.option(
    "--topic",
    "topics",
    multiple=True,
    help="A topic the part uses (repeat for more; required but for the console, which reads every topic without).",
)
@click.option("--group", "groups", multiple=True, help="Producer group (a producer's; a checker's, else all groups).")
@click.option("--consumer-group", help="A consumer's consumer group.")
@click.option("--user", default="txmq-ROLE", show_default=True, help="The ACL user name.")
@click.option(
    "--durability",
    type=click.Choice(LEVELS),
    default="master",
    show_default=True,
    help="The durability level the part writes with: replica allows WAIT, aof WAITAOF (Redis >= 7.2).",
)
def acl(
    role: str, topics: tuple[str, ...], groups: tuple[str, ...], consumer_group: str | None, user: str, durability: str
) -> None:
    """Print the least-privilege ACL SETUSER line for a producer, checker, consumer, Spark reader or writer, or the
    read-only console."""
    from .ops.acl import acl_rules

    try:
        rules = acl_rules(
            role, topics=topics, producer_groups=groups, consumer_group=consumer_group, durability=durability
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    name = user.replace("ROLE", role)
    shown = " ".join(f'"{rule}"' if " " in rule else rule for rule in rules)
    click.echo(f"ACL SETUSER {name} on >YOUR-PASSWORD {shown}")


def _counts(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {text!r}", param_hint=option) from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected comma-separated numbers >= 1, got {text!r}", param_hint=option)
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
@click.option(
    "--spark",
    is_flag=True,
    help="Also measure the Spark connector (local[2]): the batch writer against a pipelined XADD (the spark extra).",
)
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
    spark: bool,
    json_path: str | None,
    plot_path: str | None,
) -> None:
    """Measure send rates against plain XADD, producer processes, the checker at scale and memory per transaction."""
    from pathlib import Path

    # an editable install maps the package alone (as the wheel has it); the benchmarks sit beside it in the checkout
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "bench" / "run.py").is_file() and str(checkout) not in sys.path:
        sys.path.append(str(checkout))
    try:
        from bench.report import print_table, write_json, write_plot
        from bench.run import BenchOptions, run_bench
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "bench":
            raise
        raise CommandError(f"the benchmarks are not installed: {SOURCE_CHECKOUT_HINT}") from None

    overrides: dict[str, Any] = {
        "redis_url": redis_url,
        "rounds": rounds,
        "per_round": per_round,
        "processes": _counts(processes, "'--processes'") if processes else None,
        "seconds": seconds,
        "repeats": repeats,
        "in_flight": _counts(in_flight, "'--in-flight'") if in_flight else None,
        "memory_transactions": memory_transactions,
        "memory_wait": memory_wait,
        "cluster": cluster,
        "spark": spark,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    if redis_url is not None:
        _connect(redis_url).close()
    options = BenchOptions.quick(**given) if quick else BenchOptions(**given)
    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CommandError("--plot needs matplotlib: pip install matplotlib (or leave out --plot)") from None

    # SIGTERM unwinds like Ctrl-C: the servers and worker processes the run started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    results = run_bench(options)
    print_table(results, console)
    if json_path:
        write_json(results, Path(json_path))
        console.print(f"results written to {json_path}", highlight=False)
    if plot_path:
        write_plot(results, Path(plot_path))
        console.print(f"chart written to {plot_path}", highlight=False)
