"""A 3-master Redis Cluster that the test session starts itself on free ports (no replicas, nothing on disk)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
import redis

from redis_txmq.embedded import free_port, wait_for_ping

from .helpers import wait_until


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) exists and is free too."""
    while True:
        port = free_port()
        if port + 10000 <= 65535 and port_is_free(port + 10000):
            return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not binary or not cli:
        pytest.fail("the cluster tests need redis-server and redis-cli (bash scripts/setup installs them)")
    workdir = tempfile.TemporaryDirectory(prefix="txmq-cluster-")
    ports = [cluster_port() for _ in range(3)]
    processes = [
        subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{port}.conf",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir.name,
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    try:
        for port in ports:
            wait_for_ping(f"redis://127.0.0.1:{port}/0")
        subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        node = redis.Redis(port=ports[0])
        wait_until(lambda: b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO"), timeout=30)
        node.close()
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)
        workdir.cleanup()
