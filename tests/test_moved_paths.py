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


def test_a_checkout_maps_its_own_folders_and_an_installed_package_maps_none(tmp_path) -> None:
    """Beside an installed package (site-packages), folders named checker and spark_connector are other projects':
    only a checkout of ours (its lua/ and pyproject.toml beside the package) is mapped."""
    from redis_txmq import _source_tree

    for folder in ("redis_txmq", "checker", "spark_connector"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    before = list(sys.meta_path)
    try:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _source_tree._CheckoutFolders)]
        _source_tree.install(tmp_path / "redis_txmq")  # site-packages with unrelated checker and spark_connector
        assert not [f for f in sys.meta_path if isinstance(f, _source_tree._CheckoutFolders)]
        (tmp_path / "lua").mkdir()
        (tmp_path / "lua" / "end_transaction.lua").write_text("")
        (tmp_path / "pyproject.toml").write_text("")
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _source_tree._CheckoutFolders)]
        _source_tree.install(tmp_path / "redis_txmq")
        finder = sys.meta_path[0]
        assert isinstance(finder, _source_tree._CheckoutFolders) and finder.checkout == tmp_path
        assert finder.find_spec("redis_txmq.checker").origin == str(tmp_path / "checker" / "__init__.py")
    finally:
        sys.meta_path[:] = before


def test_the_old_top_level_packages_are_the_moved_ones_not_copies() -> None:
    """``import checker`` (0.1.0's name, its folder on the path in a checkout) is ``redis_txmq.checker`` itself, and
    so is every module under it: one Checker class, one set of module state and logger names."""
    import redis_txmq.checker.worker as worker

    for name in [name for name in sys.modules if name == "checker" or name.startswith("checker.")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match="checker moved to redis_txmq.checker"):
        import checker
    with pytest.warns(DeprecationWarning, match=r"checker\.worker moved to redis_txmq\.checker\.worker"):
        from checker.worker import Checker
    assert checker is redis_txmq.checker and Checker is worker.Checker
    assert worker.__spec__.name == "redis_txmq.checker.worker", "the old path's spec stays with the alias"


def test_another_projects_checker_is_not_hidden(tmp_path, monkeypatch) -> None:
    (tmp_path / "checker").mkdir()
    (tmp_path / "checker" / "__init__.py").write_text("MINE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "checker"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            other = importlib.import_module("checker")
        assert other.MINE and other is not redis_txmq.checker
    finally:
        sys.modules.pop("checker", None)
        sys.modules.update(saved)
