"""The two tables, in meaning the ones of [`redis_txmq.sqlalchemy`][redis_txmq.sqlalchemy] (same names and columns; the
inbox has a surrogate ``id`` and a unique ``(consumer_group, message_id)``, since Django before 5.2 has no composite
keys). Their declarations share a shape (fields, then ``Meta`` and ``__str__``): two models, each declared once; their
lengths come from ``redis_txmq.core.local_records``, as the SQLAlchemy tables' do."""

from __future__ import annotations

from django.db import models

from ..core.local_records import (
    CONSUMER_GROUP_LENGTH,
    MESSAGE_ID_LENGTH,
    STATE_LENGTH,
    TOPIC_LENGTH,
    TRANSACTION_ID_LENGTH,
)
from .fields import KeyField


class TransactionLogEntry(models.Model):
    """One local transaction: ``COMMIT`` written inside it (``TransactionLog.record``), or ``ROLLBACK``, a fence a
    check-back wrote once the transaction could no longer be running (its own insert then fails)."""

    transaction_id = KeyField(max_length=TRANSACTION_ID_LENGTH, primary_key=True)
    topic = models.CharField(max_length=TOPIC_LENGTH, null=True)
    state = models.CharField(max_length=STATE_LENGTH)
    recorded_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "txmq_transaction_log"
        verbose_name = "transaction log entry"
        verbose_name_plural = "transaction log"

    def __str__(self) -> str:
        return f"{self.transaction_id} {self.state}"


class InboxEntry(models.Model):
    """A message a consumer group applied, written in the same database transaction as its effects."""

    id = models.BigAutoField(primary_key=True)
    consumer_group = KeyField(max_length=CONSUMER_GROUP_LENGTH)
    message_id = KeyField(max_length=MESSAGE_ID_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    processed_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "txmq_inbox"
        verbose_name = "inbox entry"
        verbose_name_plural = "inbox"
        constraints = [
            models.UniqueConstraint(fields=["consumer_group", "message_id"], name="txmq_inbox_group_message"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group} {self.message_id}"
