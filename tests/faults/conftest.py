"""Fixtures of the fault suite: the seed (printed; ``TXMQ_FAULT_SEED`` replays it), the assembled system, and a
report that is printed at the end of the session, pass or fail."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import SummaryLines
from .harness import System, cluster_sizes, replica_sizes, sizes_from_env


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> list[str]:
    """Lines for the end-of-session summary (its section "fault suite")."""
    return SummaryLines(request.node, "fault suite")


@pytest.fixture
def fault_seed(fault_report: list[str]) -> int:
    raw = os.environ.get("TXMQ_FAULT_SEED")
    seed = int(raw) if raw else secrets.randbelow(2**31)
    line = f"fault seed {seed} (replay: TXMQ_FAULT_SEED={seed})"
    print(line)
    fault_report.append(line)
    return seed


@pytest.fixture(params=["sqlite", "postgresql", "replica", "cluster"])
def system(
    request: pytest.FixtureRequest, tmp_path: Path, fault_seed: int, fault_report: list[str]
) -> Iterator[System]:
    """The system, its services keeping their orders in SQLite ledgers or in a fresh PostgreSQL schema; in the
    replica variant, SQLite ledgers, a Redis with a replica and every write at durability ``replica``, with fewer
    orders; in the cluster variant, SQLite ledgers and a Redis Cluster of three masters, with fewer orders."""
    database_url = None
    if request.param == "postgresql":
        engine = request.getfixturevalue("postgres_engine")
        database_url = engine.url.render_as_string(hide_password=False)
    replicated, clustered = request.param == "replica", request.param == "cluster"
    sizes = replica_sizes(sizes_from_env()) if replicated else sizes_from_env()
    sizes = cluster_sizes(sizes) if clustered else sizes
    built = System(tmp_path, fault_seed, sizes, database_url, replicated, clustered)
    fault_report.append(f"{request.param}: logs, ledgers and Redis data of the run: {tmp_path}")
    try:
        yield built
    finally:
        built.stop()
