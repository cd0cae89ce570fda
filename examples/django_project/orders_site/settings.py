"""Settings of the example order service (``examples/django_project``).

The database comes from ``DATABASE_URL``: ``sqlite:///orders.db`` (the default, beside this project),
``postgresql://user:password@host:5432/orders`` (psycopg) or ``mysql://user:password@host:3306/orders`` (PyMySQL,
for MySQL and MariaDB); Redis from ``TXMQ_REDIS_URL``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "an example's key: set DJANGO_SECRET_KEY in production")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")

INSTALLED_APPS = [
    "redis_txmq.django",  # the transaction log and the inbox (tables txmq_transaction_log, txmq_inbox)
    "orders",
]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]  # a JSON API: no sessions, no CSRF cookies
ROOT_URLCONF = "orders_site.urls"
WSGI_APPLICATION = "orders_site.wsgi.application"
ASGI_APPLICATION = "orders_site.asgi.application"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TXMQ_REDIS_URL = os.environ.get("TXMQ_REDIS_URL", "redis://localhost:6379/0")


def database(url: str) -> dict[str, Any]:
    """``DATABASES["default"]`` from a URL (a project of yours would likely use dj-database-url)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    if scheme == "sqlite":
        name = parts.path[1:] if parts.path.startswith("/") else parts.path
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / name, "OPTIONS": {"timeout": 5}}
    engines = {"postgresql": "django.db.backends.postgresql", "postgres": "django.db.backends.postgresql"}
    if scheme in ("mysql", "mariadb"):
        import pymysql  # PyMySQL stands in for mysqlclient (no C build needed)

        pymysql.install_as_MySQLdb()
        engines[scheme] = "django.db.backends.mysql"
    if scheme not in engines:
        raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r} (sqlite, postgresql, mysql)")
    config: dict[str, Any] = {
        "ENGINE": engines[scheme],
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }
    if engines[scheme] == "django.db.backends.mysql":
        config["OPTIONS"] = {"charset": "utf8mb4"}
    return config


DATABASES = {"default": database(os.environ.get("DATABASE_URL", "sqlite:///orders.db"))}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "redis_txmq": {"handlers": ["console"], "level": "INFO"},
        "orders": {"handlers": ["console"], "level": "INFO"},  # billing says so when a message is not an order
    },
}
