"""The module paths of 0.1.0 that moved in 0.2.0 still import, for one release: the module at its new path itself
(patching one patches the other), with a DeprecationWarning that names the new path (docs/upgrade.md)."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import redis_txmq
from redis_txmq import _moved

OLD_MODULES = (
    "acl admin batching broker check_handler check_requests config connection consumer consuming demo direct"
    " durability embedded entries errors groups heartbeat keys layout listener local_records log_rows message oneway"
    " preload producer protocol scripts sending sentinel synchronization topics tracing transaction wire"
).split()
"""Every module of the package's top folder in 0.1.0."""


@pytest.mark.parametrize("name", OLD_MODULES)
def test_an_old_path_gives_the_moved_module_with_a_warning(name: str) -> None:
    old = f"redis_txmq.{name}"
    sys.modules.pop(old, None)
    vars(redis_txmq).pop(name, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to redis_txmq\.\w+\.{name} in redis-txmq 0\.2\.0"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(_moved.MOVED[old])
    assert module.__name__ == _moved.MOVED[old]


def test_the_old_forms_of_import_work() -> None:
    for name in ("producer", "keys", "admin"):  # as in a fresh process: not imported yet by an earlier test
        sys.modules.pop(f"redis_txmq.{name}", None)
        vars(redis_txmq).pop(name, None)
    with pytest.warns(DeprecationWarning):
        from redis_txmq.keys import TopicKeys
    from redis_txmq.core.keys import TopicKeys as moved

    assert TopicKeys is moved
    with pytest.warns(DeprecationWarning):
        from redis_txmq import admin
    assert admin is importlib.import_module("redis_txmq.ops.admin")
    with pytest.warns(DeprecationWarning):
        assert redis_txmq.producer.TransactionProducer is redis_txmq.TransactionProducer


def test_the_public_names_and_new_paths_import_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("redis_txmq.sync.producer")
        importlib.import_module("redis_txmq.asyncio")
        from redis_txmq import Message, TransactionProducer  # noqa: F401
    with pytest.raises(AttributeError):
        _ = redis_txmq.no_such_module
