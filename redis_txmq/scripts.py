"""Finds the Lua scripts and registers them on a client.

The scripts live in the top-level ``lua/`` folder of the source tree; the wheel ships them as
``redis_txmq/lua``. Registration goes through redis-py's ``Script`` objects: EVALSHA by digest, with
the automatic SCRIPT LOAD fallback when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from __future__ import annotations

import functools
import logging
from importlib import resources
from pathlib import Path
from typing import Any

from redis.cluster import RedisCluster

from .connection import REDIS_ERRORS
from .errors import TxMQError

logger = logging.getLogger(__name__)

TOPIC_PRELUDE = "topic_keys"
TOPIC_LIB = "topic_lib"
SELF_CONTAINED = frozenset({"prepare_half", "end_transaction"})
"""Transaction scripts that bind the topic keys but define no helpers: the two calls of every send, where each
closure a script makes on every call is measurable (``lua/topic_keys.lua``)."""
CONSUMER_PRELUDE = "consumer_keys"


def _script_dirs() -> list[Path]:
    packaged = Path(str(resources.files("redis_txmq"))) / "lua"
    source_tree = Path(__file__).resolve().parent.parent / "lua"
    return [packaged, source_tree]


@functools.cache
def script_source(name: str) -> str:
    """The text of ``lua/<name>.lua``, from the installed package or the source tree."""
    for directory in _script_dirs():
        path = directory / f"{name}.lua"
        if path.is_file():
            return path.read_text(encoding="utf-8")
    searched = ", ".join(str(d) for d in _script_dirs())
    raise TxMQError(f"Lua script {name}.lua not found (searched {searched}); reinstall redis-txmq")


def register_script(client: Any, name: str, *preludes: str) -> Any:
    """A redis-py ``Script`` for ``lua/<name>.lua`` bound to ``client``, with its preludes in front."""
    return client.register_script("\n".join(script_source(part) for part in (*preludes, name)))


def register_topic_script(client: Any, name: str) -> Any:
    """A transaction script: KEYS are :meth:`redis_txmq.keys.TopicKeys.script_keys`."""
    if name in SELF_CONTAINED:
        return register_script(client, name, TOPIC_PRELUDE)
    return register_script(client, name, TOPIC_PRELUDE, TOPIC_LIB)


def preload(*scripts: Any) -> None:
    """SCRIPT LOAD now, so the first call finds its script (and a bad connection shows at start-up).

    Calls still recover from NOSCRIPT after a server restart or SCRIPT FLUSH. On a Redis Cluster the scripts are
    loaded master by master, and a master that cannot be reached is skipped with a warning (its slots' calls
    load the scripts when they first run there): one master down must not stop a producer or checker from
    starting and serving the topics of the others. Raises when no master could be reached."""
    if not scripts:
        return
    client = scripts[0].registered_client
    if not isinstance(client, RedisCluster):
        for script in scripts:
            script.sha = client.script_load(script.script)
        return
    failure: Exception | None = None
    loaded = 0
    for node in client.get_primaries():
        try:
            for script in scripts:
                client.execute_command("SCRIPT LOAD", script.script, target_nodes=node)
            loaded += 1
        except REDIS_ERRORS as exc:
            failure = master_skipped(node, exc)
    if not loaded and failure is not None:
        raise failure


def master_skipped(node: Any, exc: Exception) -> Exception:
    """Log a cluster master the scripts could not be loaded on; returns the error (raised if all failed)."""
    logger.warning(
        "could not load the scripts on master %s:%s (%s); its slots load them on first use", node.host, node.port, exc
    )
    return exc
