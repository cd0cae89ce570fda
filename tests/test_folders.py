"""The map of the folders in docs/contributing.md is the code's: every folder of the package is on it, each imports
only the folders its row allows, no import circle runs between folders or between the modules of one folder, the
generated sync shells' folder holds nothing else, and the build lists every folder. Read from the source (the
imports as written, type-only ones included), so that the map cannot drift from the code."""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"checker": "redis_txmq.checker", "spark_connector": "redis_txmq.spark"}
"""Repository folder -> the package it is inside the wheel (pyproject's package-dir)."""
MAP_ROW = re.compile(r"^\| `(?P<folder>[\w/]+/)` \| (?P<what>.+?) \| (?P<imports>.*) \|$")


def folder_map() -> dict[str, set[str]]:
    """docs/contributing.md's map: folder -> the folders it may import."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = MAP_ROW.match(line)
        if match:
            rows[match["folder"]] = set(re.findall(r"`([\w/]+/)`", match["imports"]))
            if match["imports"].strip() == "every folder":
                rows[match["folder"]] = {"*"}
    everything = set(rows)
    return {folder: everything if allowed == {"*"} else allowed for folder, allowed in rows.items()}


def module_files() -> dict[str, Path]:
    """Dotted module name (as installed) -> its file, for the package and the folders mapped into it."""
    files = {}
    for top in ["redis_txmq", *MAPPED]:
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[0] in MAPPED:
                parts = MAPPED[parts[0]].split(".") + parts[1:]
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def folder_of(module: str, files: dict[str, Path]) -> str:
    """The map's name of the folder a module is in: ``redis_txmq/core/``, ``checker/``, or ``redis_txmq/`` itself."""
    path = files[module].relative_to(ROOT)
    if path.parts[0] in MAPPED:
        return f"{path.parts[0]}/"
    return f"redis_txmq/{path.parts[1]}/" if len(path.parts) > 2 else "redis_txmq/"


def imports_of(module: str, files: dict[str, Path]) -> set[str]:
    """The package's modules ``module`` imports, anywhere in it (functions and type-only blocks included)."""
    path = files[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                name = f"{target}.{alias.name}"
                found.add(name if name in files else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in files and name != module}


def module_graph() -> tuple[dict[str, Path], dict[str, set[str]]]:
    files = module_files()
    return files, {module: imports_of(module, files) for module in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def folder_arrows() -> dict[tuple[str, str], set[str]]:
    """(folder, folder it imports) -> the module imports that make the arrow."""
    files, graph = module_graph()
    arrows: dict[tuple[str, str], set[str]] = defaultdict(set)
    for module, targets in graph.items():
        for target in targets:
            pair = (folder_of(module, files), folder_of(target, files))
            if pair[0] != pair[1] and target != "redis_txmq":  # importing a subpackage runs the root's __init__
                arrows[pair].add(f"{module} -> {target}")
    return arrows


def test_every_folder_is_on_the_map_and_every_row_is_a_folder() -> None:
    rows = folder_map()
    on_disk = {f"redis_txmq/{path.parent.name}/" for path in (ROOT / "redis_txmq").glob("*/__init__.py")}
    on_disk |= {"redis_txmq/", *(f"{name}/" for name in MAPPED)}
    assert set(rows) == on_disk, f"not on the map: {on_disk - set(rows)}; not folders: {set(rows) - on_disk}"


def test_each_folder_imports_only_what_its_row_allows() -> None:
    rows = folder_map()
    wrong = {
        f"{source} -> {target}": sorted(why)[:3]
        for (source, target), why in folder_arrows().items()
        if target not in rows[source]
    }
    assert not wrong, f"imports the map does not allow (docs/contributing.md, ## Layout): {wrong}"


def test_no_import_circle_between_folders() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in folder_arrows():
        graph[source].add(target)
    assert not circles(graph), circles(graph)


def test_no_import_circle_between_the_modules_of_a_folder() -> None:
    files, graph = module_graph()
    inside = {
        module: {target for target in targets if folder_of(target, files) == folder_of(module, files)}
        for module, targets in graph.items()
        if module != "redis_txmq"
    }
    for targets in inside.values():
        targets.discard("redis_txmq")
    assert not circles(inside), circles(inside)


def test_the_rules_can_fail() -> None:
    """The circle finder finds a circle, and an arrow the map does not allow would be reported."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not circles({"a": {"b"}, "b": {"c"}})
    rows = folder_map()
    assert "redis_txmq/sync/" not in rows["redis_txmq/core/"]
    assert ("redis_txmq/sync/", "redis_txmq/core/") in folder_arrows()


def test_the_generated_shells_folder_holds_only_generated_files() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import unasync
    finally:
        sys.path.pop(0)
    generated = {Path(target).name for target in unasync.SHELLS.values()}
    present = {path.name for path in (ROOT / "redis_txmq" / "sync").glob("*.py")} - {"__init__.py"}
    assert present == generated, f"redis_txmq/sync/ holds files not generated: {present - generated}"
    init = ast.parse((ROOT / "redis_txmq" / "sync" / "__init__.py").read_text())
    assert all(isinstance(node, ast.Expr) for node in init.body), "redis_txmq/sync/__init__.py: a docstring only"


def test_the_build_lists_every_package() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(options["packages"])
    packages = {
        name
        for name, path in module_files().items()
        if path.name == "__init__.py" and "migrations" not in name.split(".")[-1:]
    }
    packages |= {"redis_txmq.django.migrations", "redis_txmq.lua", "redis_txmq.lua.include"}
    # folders of data files inside a package (templates, static assets): listed so that setuptools ships them
    for folder in (ROOT / "redis_txmq").rglob("*"):
        if folder.is_dir() and "__pycache__" not in folder.parts and not (folder / "__init__.py").exists():
            assert not list(folder.glob("*.py")), f"{folder}: Python files in a folder without __init__.py"
            packages.add(".".join(folder.relative_to(ROOT).parts))
    assert listed == packages, f"pyproject's packages: missing {packages - listed}, extra {listed - packages}"
    assert options["package-dir"] == {
        "redis_txmq.checker": "checker",
        "redis_txmq.spark": "spark_connector",
        "redis_txmq.lua": "lua",
    }
