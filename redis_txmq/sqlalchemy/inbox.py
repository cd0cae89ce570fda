"""The inbox: a consumer's effects on its database happen once per message, however often the message is delivered.

A message is delivered at least once: a consumer killed between its database commit and its ack gets it again, or
another instance claims it. The inbox records ``(consumer group, transaction id)`` under a primary key **in the
consumer's own database transaction**: the first delivery writes the row with its effects, a redelivery finds the
row and skips the handler, and the ack follows the commit either way. Two instances handling the same message at
once cannot both commit: the second one's insert waits for the first transaction and then finds its row.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Column, MetaData, String

from ..core.entries import ConsumedMessage
from ..core.local_records import (
    CONSUMER_GROUP_LENGTH,
    MESSAGE_ID_LENGTH,
    PURGE_BATCH_SIZE,
    TOPIC_LENGTH,
    InboxRules,
)
from .statements import (
    Key,
    check_lengths,
    insert_once,
    purge_rows,
    purge_rows_async,
    table_in,
    timestamp,
    utc_now,
)


class Inbox(InboxRules):
    """A table of the messages each consumer group has applied, in the consumer's own database.

    Columns: ``consumer_group`` and ``message_id`` (the primary key; the message's transaction id), ``topic``,
    ``processed_at``. The key is compared exactly on every database (``billing`` and ``Billing`` are two groups): on
    MySQL / MariaDB its columns are ``VARBINARY``, not ``VARCHAR`` in the server's case-insensitive collation; a table
    made by your migrations there needs binary key columns too. A group or id longer than its column is refused, never
    truncated. What it decides without the database is ``InboxRules``, shared with the Django inbox."""

    _logger = logging.getLogger(__name__)

    def __init__(self, metadata: MetaData, *, table_name: str = "txmq_inbox") -> None:
        """The table in ``metadata``. Its declaration has the shape of the log's (keys, a topic, a time column): two
        tables, each declared once; the rules they share are in ``redis_txmq.core.local_records``."""
        self.table = table_in(
            metadata,
            table_name,
            Column("consumer_group", Key(CONSUMER_GROUP_LENGTH), primary_key=True),
            Column("message_id", Key(MESSAGE_ID_LENGTH), primary_key=True),
            Column("topic", String(TOPIC_LENGTH), nullable=False),
            Column("processed_at", timestamp(), nullable=False, default=utc_now, index=True),
        )

    def claim(self, session: Any, consumer_group: str, message: ConsumedMessage) -> bool:
        """Record ``message`` in ``session``'s transaction (a ``Session`` or ``Connection``): True the first time,
        False when this group already applied it (do nothing then, but commit and ack)."""
        values = {**self._values(consumer_group, message), "processed_at": utc_now()}
        return self._claimed(insert_once(session, self.table, values), consumer_group, message)

    async def claim_async(self, session: Any, consumer_group: str, message: ConsumedMessage) -> bool:
        """[`claim`][redis_txmq.sqlalchemy.inbox.Inbox.claim] on an ``AsyncSession`` or ``AsyncConnection`` (the same
        statements, through its ``run_sync``)."""
        return bool(await session.run_sync(self.claim, consumer_group, message))

    def handler(
        self,
        session_factory: Callable[[], Any],
        handle: Callable[[Any, ConsumedMessage], Any],
        *,
        consumer_group: str,
    ) -> Callable[[ConsumedMessage], None]:
        """A handler for ``consumer.run``: opens a session from ``session_factory`` (a ``sessionmaker``), claims the
        message and calls ``handle(session, message)`` in one database transaction, committed before
        ``consumer.run`` acks. A redelivered message is committed and acked without calling ``handle``."""

        def process(message: ConsumedMessage) -> None:
            with session_factory() as session, session.begin():
                if self.claim(session, consumer_group, message):
                    handle(session, message)

        return process

    def async_handler(
        self,
        session_factory: Callable[[], Any],
        handle: Callable[[Any, ConsumedMessage], Awaitable[Any]],
        *,
        consumer_group: str,
    ) -> Callable[[ConsumedMessage], Awaitable[None]]:
        """[`handler`][redis_txmq.sqlalchemy.inbox.Inbox.handler] for the asyncio ``Consumer``: an
        ``async_sessionmaker`` and ``async def handle``."""

        async def process(message: ConsumedMessage) -> None:
            async with session_factory() as session, session.begin():
                if await self.claim_async(session, consumer_group, message):
                    await handle(session, message)

        return process

    def purge(self, engine: Any, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete rows older than ``older_than``; returns how many. A message redelivered after its row is gone is
        applied again: keep the window above the longest a message can stay pending (``claim_idle`` and your
        consumers' downtime), days rather than minutes. Rows go in batches of at most ``batch_size``, each in a
        transaction of its own, so a concurrent claim waits for one batch at most."""
        return purge_rows(engine, self.table, self.table.c.processed_at, older_than, batch_size)

    async def purge_async(self, engine: Any, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """[`purge`][redis_txmq.sqlalchemy.inbox.Inbox.purge] on an ``AsyncEngine``."""
        return await purge_rows_async(engine, self.table, self.table.c.processed_at, older_than, batch_size)

    def _check_lengths(self, values: dict[str, Any], what: str) -> None:
        check_lengths(self.table, values, what)
