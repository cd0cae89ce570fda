"""SCRIPT LOAD at start-up, so the first call finds its script (and a bad connection shows at start-up).

The asyncio module is the source; the sync one (``redis_txmq/sync/preload.py``) is generated from it by
``scripts/unasync.py``.
"""

from __future__ import annotations

from typing import Any

from ..core.clients import REDIS_ERRORS, is_cluster
from ..core.scripts import master_skipped


async def preload(*scripts: Any) -> None:
    """Load the scripts now. Calls still recover from NOSCRIPT after a server restart or SCRIPT FLUSH. On a Redis
    Cluster the scripts are loaded master by master, and a master that cannot be reached is skipped with a warning
    (its slots' calls load the scripts when they first run there): one master down must not stop a producer or
    checker from starting and serving the topics of the others. Raises when no master could be reached."""
    if not scripts:
        return
    client = scripts[0].registered_client
    if not is_cluster(client):
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
