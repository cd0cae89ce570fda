"""Each re-introduced defect of ``tests/model_defects/`` still applies to the tree: a patch that no longer applies
measures nothing (``tests/model_defects/run.py`` would report it as not found, or fail), so it is kept up with the
code it reverts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATCHES = sorted((ROOT / "tests" / "model_defects").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_the_defect_patch_applies_to_the_tree(patch: Path) -> None:
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, f"{patch.name} no longer applies: regenerate it against the code ({check.stderr})"
