"""The documentation is tested: every ```python block of docs/**/*.md and README.md runs against a real Redis, and
``mkdocs build --strict`` builds the site.

A page's blocks run in order in one namespace (a later block uses what an earlier one defined), in a fresh
directory, on the session's redis-server, with ``TXMQ_REDIS_URL`` pointing at it. A block preceded by the line
``<!-- fragment -->`` is a fragment (it needs Spark, PostgreSQL, Django settings, or names the reader brings) and is
not run; ``docs/contributing.md`` says so to writers. Shell blocks are never run.
"""

from __future__ import annotations

import html
import importlib.util
import itertools
import posixpath
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

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


DOCS_TOOLS = ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_click")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once for this module, into a directory of its own (a concurrent build elsewhere cannot race)."""
    for module in DOCS_TOOLS:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: the docs extra (scripts/setup installs it)")
    out = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.slow
def test_mkdocs_build_strict(site: Path) -> None:
    """The site builds with no warning: broken links, unknown API objects, a bad click command all fail it."""
    assert (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8").count("txmq") > 10
    figure = (site / "concepts" / "index.html").read_text(encoding="utf-8")
    assert '<figure class="diagram">' in figure and "<svg" in figure


# What a reader must never meet on a built page. The build passes all of these: they are read from its output.
ROLE = re.compile(r":(?:py:)?(?:class|meth|mod|func|data|attr|exc|obj|const):`?\w")
DIAGRAM_SOURCE = re.compile(r"^(?:stateDiagram|graph |flowchart|sequenceDiagram|classDiagram|erDiagram|gantt)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


class _Page(HTMLParser):
    """What the checks read of one page: its visible text, table cells, code blocks, ids, links and resources."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.cells: list[str] = []
        self.blocks: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.resources: list[str] = []
        self.mermaid = 0
        self._hidden = 0
        self._cell: list[str] | None = None
        self._block: list[str] | None = None
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for key in ("id", "name") if tag == "a" else ("id",):
            if a.get(key):
                self.ids.add(a[key])
        if "mermaid" in a.get("class", "").split():
            self.mermaid += 1
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        if tag == "script" and a.get("src"):
            self.resources.append(a["src"])
        if tag == "link" and "stylesheet" in a.get("rel", "").split():
            self.resources.append(a.get("href", ""))
        if tag in ("script", "style", "template"):
            self._hidden += 1
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "pre":
            self._pre += 1
            if self._pre == 1:
                self._block = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "template"):
            self._hidden = max(self._hidden - 1, 0)
        elif tag in ("td", "th") and self._cell is not None:
            self.cells.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "pre" and self._pre:
            self._pre -= 1
            if self._pre == 0 and self._block is not None:
                self.blocks.append("".join(self._block).strip())
                self._block = None

    def handle_data(self, data: str) -> None:
        if self._hidden:
            return
        self.text.append(data)
        for part in (self._cell, self._block):
            if part is not None:
                part.append(data)


def read_page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def site_defects(site: Path) -> list[str]:
    """Every defect of every built page: ``page: what``. The checks, each a reader's complaint:

    - a raw Sphinx role (``:class:`X``` shown as text: a docstring written for Sphinx, rendered by mkdocstrings);
    - ``Sentinel.UNSET`` (a click default the CLI reference printed as is) or a ``N/A`` table cell (an option
      without help);
    - a diagram left as its source (a ``mermaid`` block, or a code block that starts like one): it needs a script;
    - a script or stylesheet from another server: offline, the page is missing it;
    - a link inside the site to a page, file or anchor that is not there.
    """
    pages = {path.relative_to(site).as_posix(): read_page(path) for path in sorted(site.rglob("*.html"))}
    found = []
    for name, page in pages.items():
        found += [f"{name}: {what}" for what in page_defects(site, name, page, pages)]
    return found


def page_defects(site: Path, name: str, page: _Page, pages: dict[str, _Page]) -> list[str]:
    found = []
    text = "".join(page.text)
    for match in ROLE.finditer(text):
        found.append(f"a raw Sphinx role: ...{text[max(match.start() - 40, 0) : match.end() + 40]!r}")
    if "Sentinel.UNSET" in text:
        found.append("Sentinel.UNSET shown (a click default printed as is)")
    found += [f"a table cell reads {cell!r}" for cell in page.cells if cell == "N/A"]
    if page.mermaid:
        found.append(f"{page.mermaid} mermaid block(s): a diagram that needs a script to be drawn")
    found += [f"a diagram left as source: {b[:40]!r}" for b in page.blocks if DIAGRAM_SOURCE.match(b)]
    found += [f"loads {src!r} from another server" for src in page.resources if EXTERNAL.match(src)]
    here = PurePosixPath(name).parent
    for href in page.links:
        if EXTERNAL.match(href) or href in ("", "#"):
            continue
        target, _, anchor = href.partition("#")
        target = unquote(target.partition("?")[0])
        if not target:
            path = name
        else:
            path = posixpath.normpath(target.lstrip("/") if target.startswith("/") else str(here / target))
            if target.endswith("/") or (site / path).is_dir():
                path = posixpath.join(path, "index.html")
            path = path.removeprefix("./")
            if path.startswith("../") or not (site / path).exists():
                found.append(f"links to {href!r}: no such page or file")
                continue
        if anchor and path.endswith(".html") and unquote(anchor) not in pages[path].ids:
            found.append(f"links to {href!r}: {path} has no id {unquote(anchor)!r}")
    return found


@pytest.mark.slow
def test_built_pages_show_no_defect(site: Path) -> None:
    """Every page of the built site, as a reader meets it: no raw roles, no UNSET defaults, no diagram left as
    source, nothing loaded from another server, no link inside the site to nowhere."""
    assert len(list(site.rglob("*.html"))) > 30
    defects = site_defects(site)
    assert not defects, "\n".join(defects)


GOOD_PAGE = """<html><head><link rel="stylesheet" href="../assets/main.css"><script src="../assets/app.js"></script>
</head><body><h1 id="top">Title</h1><p>A <code>Name</code> and <a href="#top">a link</a>,
<a href="../other/">another page</a>, <a href="../other/#part">a part of it</a>, <a href="https://example.com/">out</a>.
</p><table><tr><td><code>--level</code></td><td>What it does.</td></tr></table>
<pre><code>graph_name = 1</code></pre><figure><svg><text>committed</text></svg></figure></body></html>"""

BAD = {
    "role": ("<p>Raises :class:<code>TxMQError</code>.</p>", "a raw Sphinx role"),
    "unset": ("<table><tr><td><code>Sentinel.UNSET</code></td></tr></table>", "Sentinel.UNSET"),
    "n/a": ("<table><tr><td>--log-level</td><td>N/A</td></tr></table>", "a table cell reads 'N/A'"),
    "mermaid": ('<pre class="mermaid"><code>A --> B</code></pre>', "mermaid block"),
    "diagram source": ("<pre><span></span><code>stateDiagram-v2\n  [*] --> A</code></pre>", "diagram left as source"),
    "flowchart source": ("<pre><code>flowchart TD\n  A --> B</code></pre>", "diagram left as source"),
    "cdn script": ('<script src="https://cdn.example.com/mermaid.min.js"></script>', "from another server"),
    "missing page": ('<a href="../nowhere/">gone</a>', "no such page or file"),
    "missing anchor": ('<a href="../other/#no-such-part">gone</a>', "has no id 'no-such-part'"),
    "missing anchor here": ('<a href="#nowhere">gone</a>', "has no id 'nowhere'"),
}


def _fake_site(root: Path, extra: str) -> Path:
    (root / "page").mkdir(parents=True)
    (root / "other").mkdir()
    (root / "assets").mkdir()
    (root / "assets" / "main.css").write_text("", encoding="utf-8")
    (root / "assets" / "app.js").write_text("", encoding="utf-8")
    (root / "page" / "index.html").write_text(GOOD_PAGE.replace("</body>", extra + "</body>"), encoding="utf-8")
    (root / "other" / "index.html").write_text('<h2 id="part">Part</h2><a href="../page/">back</a>', encoding="utf-8")
    return root


def test_site_checker_passes_a_good_page(tmp_path: Path) -> None:
    assert site_defects(_fake_site(tmp_path, "")) == []


@pytest.mark.parametrize("kind", sorted(BAD))
def test_site_checker_reports_each_defect(tmp_path: Path, kind: str) -> None:
    """Each check can fail: a page with that one defect is reported, and for it."""
    snippet, complaint = BAD[kind]
    defects = site_defects(_fake_site(tmp_path, snippet))
    assert len(defects) == 1 and complaint in defects[0] and defects[0].startswith("page/index.html: "), defects


def _diagrams() -> types.ModuleType:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: the docs extra (scripts/setup installs it)")
    spec = importlib.util.spec_from_file_location("docs_diagrams", DOCS / "diagrams.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_state_diagram_is_drawn_from_the_table() -> None:
    """Every state a move names and every move's cause are in the SVG, which needs no script; a change of the table
    is a change of the picture."""
    from redis_txmq.core import states

    diagrams = _diagrams()
    drawn = diagrams.figure("transaction-states")
    assert drawn.startswith('<figure class="diagram">') and "<svg" in drawn and "<script" not in drawn
    shown = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", drawn.split("</desc>", 1)[1])).split())
    for move in states.TRANSITIONS:
        assert move.source.value in shown and move.target.value in shown
        assert " ".join(move.by.split()) in shown, move.by  # a label's lines, read in order
    assert drawn.count("marker-end=") == len(states.TRANSITIONS)  # one arrow per move


def test_diagram_layout_keeps_boxes_and_labels_apart() -> None:
    """On a table with a cycle, a move to itself and a move over two ranks: no two items of a rank overlap, and
    every state sits below the states it is reached from (moves back up excepted)."""
    diagrams = _diagrams()
    graph = diagrams.Graph(
        "test",
        ("start", "middle", "side", "end"),
        (
            (0, 1, "go"),
            (1, 1, "wait a while, as long as it takes"),
            (1, 3, "finish"),
            (1, 2, "aside"),
            (2, 3, "back on track"),
            (2, 1, "retry from the side"),
        ),
    )
    ranks, paths, loops = diagrams.layout(graph)
    for rank in ranks:
        for left, right in itertools.pairwise(rank):
            assert left.x + left.right <= right.x - right.left, (left, right)
    rank_of = {item.node: item.rank for rank in ranks for item in rank if item.node is not None}
    assert rank_of[0] < rank_of[1] < rank_of[2] < rank_of[3]
    assert [upwards for _, _, upwards, _ in paths].count(True) == 1  # "retry from the side" goes back up
    assert loops == [(1, "wait a while, as long as it takes")]
    with pytest.raises(Exception, match="no such diagram"):
        diagrams.figure("no-such-diagram")


def test_errors_page_shows_every_error_where_it_is_imported() -> None:
    """The errors page lists each error at ``redis_txmq.<Name>`` (a new error left off it would go unseen)."""
    from redis_txmq.core import errors

    names = [
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    ]
    assert len(names) > 10
    page = (DOCS / "reference" / "api" / "errors.md").read_text(encoding="utf-8")
    missing = [name for name in names if f"::: redis_txmq.{name}\n" not in page]
    assert not missing, f"errors missing from docs/reference/api/errors.md: {missing}"
