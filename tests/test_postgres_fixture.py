"""The PostgreSQL fixtures: a sync engine and an asyncio engine on the per-test schema both work."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, UniqueConstraint, insert, inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine

pytestmark = pytest.mark.real


def _table(metadata: MetaData) -> Table:
    return Table(
        "items",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("name", String(50), nullable=False),
        UniqueConstraint("name", name="items_name_unique"),
    )


def test_sync_engine_works_in_a_fresh_schema(postgres_engine: Any) -> None:
    metadata = MetaData()
    items = _table(metadata)
    with postgres_engine.connect() as connection:
        schema = connection.execute(text("SELECT current_schema()")).scalar_one()
        assert schema.startswith("t_")
        assert inspect(connection).get_table_names() == []
    metadata.create_all(postgres_engine)
    with postgres_engine.begin() as connection:
        connection.execute(insert(items), [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    with postgres_engine.connect() as connection:
        assert connection.execute(select(items.c.name).order_by(items.c.id)).scalars().all() == ["a", "b"]
    with pytest.raises(IntegrityError), postgres_engine.begin() as connection:
        connection.execute(insert(items).values(id=3, name="a"))
    with postgres_engine.connect() as connection:
        assert connection.execute(select(items.c.id)).scalars().all() == [1, 2]
        tables = connection.execute(
            text("SELECT table_schema FROM information_schema.tables WHERE table_name = 'items'")
        ).scalars()
        assert list(tables) == [schema]


def test_async_engine_sees_the_same_schema(postgres_engine: Any, async_postgres_url: str) -> None:
    metadata = MetaData()
    items = _table(metadata)
    metadata.create_all(postgres_engine)
    with postgres_engine.begin() as connection:
        connection.execute(insert(items).values(id=1, name="from sync"))

    async def scenario() -> None:
        engine = create_async_engine(async_postgres_url)
        try:
            async with engine.begin() as connection:
                await connection.execute(insert(items).values(id=2, name="from async"))
            async with engine.connect() as connection:
                names = (await connection.execute(select(items.c.name).order_by(items.c.id))).scalars().all()
                assert names == ["from sync", "from async"]
            with pytest.raises(IntegrityError):
                async with engine.begin() as connection:
                    await connection.execute(insert(items).values(id=3, name="from sync"))
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    with postgres_engine.connect() as connection:
        assert connection.execute(select(items.c.id).order_by(items.c.id)).scalars().all() == [1, 2]


def test_each_test_gets_an_empty_schema(postgres_engine: Any) -> None:
    with postgres_engine.connect() as connection:
        assert inspect(connection).get_table_names() == []
