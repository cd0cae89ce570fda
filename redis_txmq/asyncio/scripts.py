"""SCRIPT LOAD at start-up on a ``redis.asyncio`` client (the twin of :func:`redis_txmq.scripts.preload`)."""

from __future__ import annotations

from typing import Any

from ..connection import REDIS_ERRORS, is_async_cluster
from ..scripts import master_skipped


async def preload(*scripts: Any) -> None:
    """Load the scripts now; on a cluster master by master, skipping (and logging) an unreachable one, raising only
    when none could be reached. Calls still recover from NOSCRIPT after a restart or SCRIPT FLUSH."""
    if not scripts:
        return
    client = scripts[0].registered_client
    if not is_async_cluster(client):
        for script in scripts:
            script.sha = await client.script_load(script.script)
        return
    failure: Exception | None = None
    loaded = 0
    for node in client.get_primaries():
        try:
            for script in scripts:
                await client.execute_command("SCRIPT LOAD", script.script, target_nodes=node)
            loaded += 1
        except REDIS_ERRORS as exc:
            failure = master_skipped(node, exc)
    if not loaded and failure is not None:
        raise failure
