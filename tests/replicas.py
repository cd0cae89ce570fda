"""A replica of the session's server, for the durability tests: the fixture ``replicated`` attaches one (and gives
its pid), :class:`Stopped` freezes it so that ``WAIT`` on the master times out."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import redis

from redis_txmq.transport.embedded import EmbeddedRedis

from .helpers import wait_until


@pytest.fixture(name="replicated")
def replicated_fixture(redis_url: str) -> Iterator[tuple[str, int]]:
    """The session's server with a replica of its own attached (URL of the master, pid of the replica)."""
    master = redis.Redis.from_url(redis_url)
    master.flushall()
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", port]) as replica:
        replica_port = replica.url.rsplit(":", 1)[1].split("/")[0]

        def online() -> bool:
            info = master.info("replication")
            return any(
                isinstance(v, dict) and str(v.get("port")) == replica_port and v.get("state") == "online"
                for k, v in info.items()
                if k.startswith("slave")
            )

        wait_until(online, timeout=20)
        master.set("replicated", 1)
        assert master.wait(1, 10_000) == 1  # the replica acknowledges writes (not only "online")
        master.delete("replicated")
        process = replica._process
        assert process is not None
        try:
            yield redis_url, process.pid
        finally:
            os.kill(process.pid, signal.SIGCONT)
            master.close()


class Stopped:
    """The replica stopped (SIGSTOP) for the block: WAIT on the master gets no acknowledgement."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *_: object) -> None:
        os.kill(self.pid, signal.SIGCONT)
