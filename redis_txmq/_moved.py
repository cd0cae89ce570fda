"""Module paths of an earlier release that moved, kept importable for one release with a DeprecationWarning.

``import redis_txmq.producer`` (or ``from redis_txmq.keys import TopicKeys``) still works and gives the module at
its new path itself, not a copy: patching one patches the other. The names a user imports from ``redis_txmq``,
``redis_txmq.asyncio``, ``redis_txmq.sqlalchemy`` and ``redis_txmq.django`` did not move. The upgrade notes
(docs/guides/upgrading.md) list the moves; this table goes in the release after next."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED_IN = "0.2.0"

MOVED: dict[str, str] = {
    **{
        f"redis_txmq.{name}": f"redis_txmq.core.{name}"
        for name in (
            "batching check_requests config consuming durability entries errors groups heartbeat keys layout listener"
            " local_records log_rows message protocol scripts sending topics tracing"
        ).split()
    },
    **{
        f"redis_txmq.{name}": f"redis_txmq.sync.{name}"
        for name in "broker check_handler consumer oneway preload producer transaction wire".split()
    },
    **{
        f"redis_txmq.{name}": f"redis_txmq.transport.{name}"
        for name in "connection direct embedded sentinel synchronization".split()
    },
    **{f"redis_txmq.{name}": f"redis_txmq.ops.{name}" for name in "acl admin demo".split()},
}
"""Old module path -> new module path."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved path, warns once per import and hands out the module at its new path."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec:
        if fullname not in MOVED:
            return None  # type: ignore[return-value]
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} in redis-txmq {MOVED_IN}; import it from there (or the public names from"
            " redis_txmq): the old path goes in the release after next",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at its new path is already executed."""


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
