"""A 3-master Redis Cluster that the test session starts itself on free ports (no replicas, nothing on disk)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from redis_txmq.embedded import embedded_cluster


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.fail("the cluster tests need redis-server and redis-cli (bash scripts/setup installs them)")
    with embedded_cluster() as url:
        yield url
