"""The documentation is tested: every ```python block of docs/**/*.md and README.md runs against a real Redis, and
``mkdocs build --strict`` builds the site.

A page's blocks run in order in one namespace (a later block uses what an earlier one defined), in a fresh
directory, on the session's redis-server, with ``TXMQ_REDIS_URL`` pointing at it. A block preceded by the line
``<!-- fragment -->`` is a fragment (it needs Spark, PostgreSQL, Django settings, or names the reader brings) and is
not run; ``docs/contributing.md`` says so to writers. Shell blocks are never run.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FRAGMENT = "<!-- fragment -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    info: str
    source: str
    fragment: bool

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, indented ones (in lists) included, with their start line."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        found.append(Block(page, start + 1, info, "\n".join(body) + "\n", before == FRAGMENT))
    return found


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks_of(page) if b.language == "python" and not b.fragment]


PAGES_WITH_CODE = [p for p in pages() if runnable(p)]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.real
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_name)
def test_page_code_runs(page: Path, real_client, redis_url: str, tmp_path: Path, monkeypatch) -> None:
    """Each python block of the page, in order, in one namespace, on a flushed Redis of the test session."""
    monkeypatch.setenv("TXMQ_REDIS_URL", redis_url)
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("docs_page_" + re.sub(r"\W", "_", page.stem))  # a module, as a reader's script is
    monkeypatch.setitem(sys.modules, module.__name__, module)  # libraries look annotations up in it (SQLAlchemy)
    for block in runnable(page):
        code = compile(block.source, f"{_name(page)}:{block.line}", "exec")
        try:
            exec(code, module.__dict__)  # noqa: S102 - the documentation's own examples, run as a reader would
        except Exception as exc:  # noqa: BLE001 - re-raised with the block's place
            raise AssertionError(f"{_name(page)}, block at line {block.line} failed: {exc!r}") from exc


def test_the_docs_have_code_that_runs_and_fragments_are_marked_on_purpose() -> None:
    """The collector finds blocks (a broken fence pattern would pass every page silently), and a fragment marker is
    followed by a python block (a stray marker hides nothing by accident)."""
    assert len(PAGES_WITH_CODE) >= 8, [str(p) for p in PAGES_WITH_CODE]
    assert sum(len(runnable(p)) for p in PAGES_WITH_CODE) >= 30
    for page in pages():
        text = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(text):
            if line.strip() == FRAGMENT:
                following = next((t.strip() for t in text[number + 1 :] if t.strip()), "")
                where = f"{_name(page)}:{number + 1}"
                assert following.startswith("```python"), f"{where}: {FRAGMENT} before no python block"


def test_collector_reads_indented_blocks_and_fragments(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text\n\n```python\nx = 1\n```\n\n1. item\n\n    ```python\n    y = x + 1\n    ```\n\n"
        f"{FRAGMENT}\n```python\nundefined_name\n```\n\n```console\n$ rm -rf /\n```\n",
        encoding="utf-8",
    )
    found = blocks_of(page)
    assert [(b.language, b.fragment) for b in found] == [
        ("python", False),
        ("python", False),
        ("python", True),
        ("console", False),
    ]
    assert found[1].source == "y = x + 1\n"
    assert [b.source for b in runnable(page)] == ["x = 1\n", "y = x + 1\n"]


def test_readme_links_into_the_docs_resolve() -> None:
    """The README's relative links work on GitHub and in a checkout: every target exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_key_layout_page_names_every_key_of_keys_py() -> None:
    """Every key of the layout table in redis_txmq/core/keys.py appears on the key layout page."""
    from redis_txmq.core import keys

    table = re.findall(r"^``([^`]+)``", keys.__doc__ or "", flags=re.MULTILINE)
    assert len(table) > 20
    page = (DOCS / "reference" / "keys.md").read_text(encoding="utf-8")
    missing = [key for key in table if f"`{key}`" not in page]
    assert not missing, f"keys of redis_txmq/core/keys.py missing from docs/reference/keys.md: {missing}"


def test_entry_fields_page_names_every_field_of_entries_py() -> None:
    from redis_txmq.core import entries

    names = [v for k, v in vars(entries).items() if k.isupper() and isinstance(v, str)]
    assert len(names) > 10
    page = (DOCS / "reference" / "entries.md").read_text(encoding="utf-8")
    missing = [n for n in names if f"`{n}`" not in page]
    assert not missing, f"fields of redis_txmq/core/entries.py missing from docs/reference/entries.md: {missing}"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """The site builds with no warning: broken links, unknown API objects, a bad click command all fail it."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_click"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: the docs extra (scripts/setup installs it)")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8").count("txmq") > 10
