"""Griffe extension: the API pages see ``redis_txmq.checker`` and ``redis_txmq.spark`` where the wheel puts them.

The repository keeps them at its top level (``checker/``, ``spark_connector/``) and the build maps them inside the
package (``pyproject.toml``, ``[tool.setuptools.package-dir]``). Griffe reads ``redis_txmq/`` from the disk and
would not find them there, so this mounts each folder under its installed name while ``redis_txmq`` is visited:
relative imports and cross-references then resolve to ``redis_txmq.spark.source.X``, the path a reader imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parent.parent
MOUNTS = {"checker": ROOT / "checker", "spark": ROOT / "spark_connector"}
"""Name inside ``redis_txmq`` -> the folder the build maps there."""


class MountedFolders(griffe.Extension):
    def on_module_members(self, *, node: Any, mod: griffe.Module, agent: Any, **kwargs: Any) -> None:
        if mod.path != "redis_txmq" or not isinstance(agent, griffe.Visitor):
            return
        for name, folder in MOUNTS.items():
            package = self._visit(agent, name, folder / "__init__.py", mod)
            for path in sorted(folder.glob("*.py")):
                if path.stem != "__init__":
                    package.set_member(path.stem, self._visit(agent, path.stem, path, package))
            mod.set_member(name, package)

    @staticmethod
    def _visit(agent: griffe.Visitor, name: str, path: Path, parent: griffe.Module) -> griffe.Module:
        code = path.read_text(encoding="utf-8")
        agent.lines_collection[path] = code.splitlines()
        return griffe.visit(
            name,
            path,
            code,
            extensions=agent.extensions,
            parent=parent,
            docstring_parser=agent.docstring_parser,
            docstring_options=agent.docstring_options,
            lines_collection=agent.lines_collection,
            modules_collection=agent.modules_collection,
        )
