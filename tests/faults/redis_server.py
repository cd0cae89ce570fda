"""A redis-server that the fault suite kills with SIGKILL and restarts on the same port and data directory, and the
replica of the replica variant, which it freezes (SIGSTOP) so that the master's ``WAIT`` times out."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import redis

from redis_txmq.embedded import free_port, wait_for_ping


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
        wait_for_ping(self.url, deadline_seconds=30)  # PING answers LOADING until the append-only file is read
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
