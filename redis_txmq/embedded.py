"""A throwaway Redis for the demo, the tests and the benchmark: ``redis-server`` on a free port when the binary is
there, else fakeredis' TCP server (with the ``dev`` extra); and a throwaway Redis Cluster. Never touches a server
it did not start."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import redis

from .errors import TxMQError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_ping(url: str, deadline_seconds: float = 10.0) -> None:
    """Return once the server at ``url`` answers PING; raise :class:`TxMQError` at the deadline."""
    deadline = time.monotonic() + deadline_seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        try:
            if client.ping():
                return
        except redis.RedisError as exc:
            last = exc
        finally:
            client.close()
        time.sleep(0.05)
    raise TxMQError(f"Redis at {url} did not answer PING within {deadline_seconds}s: {last}")


class EmbeddedRedis:
    """Context manager; ``url`` is set once started. ``kind`` is ``"redis-server"`` or ``"fakeredis"``."""

    def __init__(self, prefer_binary: bool = True, extra_args: list[str] | None = None) -> None:
        self.prefer_binary = prefer_binary
        self.extra_args = extra_args or []
        self.url = ""
        self.kind = ""
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._fake_server: Any = None

    def start(self) -> EmbeddedRedis:
        binary = shutil.which("redis-server") if self.prefer_binary else None
        if binary:
            self._start_binary(binary)
        else:
            self._start_fake()
        return self

    def _start_binary(self, binary: str) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="txmq-redis-")
        for _ in range(5):
            self.port = free_port()
            self._process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self._workdir.name,
                    "--loglevel",
                    "warning",
                    *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.url = f"redis://127.0.0.1:{self.port}/0"
            try:
                wait_for_ping(self.url)
            except TxMQError:
                self._process.kill()
                self._process.wait()
                continue
            self.kind = "redis-server"
            return
        raise TxMQError(f"could not start {binary} on a free port")

    def _start_fake(self) -> None:
        try:
            from fakeredis import TcpFakeServer
        except ImportError:
            raise TxMQError(
                "no redis-server binary and no fakeredis: install redis-server, or `pip install 'redis-txmq[dev]'`, "
                "or pass --redis-url"
            ) from None
        self.port = free_port()
        self._fake_server = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        threading.Thread(target=self._fake_server.serve_forever, daemon=True, name="fakeredis").start()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        wait_for_ping(self.url)
        self.kind = "fakeredis"

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._fake_server is not None:
            self._fake_server.shutdown()
            self._fake_server.server_close()
            self._fake_server = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _cluster_port(taken: list[int]) -> int:
    """A free port whose cluster bus port (port + 10000) exists and is free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535 or port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@contextlib.contextmanager
def embedded_cluster(masters: int = 3) -> Iterator[str]:
    """A throwaway Redis Cluster of ``masters`` masters (no replicas, nothing kept on disk) on free ports;
    yields the URL of its first node. Needs ``redis-server`` and ``redis-cli`` (Debian package redis-server)."""
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not binary or not cli:
        raise TxMQError("a cluster of its own needs redis-server and redis-cli on the PATH (bash scripts/setup)")
    ports: list[int] = []
    for _ in range(masters):
        ports.append(_cluster_port(ports))
    with tempfile.TemporaryDirectory(prefix="txmq-cluster-") as workdir:
        servers = [
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
                    workdir,
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
            deadline = time.monotonic() + 30
            while b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise TxMQError("the cluster did not reach cluster_state:ok within 30 s")
                time.sleep(0.05)
            node.close()
            yield f"redis://127.0.0.1:{ports[0]}/0"
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(10)
