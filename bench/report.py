"""How results are shown: a ``rich`` table, a JSON file, and a PNG chart (matplotlib, the ``bench`` extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

TARGETS = {"send_sync": 0.45, "send_oneway": 0.80, "producers": 12_000, "checkbacks": 2_000}
"""The goals of the performance issue, shown beside each figure (a benchmark reports; nothing asserts them)."""


def _ratio(spread: dict[str, float]) -> str:
    return f"{spread['median']:.2f}× (p10 {spread['p10']:.2f}, p90 {spread['p90']:.2f})"


_ASYNC_CPU_MODES = {
    "asyncio": "asyncio send",
    "asyncio_single_prepares": "asyncio send, each prepare its own call",
    "asyncio_single_ends": "asyncio send, each end its own call",
}


def _server_cpu_pipelined_rows(out: Table, cpu: dict[str, Any]) -> None:
    """Server CPU of the modes with many operations in flight (``bench/server_cpu.py``), those that ran."""
    per_op, in_flight = cpu["usec_per_op"], cpu.get("asyncio_in_flight", 64)
    if "xadd_pipelined" in per_op:
        out.add_row(f"server CPU per XADD, pipelined {in_flight} deep", f"{per_op['xadd_pipelined']:.1f} µs", "")
    for mode, name in _ASYNC_CPU_MODES.items():
        if mode not in per_op:
            continue
        scripts, calls = cpu["script_usec_per_tx"][mode], cpu["script_calls_per_tx"][mode]
        out.add_row(
            f"server CPU per {name}, {in_flight} in flight",
            f"{per_op[mode]:.1f} µs (scripts {scripts:.1f} µs, {calls:.2f} calls)",
            "≤ 30 µs" if mode == "asyncio" else "",
        )
        if f"{mode}_vs_xadd_pipelined" in cpu:
            out.add_row("  ratio to pipelined XADD (median of rounds)", _ratio(cpu[f"{mode}_vs_xadd_pipelined"]), "")
        if mode != "asyncio" and f"asyncio_vs_{mode}" in cpu:
            out.add_row(
                "  asyncio send (both batched) to this (median of rounds)", _ratio(cpu[f"asyncio_vs_{mode}"]), ""
            )


def table(results: dict[str, Any]) -> Table:
    out = Table(title="redis-txmq benchmark", show_lines=False)
    out.add_column("measurement")
    out.add_column("result", justify="right")
    out.add_column("goal", justify="right")
    send = results.get("send")
    if send:
        out.add_row("plain XADD, one process", f"{send['xadd_per_s']:,.0f} /s", "")
        out.add_row("sync send", f"{send['sync_per_s']:,.0f} tx/s", "")
        out.add_row("  ratio to XADD (median of rounds)", _ratio(send["sync_ratio"]), f"≥ {TARGETS['send_sync']}×")
        if "direct_vs_redis_py" in send:
            out.add_row(
                "  ratio to the same send through redis-py's Script path", _ratio(send["direct_vs_redis_py"]), ""
            )
        out.add_row("one-way send (incl. flush)", f"{send['oneway_per_s']:,.0f} tx/s", "")
        out.add_row("  ratio to XADD (median of rounds)", _ratio(send["oneway_ratio"]), f"≥ {TARGETS['send_oneway']}×")
        if "asyncio_per_s" in send:
            name = f"asyncio send, {send['asyncio_in_flight']} in flight (gather)"
            out.add_row(name, f"{send['asyncio_per_s']:,.0f} tx/s", "")
            out.add_row("  ratio to the sync send (median of rounds)", _ratio(send["asyncio_vs_sync"]), "≥ 2×")
        out.add_row("  every commit in its topic exactly once", "yes" if send["exactly_once"] else "NO", "yes")
    cpu = results.get("server_cpu")
    if cpu:
        per_op = cpu["usec_per_op"]
        out.add_row("server CPU per plain XADD", f"{per_op['xadd']:.1f} µs", "")
        for mode, goal in (("sync", "≤ 2.5×"), ("oneway", "≤ 1.5×")):
            if mode not in per_op:
                continue
            scripts = cpu["script_usec_per_tx"][mode]
            out.add_row(f"server CPU per {mode} send", f"{per_op[mode]:.1f} µs (scripts {scripts:.1f} µs)", "")
            out.add_row("  ratio to XADD (median of rounds)", _ratio(cpu[f"{mode}_vs_xadd"]), goal)
        _server_cpu_pipelined_rows(out, cpu)
    durability = results.get("durability")
    if durability:
        for level, per_s in durability["per_s"].items():
            out.add_row(f"sync send, durability {level}", f"{per_s:,.0f} tx/s", "")
            if level in durability["vs_master"]:
                out.add_row(
                    "  ratio to durability master (median of rounds)", _ratio(durability["vs_master"][level]), ""
                )
    rows = results.get("producers", [])
    most = max((row["processes"] for row in rows), default=0)
    for row in rows:
        aggregate_goal = row["mode"] != "xadd" and row["target"] == "standalone" and row["processes"] == most > 1
        goal = f"≥ {TARGETS['producers']:,}" if aggregate_goal else ""
        unit = "XADD/s" if row["mode"] == "xadd" else "tx/s"
        name = f"{row['processes']} processes, {row['target']}, {row['mode']}"
        busy = f" (server busy {row['server_busy']:.0%})" if "server_busy" in row else ""
        out.add_row(name, f"{row['per_s']:,.0f} {unit}{busy}", goal)
    for row in results.get("checkback", []):
        out.add_row(f"idle checker round, {row['in_flight']:,} in flight", f"{row['idle_claim_ms']:.2f} ms", "flat")
        out.add_row(
            f"check-backs, {row['in_flight']:,} in flight",
            f"{row['checkbacks_per_s']:,.0f} /s ({row['seconds']:.1f} s)"
            + ("" if row["exactly_once"] else " NOT exactly once"),
            f"≥ {TARGETS['checkbacks']:,}",
        )
    for row in results.get("idle_checker", []):
        topics = f"{row['topics']:,} topics"
        out.add_row(f"idle checker, {topics}: Redis CPU", f"{row['redis_cpu_pct_with_passes']:.2f}% of a core", "≤ 1%")
        vs = row.get("checkback_vs_smallest")
        out.add_row(
            f"  check-back from due to commit, {topics}",
            f"{row['checkback_ms']['median']:.0f} ms median" + (f" ({vs:.2f}× the fewest topics')" if vs else ""),
            "≤ 1.5×",
        )
    spark_write = results.get("spark_write")
    if spark_write:
        out.add_row(
            f"Spark batch write (local[2]), {spark_write['rows']:,} rows",
            f"{spark_write['spark_rows_per_s']:,.0f} rows/s",
            "",
        )
        out.add_row("pipelined XADD of the same rows, one process", f"{spark_write['xadd_rows_per_s']:,.0f} rows/s", "")
        ratio = f"{spark_write['ratio']:.2f}× (rounds {spark_write['ratio_min']:.2f}–{spark_write['ratio_max']:.2f})"
        out.add_row("  ratio (median of rounds)", ratio, "≥ 1.0×")
    memory = results.get("memory")
    if memory:
        out.add_row("memory per in-flight transaction", f"{memory['in_flight_bytes_per_tx']:,.0f} B", "")
        out.add_row("memory per finished tx, in the window", f"{memory['finished_bytes_per_tx_in_window']:,.0f} B", "")
        after = memory["finished_bytes_per_tx_after_window"]
        rounds = memory.get("checker_rounds_after_window")
        out.add_row(
            f"memory per finished tx, after the window ({memory['dedupe_window_s']:.0f} s)",
            "not waited for" if after is None else f"{after:,.1f} B ({rounds} checker rounds)",
            "0 B",
        )
    return out


LATENCY_MODES = {"xadd": "XADD", "sync": "sync send", "delivery": "delivery"}


def _latency_caption(latency: dict[str, Any]) -> str:
    lines = []
    during = latency.get("capacity_in_rounds")
    if during:
        lines.append(
            f"the same back-to-back sends during the rounds: {during['median']:,.0f} tx/s "
            f"(p10 {during['p10']:,.0f}, p90 {during['p90']:,.0f})"
        )
    consumer = latency.get("consumer_cpu_us_per_message")
    for row in latency["rows"]:
        if row["mode"] == "delivery" and row.get("client_cpu_us_per_send") is not None and consumer is not None:
            lines.append(
                f"CPU per message, delivery at {row['load']:.0%}: sender {row['client_cpu_us_per_send']:.0f} µs, "
                f"Redis {row['server_cpu_us_per_send']:.0f} µs, consumer {consumer:.0f} µs (over the run)"
            )
    return "\n".join(lines)


def latency_table(results: dict[str, Any]) -> Table | None:
    """p50 / p99 / p99.9 per mode and load of the latency part (open-loop, from the scheduled start); None without
    it."""
    latency = results.get("latency")
    if not latency:
        return None
    out = Table(
        title=f"latency from the scheduled start, open-loop at 50% / 90% of a sync send's capacity "
        f"({latency['capacity_per_s']:,.0f} tx/s, one thread); delivery: commit to consumer",
        caption=_latency_caption(latency),
        show_lines=False,
    )
    for column in ("load", "mode", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "sent/s", "samples"):
        out.add_column(column, justify="left" if column in ("load", "mode") else "right")

    def ms(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"

    for row in latency["rows"]:
        samples = f"{row['samples']:,}"
        if row["mode"] == "delivery" and row["delivered"] < row["sent"]:
            samples += f" of {row['sent']:,} sent"
        out.add_row(
            f"{row['load']:.0%} {row['target_per_s']:,.0f}/s",
            LATENCY_MODES.get(row["mode"], row["mode"]),
            ms(row["p50_ms"]),
            ms(row["p99_ms"]),
            ms(row["p999_ms"]),
            ms(row["max_ms"]),
            f"{row['achieved_per_s']:,.0f}",
            samples,
        )
    return out


def print_table(results: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(table(results))
    latency = latency_table(results)
    if latency is not None:
        console.print(latency)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_plot(results: dict[str, Any], path: Path) -> None:
    """Throughput per number of producer processes: sync, one-way and plain XADD (dashed: the cluster)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'redis-txmq[bench]'") from exc
    rows = results.get("producers", [])
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    styles = {"standalone": "-", "cluster": "--"}
    labels = {"xadd": "plain XADD", "sync": "sync send", "oneway": "one-way send"}
    colors = {"xadd": "tab:gray", "sync": "tab:blue", "oneway": "tab:orange"}
    for target in sorted({row["target"] for row in rows}):
        for mode in ("xadd", "sync", "oneway"):
            points = sorted((r["processes"], r["per_s"]) for r in rows if r["target"] == target and r["mode"] == mode)
            if points:
                xs, ys = zip(*points, strict=True)
                axes.plot(
                    xs, ys, styles.get(target, ":"), color=colors[mode], marker="o", label=f"{labels[mode]} ({target})"
                )
    axes.set_xlabel("producer processes")
    axes.set_ylabel("per second (aggregate)")
    axes.set_title("redis-txmq: throughput per number of producer processes")
    axes.set_xticks(sorted({row["processes"] for row in rows}) or [1])
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
