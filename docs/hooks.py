"""MkDocs hook: pages that quote the source stay true to it.

``<!-- lua-readme -->`` on a page is replaced by ``lua/README.md`` (its title dropped, its headings one level
down), and ``<!-- lua-headers -->`` by the opening comment of every script in ``lua/`` and ``lua/include/``: what
each ``KEYS[i]`` and ``ARGV[i]`` is and what it replies, as the scripts themselves say it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "lua"


def header(script: Path) -> str:
    """The leading ``--`` comment lines of a script, without the ``--``."""
    lines = []
    for line in script.read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[3:] if line.startswith("-- ") else line[2:])
    return "\n".join(lines).rstrip()


def lua_headers() -> str:
    parts = []
    for folder, title in ((LUA, "Scripts"), (LUA / "include", "Fragments (`lua/include/`)")):
        parts.append(f"## {title}\n")
        for script in sorted(folder.glob("*.lua")):
            name = script.relative_to(ROOT).as_posix()
            parts.append(f"### `{name}`\n\n```text\n{header(script)}\n```\n")
    return "\n".join(parts)


def lua_readme() -> str:
    lines = (LUA / "README.md").read_text(encoding="utf-8").splitlines()
    body = [("#" + line if line.startswith("#") else line) for line in lines if not line.startswith("# ")]
    return "\n".join(body).strip() + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if "<!-- lua-readme -->" in markdown:
        markdown = markdown.replace("<!-- lua-readme -->", lua_readme())
    if "<!-- lua-headers -->" in markdown:
        markdown = markdown.replace("<!-- lua-headers -->", lua_headers())
    return markdown
