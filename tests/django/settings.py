"""Django settings of the tests (``tests/django``): the app and the example's ``orders`` app, on three databases.

In the test process: ``default`` (SQLite, a file the conftest names in a temporary directory), ``postgresql`` and
``mariadb``, whose servers the session starts; ``tests/django/conftest.py`` fills in their addresses and creates the
test databases. A service process the tests start (``tests/django/service.py``) gets its one database as JSON in
``TXMQ_DJANGO_DATABASE``, as ``default``.
"""

from __future__ import annotations

import json
import os

try:
    import pymysql  # PyMySQL stands in for mysqlclient in Django's MySQL backend

    pymysql.install_as_MySQLdb()
except ImportError:  # pragma: no cover - the mysql extra is missing: the MariaDB tests skip
    pass

SECRET_KEY = "the tests' own key"
INSTALLED_APPS = ["redis_txmq.django", "orders"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "orders_site.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TXMQ_REDIS_URL = os.environ.get("TXMQ_REDIS_URL")

LOCK_WAIT_SECONDS = 2
"""How long SQLite waits for the write lock: the fence's bound there, kept short for the tests."""

if os.environ.get("TXMQ_DJANGO_DATABASE"):
    DATABASES = {"default": json.loads(os.environ["TXMQ_DJANGO_DATABASE"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": "unset.db",
            "OPTIONS": {"timeout": LOCK_WAIT_SECONDS},
        },
        "postgresql": {"ENGINE": "django.db.backends.postgresql", "NAME": "txmq_django"},
        "mariadb": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": "txmq_django",
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"CHARSET": "utf8mb4"},
        },
    }
