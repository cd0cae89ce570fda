"""pytest-django for the Django app's tests only: the settings (``tests/django/settings.py``) are configured when
this directory is collected, not through ``DJANGO_SETTINGS_MODULE``, so the rest of the suite runs as before (no test
outside this directory carries a ``django_db`` mark, so pytest-django reorders nothing).

``django_db_setup`` (pytest-django's, overridden) creates the test databases the collected tests need: SQLite (a
file: a service process opens it too), and on the PostgreSQL cluster and the MariaDB server the session starts
(``tests/postgres_fixture.py``, ``tests/mariadb_fixture.py``) a database of their own. ``django_database`` is the
alias of one of them per test (parametrised), emptied after the test: the tests commit for real (their threads and
processes must see the rows), as Django's ``TransactionTestCase`` does.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_project"

if importlib.util.find_spec("django") is None or importlib.util.find_spec("pytest_django") is None:
    collect_ignore_glob = ["test_*.py"]  # the django extra (and pytest-django, in dev) is missing
else:
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))  # the example's `orders` app and `orders_site` project
    import django
    from django.conf import settings

    if not settings.configured:
        from . import settings as test_settings

        settings.configure(**{name: getattr(test_settings, name) for name in dir(test_settings) if name.isupper()})
        django.setup()

ALIASES = {"sqlite": "default", "postgresql": "postgresql", "mariadb": "mariadb"}


def _wanted(items: list[pytest.Item]) -> set[str]:
    """The databases the collected tests are parametrised with."""
    wanted = {"sqlite"}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "django_database" in callspec.params:
            wanted.add(callspec.params["django_database"])
    return wanted


def _server(request: pytest.FixtureRequest, fixture: str) -> Any:
    """A session fixture's value; None when it skipped (no server binaries outside CI, where it fails instead)."""
    try:
        return request.getfixturevalue(fixture)
    except pytest.skip.Exception:
        return None


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest, django_test_environment: None, django_db_blocker: Any, tmp_path_factory: Any
) -> Iterator[set[str]]:
    """The test databases, through Django's own ``setup_databases`` (migrations applied); the aliases made."""
    from django.db import connections
    from django.test.utils import setup_databases, teardown_databases

    wanted = _wanted(request.session.items)
    directory = tmp_path_factory.mktemp("django")
    sqlite = connections.settings["default"]
    sqlite["NAME"] = str(directory / "main.db")
    sqlite["TEST"]["NAME"] = str(directory / "test.db")
    aliases = {"default"}
    if "postgresql" in wanted and (url := _server(request, "postgres_url")) is not None:
        parts = urlsplit(url)
        connections.settings["postgresql"].update(
            HOST=parts.hostname,
            PORT=str(parts.port),
            USER=unquote(parts.username or ""),
            PASSWORD=unquote(parts.password or ""),
            NAME=parts.path.lstrip("/"),
        )
        connections.settings["postgresql"]["TEST"]["NAME"] = "txmq_django_test"
        aliases.add("postgresql")
    if "mariadb" in wanted and (port := _server(request, "mariadb_port")) is not None:
        connections.settings["mariadb"].update(HOST="127.0.0.1", PORT=str(port), USER="root", PASSWORD="")
        connections.settings["mariadb"]["TEST"]["NAME"] = "txmq_django_test"
        aliases.add("mariadb")
    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases=aliases, serialized_aliases=set())
    yield aliases
    with django_db_blocker.unblock():
        connections.close_all()
        try:
            teardown_databases(config, verbosity=0)
        except Exception as exc:  # noqa: BLE001 - a connection another thread left open: the server goes anyway
            warnings.warn(f"the Django test databases were not all dropped: {exc!r}", stacklevel=1)


@pytest.fixture(params=list(ALIASES))
def django_database(request: pytest.FixtureRequest, django_db_setup: set[str], django_db_blocker: Any) -> Iterator[str]:
    """The alias of one test database (SQLite, PostgreSQL, MariaDB), emptied after the test."""
    from django.apps import apps
    from django.db import connections

    alias = ALIASES[request.param]
    if alias not in django_db_setup:
        pytest.skip(f"no {request.param} server for the Django tests")
    with django_db_blocker.unblock():
        yield alias
        connection = connections[alias]
        if connection.in_atomic_block:
            connection.needs_rollback = True  # a test that failed inside an atomic block
        for model in apps.get_models():
            model.objects.using(alias).all().delete()
        connection.close()


@pytest.fixture
def txmq_redis(redis_url: str) -> Iterator[str]:
    """The session's Redis as ``settings.TXMQ_REDIS_URL`` for one test (the example's producers read it)."""
    from django.conf import settings

    previous = settings.TXMQ_REDIS_URL
    settings.TXMQ_REDIS_URL = redis_url
    try:
        yield redis_url
    finally:
        settings.TXMQ_REDIS_URL = previous
