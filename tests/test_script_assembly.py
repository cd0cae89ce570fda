"""The Lua loader assembles a script from its parts: ``--#include <name>`` lines are replaced by the text of
``lua/include/<name>.lua`` (recursively, indented like the directive), an unknown include or a misspelt directive is
an error at load, and the SHA a client sends is the assembled text's. On a real Redis: what SCRIPT LOAD digests and
what EVALSHA runs is that text, and the commit path still makes nine commands."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from redis_txmq.core import scripts
from redis_txmq.core.errors import TxMQError
from redis_txmq.core.keys import TopicKeys
from redis_txmq.core.scripts import assemble, register_script, register_topic_script, script_text, topic_preludes

LUA = Path(__file__).resolve().parent.parent / "lua"
KEYS = TopicKeys("assembly")


def fragments(**texts: str):
    """A fragment finder over ``texts`` (name -> text), raising like the loader for a name it lacks."""

    def find(name: str, origin: str) -> str:
        if name not in texts:
            raise TxMQError(f"Lua script {origin}.lua includes {name!r}, but there is no include/{name}.lua")
        return texts[name]

    return find


@pytest.fixture
def lua_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``lua/`` folder of the test's own, which the loader searches instead of the project's."""
    (tmp_path / "include").mkdir()
    monkeypatch.setattr(scripts, "_script_dirs", lambda: [tmp_path])
    scripts._read.cache_clear()
    scripts.script_source.cache_clear()
    yield tmp_path
    scripts._read.cache_clear()
    scripts.script_source.cache_clear()


def test_an_include_is_replaced_by_the_fragment_text_indented_like_the_directive() -> None:
    text = "local a = 1\nif a then\n  --#include step\nend\nreturn a"
    assembled = assemble(text, "main", fragments(step="a = a + 1\n\nredis.call('PING')\n"))
    assert assembled == "local a = 1\nif a then\n  a = a + 1\n\n  redis.call('PING')\nend\nreturn a"


def test_includes_are_resolved_recursively() -> None:
    found = fragments(outer="local x = 1\n--#include inner\n", inner="x = x * 2")
    assert assemble("--#include outer\nreturn x", "main", found) == "local x = 1\nx = x * 2\nreturn x"


def test_a_text_without_includes_is_unchanged() -> None:
    text = "-- a comment\n--not a directive\nreturn 1\n"
    assert assemble(text, "main", fragments()) == text


def test_an_unknown_include_raises_naming_the_script_and_the_fragment() -> None:
    with pytest.raises(TxMQError, match=r"main\.lua includes 'missing'"):
        assemble("--#include missing\nreturn 1", "main", fragments())


def test_an_include_cycle_is_refused() -> None:
    found = fragments(a="--#include b", b="--#include a")
    with pytest.raises(TxMQError, match=r"include cycle a -> b -> a"):
        assemble("--#include a", "main", found)


@pytest.mark.parametrize("line", ["--#includ step", "--#include", "--#include two words", "  --#define x 1"])
def test_a_misspelt_directive_is_an_error_not_a_comment(line: str) -> None:
    with pytest.raises(TxMQError, match="unknown directive"):
        assemble(f"return 1\n{line}", "main", fragments(step="return 2"))


def test_the_loader_inlines_fragments_from_the_include_folder(lua_dir: Path) -> None:
    (lua_dir / "include" / "bump.lua").write_text("-- bump: expects n\nn = n + 1\n")
    (lua_dir / "count.lua").write_text("-- count: KEYS none\nlocal n = 1\n--#include bump\nreturn n\n")
    assert (
        scripts.script_source("count") == "-- count: KEYS none\nlocal n = 1\n-- bump: expects n\nn = n + 1\nreturn n\n"
    )


def test_an_unknown_include_is_an_error_when_the_script_is_registered(lua_dir: Path, fake_client) -> None:
    (lua_dir / "broken.lua").write_text("--#include nowhere\nreturn 1\n")
    with pytest.raises(TxMQError, match=r"broken\.lua includes 'nowhere'.*include/nowhere\.lua"):
        register_script(fake_client, "broken")


def test_every_script_and_fragment_of_the_project_assembles_and_every_fragment_is_used() -> None:
    names = sorted(p.stem for p in LUA.glob("*.lua"))
    texts = {name: scripts.script_source(name) for name in names}
    assert not [name for name, text in texts.items() if re.search(r"^[ \t]*--#", text, re.MULTILINE)]
    raw = "\n".join(p.read_text(encoding="utf-8") for p in sorted(LUA.rglob("*.lua")))
    unused = [p.stem for p in (LUA / "include").glob("*.lua") if f"--#include {p.stem}\n" not in raw]
    assert not unused, f"fragments nothing includes: {unused}"


def _fragment(name: str, indent: str = "") -> str:
    """The assembled text of ``include/<name>.lua`` as inlined at ``indent``."""
    text = assemble((LUA / "include" / f"{name}.lua").read_text(encoding="utf-8"), name).rstrip("\n")
    return "\n".join(indent + line if line else line for line in text.split("\n"))


def test_the_commit_path_and_its_other_callers_run_the_same_fragment_text() -> None:
    end, dead = scripts.script_source("end_transaction"), scripts.script_source("dead_resolve")
    assert _fragment("apply_outcome") in end and _fragment("apply_outcome") in dead
    assert _fragment("retire_half") in end
    assert _fragment("retire_half", "  ") in scripts.script_source("topic_lib")


def test_a_batch_of_ends_or_prepares_runs_the_rules_of_one_from_the_same_fragments() -> None:
    """The batch scripts differ from the single ones only in how they read and write the indexes (once per call):
    every rule of an end or a prepare is the same fragment text (tests/test_batch_equivalence.py compares their
    behaviour)."""
    ends, end = scripts.script_source("end_transactions"), scripts.script_source("end_transaction")
    for name in ("end_args", "read_half", "publish_outcome"):
        assert _fragment(name) in end and _fragment(name, "  ") in ends, name
    assert _fragment("end_not_in_flight", "  ") in end and _fragment("end_not_in_flight", "    ") in ends
    assert _fragment("retire_checked", "  ") in end and _fragment("retire_checked", "    ") in ends
    prepares, prepare = scripts.script_source("prepare_halves"), scripts.script_source("prepare_half")
    for name in ("prepare_args", "half_fields", "wake_topic"):
        assert _fragment(name) in prepare and _fragment(name, "  ") in prepares, name


def test_the_sha_is_that_of_the_assembled_text(fake_client) -> None:
    script = register_topic_script(fake_client, "end_transaction")
    text = script_text("end_transaction", *topic_preludes("end_transaction"))
    assert "--#include" not in text and "local committed_id = ''" in text
    assert script.sha == hashlib.sha1(text.encode()).hexdigest()


@pytest.mark.real
def test_script_load_and_evalsha_run_the_assembled_text(real_client) -> None:
    script = register_topic_script(real_client, "end_transaction")
    text = script_text("end_transaction", *topic_preludes("end_transaction"))
    assert real_client.script_load(text) == script.sha
    refused = ["tx", "group", "MAYBE", "producer", "", 0, 1, ""]
    by_sha = real_client.evalsha(script.sha, len(KEYS.script_keys()), *KEYS.script_keys(), *refused)
    by_text = real_client.eval(text, len(KEYS.script_keys()), *KEYS.script_keys(), *refused)
    assert by_sha == by_text and by_sha[:2] == [b"ERR", b"BADARG"]


def _commands_run(client) -> dict[str, int]:
    return {
        name.removeprefix("cmdstat_"): stats["calls"]
        for name, stats in client.info("commandstats").items()
        if name not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config|resetstat")
    }


@pytest.mark.real
def test_a_commit_of_a_never_checked_transaction_makes_nine_commands(real_client) -> None:
    prepare = register_topic_script(real_client, "prepare_half")
    end = register_topic_script(real_client, "end_transaction")
    keys = KEYS.script_keys()
    counted = []
    for n in range(5):
        txid = f"tx-{n}"
        prepare(keys=keys, args=[txid, "group", "assembly", "0", b"body", "", "", "", ""])
        end(keys=keys, args=[txid, "group", "ROLLBACK", "producer", "", 0, 1000, ""])  # loads the script
        prepare(keys=keys, args=[f"{txid}-c", "group", "assembly", "0", b"body", "k", "", "", ""])
        real_client.config_resetstat()
        reply = end(keys=keys, args=[f"{txid}-c", "group", "COMMIT", "producer", "", 60_000, 1000, ""])
        commands = _commands_run(real_client)
        assert reply[0] == b"OK" and reply[4] == b"APPLIED"
        if not reply[3].split(b"-")[0].endswith(b"0"):  # one end in ten also forgets expired outcomes
            counted.append(commands)
    assert counted
    for commands in counted:
        assert sum(commands.values()) == 9, commands
        assert commands == {"hget": 1, "xrange": 1, "xadd": 2, "hset": 1, "zadd": 1, "xdel": 1, "hdel": 1, "zrem": 1}
