"""Imported from a checkout rather than installed (``PYTHONPATH`` on a clone, a git worktree, a mutation tester's
copy), the package finds the checker and the Spark data source where the repository keeps them, at its top level
(``checker/``, ``spark_connector/``), under the names the build gives them (``redis_txmq.checker``,
``redis_txmq.spark``). Installed, there is nothing beside the package and this does nothing; an editable install
maps the same folders (pyproject's ``package-dir``), so every way of importing sees the same names."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

FOLDERS = {"redis_txmq.checker": "checker", "redis_txmq.spark": "spark_connector"}
"""Package name -> the repository folder that holds it (as in pyproject.toml)."""


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        folder = FOLDERS.get(fullname)
        if folder is None:
            return None
        init = self.checkout / folder / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def install(package_dir: Path) -> None:
    """Map the folders beside ``package_dir`` when they are there (a checkout), ahead of any other finder."""
    checkout = package_dir.parent
    ours = (checkout / "lua" / "end_transaction.lua").is_file() and (checkout / "pyproject.toml").is_file()
    if not ours or not all((checkout / folder / "__init__.py").is_file() for folder in FOLDERS.values()):
        return  # installed: site-packages may hold other projects' checker or spark_connector, never ours
    if not any(isinstance(finder, _CheckoutFolders) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFolders(checkout))
