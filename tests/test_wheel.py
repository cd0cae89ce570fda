"""The wheel ships the Lua scripts: a non-editable install into a fresh venv can send a transaction. It installs
only the project's own top-level packages (the benchmarks stay in the source tree), marks the library typed and
carries the license its metadata names."""

from __future__ import annotations

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


def check_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
        assert top_level == {"redis_txmq", "checker", "spark_connector"}, top_level
        assert not [name for name in names if name.lower().endswith(".png")]
        assert "redis_txmq/py.typed" in names and "redis_txmq/lua/end_transaction.lua" in names
        (license_file,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert "Apache License" in archive.read(license_file).decode()
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        assert "License-Expression: Apache-2.0" in headers and "License-File: LICENSE" in headers


@pytest.mark.slow
def test_wheel_install_sends_a_transaction(tmp_path, real_client, redis_url):
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", ROOT, cwd=tmp_path)
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


@pytest.mark.slow
def test_editable_install_imports_the_benchmarks(tmp_path):
    """`txmq bench` works from a checkout installed in editable mode: `bench` is importable there."""
    run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--no-deps", "-e", ROOT, cwd=tmp_path)
    where = "import importlib.util; print(importlib.util.find_spec('bench.run').origin)"
    found = run(python, "-c", where, cwd=tmp_path)
    assert Path(found.strip()) == ROOT / "bench" / "run.py"


@pytest.mark.slow
def test_sdist_keeps_the_benchmarks_and_the_license(tmp_path):
    run(sys.executable, "-m", "build", "--sdist", "-o", tmp_path, ROOT, cwd=tmp_path)
    (sdist,) = tmp_path.glob("redis_txmq-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "bench/run.py", "bench/README.md", "redis_txmq/py.typed", "lua/end_transaction.lua"} <= names
