"""Finds the Lua scripts, assembles them from their parts and registers them on a client.

The scripts live in the top-level ``lua/`` folder of the source tree; the wheel ships them as
``redis_txmq/lua``. Registration goes through redis-py's ``Script`` objects: EVALSHA by digest, with
the automatic SCRIPT LOAD fallback when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).

A script is assembled before it is loaded: its preludes (chosen here, per family of scripts) go in front, and every
``--#include <name>`` line is replaced by the text of ``lua/include/<name>.lua``, recursively. Text, not a function:
steps shared by several scripts are written once without costing the send path a closure or a call (``lua/README.md``).
The SHA a client sends is the assembled text's, so everything that loads a script, or computes its digest, takes the
text from ``script_text`` (a redis-py ``Script`` registered here carries it).
"""

from __future__ import annotations

import functools
import logging
import re
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import TxMQError

logger = logging.getLogger(__name__)

TOPIC_PRELUDE = "topic_keys"
TOPIC_LIB = "topic_lib"
SELF_CONTAINED = frozenset({"prepare_half", "prepare_halves", "end_transaction", "end_transactions"})
"""Transaction scripts that bind the topic keys but define no helpers: the two calls of every send, where each
closure a script makes on every call is measurable (``lua/topic_keys.lua``), and the asyncio lane's batches of
prepares and of ends."""
CONSUMER_PRELUDE = "consumer_keys"
INCLUDE_DIR = "include"
"""Folder of ``lua/`` holding the fragments that ``--#include`` inlines (not scripts of their own)."""

_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)--#(?P<rest>.*)$")
_INCLUDE = re.compile(r"^include[ \t]+(?P<name>[A-Za-z0-9_]+)[ \t]*$")


def _script_dirs() -> list[Path]:
    packaged = Path(str(resources.files("redis_txmq"))) / "lua"
    source_tree = Path(__file__).resolve().parents[2] / "lua"
    return [packaged, source_tree]


@functools.cache
def _read(relative: str) -> str | None:
    for directory in _script_dirs():
        path = directory / relative
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None


def _fragment(name: str, origin: str) -> str:
    text = _read(f"{INCLUDE_DIR}/{name}.lua")
    if text is None:
        raise TxMQError(
            f"Lua script {origin}.lua includes {name!r}, but there is no {INCLUDE_DIR}/{name}.lua; fix the "
            f"--#include line or add the fragment (reinstall redis-txmq if the file should be there)"
        )
    return text


def assemble(text: str, origin: str, fragment: Any = _fragment, _chain: tuple[str, ...] = ()) -> str:
    """``text`` with every ``--#include <name>`` line replaced by the fragment's text (itself assembled), indented
    like the directive. ``origin`` names the text in errors; ``fragment(name, origin)`` returns a fragment's text.

    Raises [`TxMQError`][redis_txmq.core.errors.TxMQError] for an unknown fragment, a fragment that includes itself
    (directly or not), and a ``--#`` line that is not an include: a misspelt directive must not pass as a comment."""
    lines = []
    for number, line in enumerate(text.split("\n"), 1):
        directive = _DIRECTIVE.match(line)
        if directive is None:
            lines.append(line)
            continue
        include = _INCLUDE.match(directive["rest"])
        if include is None:
            raise TxMQError(
                f"Lua script {origin}.lua line {number}: unknown directive {line.strip()!r}; the only one is "
                f"'--#include <fragment name>'"
            )
        name = include["name"]
        if name in _chain:
            cycle = " -> ".join((*_chain, name))
            raise TxMQError(
                f"Lua script {origin}.lua line {number}: include cycle {cycle}; a fragment cannot include itself"
            )
        body = assemble(fragment(name, origin), f"{INCLUDE_DIR}/{name}", fragment, (*_chain, name))
        indent = directive["indent"]
        lines.extend(indent + part if part else part for part in body.rstrip("\n").split("\n"))
    return "\n".join(lines)


@functools.cache
def script_source(name: str) -> str:
    """The text of ``lua/<name>.lua`` with its includes inlined, from the installed package or the source tree."""
    text = _read(f"{name}.lua")
    if text is None:
        searched = ", ".join(str(d) for d in _script_dirs())
        raise TxMQError(f"Lua script {name}.lua not found (searched {searched}); reinstall redis-txmq")
    return assemble(text, name)


def script_text(name: str, *preludes: str) -> str:
    """The text ``lua/<name>.lua`` runs as, its preludes in front: what is loaded, and what its SHA is of."""
    return "\n".join(script_source(part) for part in (*preludes, name))


def topic_preludes(name: str) -> tuple[str, ...]:
    """The preludes of the transaction script ``name``: the topic keys, and the helpers unless it does without."""
    return (TOPIC_PRELUDE,) if name in SELF_CONTAINED else (TOPIC_PRELUDE, TOPIC_LIB)


def register_script(client: Any, name: str, *preludes: str) -> Any:
    """A redis-py ``Script`` for ``lua/<name>.lua`` bound to ``client``, assembled with its preludes in front."""
    return client.register_script(script_text(name, *preludes))


def register_topic_script(client: Any, name: str) -> Any:
    """A transaction script: KEYS are ``redis_txmq.core.keys.TopicKeys.script_keys``."""
    return register_script(client, name, *topic_preludes(name))


def master_skipped(node: Any, exc: Exception) -> Exception:
    """Log a cluster master the scripts could not be loaded on; returns the error (raised if all failed)."""
    logger.warning(
        "could not load the scripts on master %s:%s (%s); its slots load them on first use", node.host, node.port, exc
    )
    return exc
