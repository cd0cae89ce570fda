"""The wheel ships the Lua scripts: a non-editable install into a fresh venv can send a transaction."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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


@pytest.mark.slow
def test_wheel_install_sends_a_transaction(tmp_path, real_client, redis_url):
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", ROOT, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("redis_txmq-*.whl")
    run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)

    committed_id = run(python, "-c", SEND, redis_url, cwd=tmp_path).strip()

    ((entry_id, fields),) = real_client.xrange("wheel-topic")
    assert entry_id.decode() == committed_id and fields[b"body"] == b"from the wheel"
    assert "redis-txmq" in run(tmp_path / "venv" / "bin" / "txmq", "version", cwd=tmp_path)
