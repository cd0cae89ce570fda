"""The databases the SQLAlchemy integration is tested on: SQLite (a file per test) and the PostgreSQL cluster the test
session starts (a schema per test). Each test gets a sync engine and an asyncio one on the same database."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from redis_txmq.sqlalchemy import Inbox, TransactionLog


@dataclass
class Database:
    name: str
    engine: Any
    async_url: str
    async_kwargs: dict[str, Any]
    metadata: MetaData
    log: TransactionLog
    inbox: Inbox

    def async_engine(self) -> Any:
        return create_async_engine(self.async_url, **self.async_kwargs)

    def create_tables(self) -> None:
        self.metadata.create_all(self.engine)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Database]:
    metadata = MetaData()
    log = TransactionLog(metadata, local_transaction_max_seconds=30, lock_timeout_seconds=2)
    inbox = Inbox(metadata)
    if request.param == "sqlite":
        path = tmp_path / "service.db"
        engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 2})
        database = Database(
            "sqlite", engine, f"sqlite+aiosqlite:///{path}", {"connect_args": {"timeout": 2}}, metadata, log, inbox
        )
    else:
        engine = request.getfixturevalue("postgres_engine")  # its URL names the test's own schema
        url = engine.url.render_as_string(hide_password=False)
        database = Database("postgresql", engine, url, {}, metadata, log, inbox)
    database.create_tables()
    yield database
    engine.dispose()
