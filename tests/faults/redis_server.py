"""A redis-server that the fault suite kills with SIGKILL and restarts on the same port and data directory, the
replica of the replica variant, which it freezes (SIGSTOP) so that the master's ``WAIT`` times out, and the
cluster variant's three masters, each of which it kills and restarts alike."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from redis_txmq.transport.embedded import free_port, wait_for_ping


class RedisServer:
    """``redis-server`` with ``appendfsync always``: every acknowledged write is on disk before the reply, so a
    SIGKILL loses nothing and a restart loads the append-only file. ``extra_args`` go on its command line."""

    def __init__(self, directory: Path, extra_args: tuple[str, ...] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("the fault suite needs redis-server on the PATH")
        self.binary = binary
        self.directory = directory
        self.extra_args = extra_args
        self.port = free_port()
        self.kills = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _persistence(self) -> tuple[str, ...]:
        return ("--appendonly", "yes", "--appendfsync", "always", "--save", "")

    def start(self) -> RedisServer:
        args = [
            self.binary,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
            *self._persistence(),
            *("--logfile", str(self.directory / "redis.log"), "--loglevel", "notice"),
            *self.extra_args,
        ]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # PING answers LOADING until the append-only file is read
        wait_for_ping(self.url, deadline_seconds=30, process=self._process)
        return self

    def kill(self) -> None:
        """SIGKILL, no chance to write anything more."""
        if self._process is not None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(10)
            self._process = None
            self.kills += 1

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._process = None


class ReplicaServer(RedisServer):
    """The replica of the replica variant (no persistence of its own): the services write at durability
    ``replica``, so while it is frozen (:meth:`stall`) every prepare, decision and end the master applies falls
    short of its confirmation, and when it resumes it catches up from the master's backlog."""

    def __init__(self, directory: Path, master: RedisServer) -> None:
        super().__init__(directory, ("--replicaof", "127.0.0.1", str(master.port)))
        self.stalls = 0

    def _persistence(self) -> tuple[str, ...]:
        return ("--appendonly", "no", "--save", "")

    def acknowledges(self, master: redis.Redis) -> bool:
        """Whether this replica acknowledges a write of ``master`` (a client of the master) within a second."""
        master.set("faults:replica-probe", 1)
        acknowledged = int(master.wait(1, 1000)) >= 1
        master.delete("faults:replica-probe")
        return acknowledged

    def stall(self) -> None:
        """SIGSTOP: the replica keeps its connection to the master but reads and acknowledges nothing."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)
            self.stalls += 1

    def resume(self) -> None:
        """SIGCONT (harmless when it was not stopped)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()  # a stopped process holds SIGTERM until it is continued
        super().stop()


CLUSTER_NODE_TIMEOUT_MS = 2000
"""The cluster variant's ``cluster-node-timeout``: a master down for 2-5 s is flagged as failing by the others (and
the flag cleared once it is back), as in a production cluster, where the outage outlasts the timeout."""
SLOTS = 16384


def cluster_port(taken: list[int]) -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port in taken or port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class ClusterNode(RedisServer):
    """A master of the cluster variant: :class:`RedisServer` (the same persistence: a SIGKILL loses nothing) with
    cluster mode on and ``cluster-require-full-coverage no``, so that the other masters serve their slots while it
    is down. It announces ``announce_port`` (its proxy's) to clients, in ``CLUSTER SLOTS`` and in redirections, so
    that every service reaches it through that proxy; the masters talk to each other on their bus ports, directly."""

    def __init__(self, directory: Path, port: int, announce_port: int) -> None:
        cluster_args = (
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-require-full-coverage", "no", "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS)),
            *("--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", str(announce_port)),
            *("--cluster-announce-bus-port", str(port + 10000)),
        )
        super().__init__(directory, cluster_args)
        self.port = port
        self.announce_port = announce_port

    def cluster_ok(self) -> bool:
        """Whether the node says ``cluster_state:ok`` (a restarted master waits a moment before it does)."""
        client = redis.Redis(port=self.port, socket_timeout=2)
        try:
            return b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
        except redis.RedisError:
            return False
        finally:
            client.close()


class FaultCluster:
    """The cluster variant's Redis: one :class:`ClusterNode` master per port of ``ports`` (no replicas: a master
    down means its slots are down), announcing the ports of ``announced`` (their proxies', started first), each
    with an equal range of the slots in order (master ``i`` serves ``i * 16384 // n`` onwards). :meth:`kill` and
    :meth:`restart` crash a master and bring it back on its port and data directory, with its data and its cluster
    identity."""

    def __init__(self, directory: Path, ports: list[int]) -> None:
        self.directory = directory
        self.ports = ports
        self.nodes: list[ClusterNode] = []
        self.kills = [0] * len(ports)

    def start(self, announced: list[int]) -> FaultCluster:
        for i, (port, announce_port) in enumerate(zip(self.ports, announced, strict=True)):
            (self.directory / f"node-{i}").mkdir()
            node = ClusterNode(self.directory / f"node-{i}", port, announce_port)
            node.start()
            self.nodes.append(node)
        clients = [redis.Redis(port=port) for port in self.ports]
        try:
            share = SLOTS // len(clients)
            for i, client in enumerate(clients):
                last = SLOTS - 1 if i == len(clients) - 1 else (i + 1) * share - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            for port in self.ports[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        finally:
            for client in clients:
                client.close()
        self.wait_ok(range(len(self.nodes)))
        return self

    def master_of(self, key: str) -> int:
        """The index of the master that serves ``key``."""
        return min(key_slot(key.encode()) // (SLOTS // len(self.ports)), len(self.ports) - 1)

    def wait_ok(self, masters: Iterable[int], seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        for i in masters:
            while not self.nodes[i].cluster_ok():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster master #{i} (port {self.ports[i]}) not ok within {seconds:.0f} s")
                time.sleep(0.05)

    def kill(self, master: int) -> None:
        """SIGKILL master ``master``: with ``appendfsync always`` it loses nothing it acknowledged."""
        self.nodes[master].kill()
        self.kills[master] += 1

    def restart(self, master: int) -> None:
        """Start master ``master`` again and wait until it says ``cluster_state:ok``."""
        self.nodes[master].start()
        self.wait_ok([master])

    def client(self) -> RedisCluster:
        """A client of the test's own, straight to the masters (not through their proxies)."""
        direct = {node.announce_port: node.port for node in self.nodes}
        return RedisCluster(
            host="127.0.0.1",
            port=self.ports[0],
            address_remap=lambda address: (address[0], direct.get(address[1], address[1])),
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
