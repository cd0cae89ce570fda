"""The wheel ships the Lua scripts: a non-editable install into a fresh venv can send a transaction. It installs
only the project's own top-level packages (the benchmarks stay in the source tree), marks the library typed and
carries the license its metadata names."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SEND = textwrap.dedent(
    """
    import sys
    import redis_txmq
    from redis_txmq import LocalTransactionState, Message, TransactionListener, TransactionProducer

    assert "site-packages" in redis_txmq.__file__, redis_txmq.__file__

    class Listener(TransactionListener):
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.COMMIT

        def check_local_transaction(self, message):
            return LocalTransactionState.COMMIT

    with TransactionProducer("wheel_group", Listener(), redis_url=sys.argv[1]) as producer:
        result = producer.send_message_in_transaction(Message("wheel-topic", b"from the wheel"))
    print(result.committed_id)
    """
)


def run(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_wheel(out: Path) -> None:
    """As a release is built: an sdist, then the wheel from it, so that nothing left over in the checkout (a
    ``build/`` of an earlier build, with modules since moved or deleted) can reach the wheel."""
    run(sys.executable, "-m", "build", "-o", out, ROOT, cwd=out.parent)


def check_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
        assert top_level == {"redis_txmq"}, top_level
        assert {"redis_txmq/checker/worker.py", "redis_txmq/spark/writer.py", "redis_txmq/sync/producer.py"} <= set(
            names
        )
        assert "redis_txmq/lua/include/repeat_wake.lua" in names
        assert not [
            name
            for name in names
            if name.startswith("redis_txmq/")
            and name.endswith(".py")
            and not (
                ROOT / name.replace("redis_txmq/checker/", "checker/").replace("redis_txmq/spark/", "spark_connector/")
            ).is_file()
        ], "the wheel holds a module the source tree does not"
        assert not [name for name in names if name.lower().endswith(".png")]
        assert "redis_txmq/py.typed" in names and "redis_txmq/lua/end_transaction.lua" in names
        (license_file,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert "Apache License" in archive.read(license_file).decode()
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        assert "License-Expression: Apache-2.0" in headers and "License-File: LICENSE" in headers


@pytest.mark.slow
def test_wheel_install_sends_a_transaction(tmp_path, real_client, redis_url):
    build_wheel(tmp_path / "dist")
    (wheel,) = (tmp_path / "dist").glob("redis_txmq-*.whl")
    check_wheel_contents(wheel)
    run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)

    committed_id = run(python, "-c", SEND, redis_url, cwd=tmp_path).strip()

    ((entry_id, fields),) = real_client.xrange("wheel-topic")
    assert entry_id.decode() == committed_id and fields[b"body"] == b"from the wheel"
    txmq = tmp_path / "venv" / "bin" / "txmq"
    assert "redis-txmq" in run(txmq, "version", cwd=tmp_path)
    assert "redis-txmq" in run(txmq, "--version", cwd=tmp_path)
    bench = subprocess.run([txmq, "bench", "--quick"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert bench.returncode == 1 and "Traceback" not in bench.stderr, bench.stderr
    (line,) = bench.stderr.splitlines()
    assert line.startswith("error: ") and "source checkout" in line and "pip install -e '.[bench]'" in line


IMPORTS = textwrap.dedent(
    """
    import importlib, importlib.machinery, json, sys
    names = json.loads(sys.argv[1])
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = repr(exc)
    # installed at the top level (an old name imported after redis_txmq is an alias with a warning, not installed)
    tops = [top for top in ("checker", "spark_connector", "bench") if importlib.machinery.PathFinder.find_spec(top)]
    import redis_txmq.core.scripts
    lua = redis_txmq.core.scripts.script_source("heartbeat")[:20]
    print(json.dumps({"failed": failed, "top_level": tops, "lua": lua}))
    """
)


@pytest.mark.slow
def test_wheel_and_editable_install_import_the_same_names(tmp_path):
    """One top-level package both ways: every module the wheel holds imports from the wheel and from an editable
    install (the checker and the Spark source inside the package, ``redis_txmq.checker`` and ``redis_txmq.spark``),
    neither makes ``checker``, ``spark_connector`` or ``bench`` importable, both find the Lua scripts; and ``txmq
    bench`` runs from the editable checkout (the benchmarks sit beside the package there)."""
    pyspark = pytest.importorskip("pyspark", reason="redis_txmq.spark imports pyspark: the spark extra")
    site = Path(pyspark.__file__).parent.parent
    assert not (site / "redis_txmq").exists(), "this environment holds a copy of redis_txmq, not an editable install"
    build_wheel(tmp_path / "dist")
    (wheel,) = (tmp_path / "dist").glob("redis_txmq-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        files = [name for name in archive.namelist() if name.endswith(".py")]
    names = sorted(
        name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name in files
        if "/django/" not in name  # Django's modules need the host's settings
    )
    assert {"redis_txmq.checker.worker", "redis_txmq.spark.writer", "redis_txmq.core.states"} <= set(names)
    for kind in ("wheel", "editable"):
        venv = tmp_path / kind
        run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
        python = venv / "bin" / "python"
        # the dependencies from this environment (a path line adds the folder, not its .pth files: not its
        # editable install of redis_txmq)
        (own_site,) = venv.glob("lib/python*/site-packages")
        (own_site / "dependencies.pth").write_text(f"{site}\n")
        install = wheel if kind == "wheel" else ("-e", ROOT)
        run(
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            *(install if kind == "editable" else (install,)),
            cwd=tmp_path,
        )
        got = json.loads(run(python, "-c", IMPORTS, json.dumps(names), cwd=tmp_path).strip().splitlines()[-1])
        assert got["failed"] == {}, (kind, got["failed"])
        assert got["top_level"] == [], (kind, got["top_level"])
        assert got["lua"], kind
    txmq = tmp_path / "editable" / "bin" / "txmq"
    assert "--quick" in run(txmq, "bench", "--help", cwd=tmp_path)


@pytest.mark.slow
def test_sdist_keeps_the_benchmarks_and_the_license(tmp_path):
    run(sys.executable, "-m", "build", "--sdist", "-o", tmp_path, ROOT, cwd=tmp_path)
    (sdist,) = tmp_path.glob("redis_txmq-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "bench/run.py", "bench/README.md", "redis_txmq/py.typed", "lua/end_transaction.lua"} <= names
