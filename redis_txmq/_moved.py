"""Module paths of an earlier release that moved, kept importable for one release with a DeprecationWarning.

``import redis_txmq.producer`` (or ``from redis_txmq.keys import TopicKeys``) still works and gives the module at
its new path itself, not a copy: patching one patches the other. So do ``import checker`` and ``import
spark_connector`` once ``redis_txmq`` is imported (in a checkout, their folders are the moved packages, not second
copies). The names a user imports from ``redis_txmq``, ``redis_txmq.asyncio``, ``redis_txmq.sqlalchemy`` and
``redis_txmq.django`` did not move. The upgrade notes
(docs/upgrade.md) list the moves; this table goes in the release after next."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from . import _source_tree

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


TOP_LEVEL: dict[str, str] = {folder: package for package, folder in _source_tree.FOLDERS.items()}
"""The top-level packages of 0.1.0 (the repository's folders that hold them) -> where they are now. Aliased only
when no other project's package of that name is installed (``import redis_txmq`` first, then ``import checker``
works, with the warning)."""


def new_name(old: str) -> str | None:
    """The module path now of ``old``, a moved path or a module under a moved top-level package; None if neither."""
    if old in MOVED:
        return MOVED[old]
    top, dot, rest = old.partition(".")
    return TOP_LEVEL[top] + dot + rest if top in TOP_LEVEL else None


def _ours(top: str, spec: importlib.machinery.ModuleSpec) -> bool:
    """Whether the package ``top`` found on ``sys.path`` is this checkout's folder (the repository root on the path),
    not another project's."""
    checkout = Path(__file__).resolve().parent.parent
    return spec.origin is not None and Path(spec.origin).resolve().parent == (checkout / top).resolve()


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved path, warns once per import and hands out the module at its new path."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        top = fullname.partition(".")[0]
        if top in TOP_LEVEL:
            if fullname == top:
                found = importlib.machinery.PathFinder.find_spec(top)
                if found is not None and not _ours(top, found):
                    return None  # another project's package of that name: not ours to hide
            elif getattr(sys.modules.get(top), "__name__", None) != TOP_LEVEL[top]:
                return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_name(spec.name)
        assert new is not None
        warnings.warn(
            f"{spec.name} moved to {new} in redis-txmq {MOVED_IN}; import it from there (or the public names from"
            " redis_txmq): the old path goes in the release after next",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module at its new path is already executed; the import machinery gave it the old path's spec: its
        own goes back (``importlib.reload`` and tools that read ``__spec__`` see the module as it is)."""
        old = module.__spec__.name if module.__spec__ is not None else ""
        if old in self._specs:
            module.__spec__ = self._specs.pop(old)


def install() -> None:
    """Ahead of the path finder: a checkout's ``checker/`` on ``sys.path`` (its root is, under pytest or as the
    working directory) is the package at its new path, not a second copy of it."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
