"""The inbox on Django: a consumer's effects on its database happen once per message, however often it is delivered.

The rules are those of ``redis_txmq.sqlalchemy.inbox``: ``(consumer group, message id)`` is written under a unique key
**in the consumer's own database transaction**; the first delivery writes it with its effects, a redelivery (the
consumer died between its commit and its ack, another instance claimed the message) finds it and skips the effects, and
the ack follows the commit either way. Two instances handling one message at once cannot both commit: the second's
insert waits for the first's transaction, then finds its row.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.utils import timezone

from ..core.entries import ConsumedMessage
from ..core.errors import ConfigurationError
from ..core.local_records import PURGE_BATCH_SIZE, InboxRules, require_group
from .rules import check_lengths, purge


def _model() -> Any:
    from .models import InboxEntry  # the app registry must be ready: imported when first used

    return InboxEntry


class Inbox(InboxRules):
    """The ``txmq_inbox`` table of the database ``using``: the messages each consumer group has applied. The key is
    compared exactly on every database (``billing`` and ``Billing`` are two groups); a group or id longer than its
    column is refused, never truncated. What it decides without the database is ``InboxRules``, shared with the
    SQLAlchemy inbox."""

    _logger = logging.getLogger(__name__)

    def __init__(self, *, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using

    def claim(self, consumer_group: str, message: ConsumedMessage) -> bool:
        """Record ``message`` in the current atomic block (on ``using``): True the first time, False when this group
        already applied it (do nothing then, but commit and ack). Raises
        [`ConfigurationError`][redis_txmq.core.errors.ConfigurationError] outside an atomic block: the claim would
        commit without the effects."""
        values = self._values(consumer_group, message)
        if not transaction.get_connection(self.using).in_atomic_block:
            raise ConfigurationError(
                f"inbox, topic {message.topic!r}, tx={message.transaction_id}: claim() must run inside the "
                f"transaction that applies the message (`with transaction.atomic(using={self.using!r}):`)"
            )
        try:
            with transaction.atomic(using=self.using):  # a savepoint: a duplicate leaves the outer block usable
                _model().objects.using(self.using).create(processed_at=timezone.now(), **values)
        except IntegrityError:
            return self._claimed(False, consumer_group, message)
        return True

    def handler(
        self, handle: Callable[[ConsumedMessage], Any], *, consumer_group: str
    ) -> Callable[[ConsumedMessage], None]:
        """A handler for ``consumer.run`` (the sync ``Consumer``): claims the message and calls ``handle(message)``
        in one ``transaction.atomic()``, committed before ``consumer.run`` acks; a redelivered message is committed
        and acked without calling ``handle``. ``handle`` uses the ORM as usual (on ``using``); its
        ``transaction.on_commit`` callbacks run after the commit, before the ack. Around each message the thread's
        connection is dropped when unusable or older than ``CONN_MAX_AGE``, as Django does around a request."""
        require_group(consumer_group)

        def process(message: ConsumedMessage) -> None:
            connection = connections[self.using]  # the calling thread's
            if not connection.in_atomic_block:
                connection.close_if_unusable_or_obsolete()
            try:
                with transaction.atomic(using=self.using):
                    if self.claim(consumer_group, message):
                        handle(message)
            finally:
                if not connection.in_atomic_block:
                    connection.close_if_unusable_or_obsolete()

        return process

    def async_handler(
        self, handle: Callable[[ConsumedMessage], Any], *, consumer_group: str
    ) -> Callable[[ConsumedMessage], Awaitable[None]]:
        """[`handler`][redis_txmq.django.inbox.Inbox.handler] for the asyncio ``Consumer``: ``handle`` is a plain
        function (the ORM in an atomic block is sync), run with the claim and the commit on one thread through
        ``sync_to_async``."""
        from asgiref.sync import sync_to_async

        process = sync_to_async(self.handler(handle, consumer_group=consumer_group), thread_sensitive=True)

        async def aprocess(message: ConsumedMessage) -> None:
            await process(message)

        return aprocess

    def purge(self, older_than: timedelta, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete rows older than ``older_than``; returns how many. A message redelivered after its row is gone is
        applied again: keep the window above the longest a message can stay pending (``claim_idle`` and your
        consumers' downtime), days rather than minutes. Rows go in batches of at most ``batch_size``."""
        return purge(_model(), "processed_at", self.using, older_than, batch_size)

    def _check_lengths(self, values: dict[str, Any], what: str) -> None:
        check_lengths(_model(), values, what)
