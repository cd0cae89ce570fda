"""The sync I/O shells are generated from the asyncio ones (``scripts/unasync.py``): a sync file edited by hand, or
an asyncio source changed without generating again, fails here (and in CI's own step), so the two APIs cannot
drift apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_generated_sync_shell_matches_its_asyncio_source() -> None:
    run = subprocess.run(
        [sys.executable, "scripts/unasync.py", "--check"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, f"stale generated files; run `python scripts/unasync.py`:\n{run.stdout}{run.stderr}"


def test_each_generated_file_says_so_and_names_its_source() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import unasync
    finally:
        sys.path.pop(0)
    assert unasync.SHELLS
    for source, target in unasync.SHELLS.items():
        first = (ROOT / target).read_text().splitlines()[:2]
        assert first[0].startswith(f"# Generated from {source} by scripts/unasync.py: do not edit"), target


def test_the_check_fails_on_a_stale_file(tmp_path: Path, monkeypatch) -> None:
    """The check must be able to fail: a copy of the tree with one generated file edited by hand."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import unasync
    finally:
        sys.path.pop(0)
    for path in [*unasync.SHELLS, *unasync.SHELLS.values(), "pyproject.toml"]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text())
    target = next(iter(unasync.SHELLS.values()))
    (tmp_path / target).write_text((ROOT / target).read_text().replace("def ", "def  ", 1))
    monkeypatch.setattr(unasync, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["unasync.py", "--check"])
    assert unasync.main() == 1
    monkeypatch.setattr(sys, "argv", ["unasync.py"])
    assert unasync.main() == 0
    assert (tmp_path / target).read_text() == (ROOT / target).read_text()
