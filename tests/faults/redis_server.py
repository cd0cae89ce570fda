"""A redis-server that the fault suite kills with SIGKILL and restarts on the same port and data directory."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from redis_txmq.embedded import free_port, wait_for_ping


class RedisServer:
    """``redis-server`` with ``appendfsync always``: every acknowledged write is on disk before the reply, so a
    SIGKILL loses nothing and a restart loads the append-only file."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("the fault suite needs redis-server on the PATH")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.kills = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            self.binary,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
            *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
            *("--logfile", str(self.directory / "redis.log"), "--loglevel", "notice"),
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
