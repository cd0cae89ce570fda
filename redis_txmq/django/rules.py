"""The Django side of ``redis_txmq.core.local_records`` (the rules the SQLAlchemy log and inbox follow too, written
there once, without SQLAlchemy): a field's length, and a purge's queries.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..core import local_records
from ..core.local_records import OldKeys, check_purge, purge_steps, run


def check_lengths(model: Any, values: dict[str, Any], what: str) -> None:
    """``redis_txmq.core.local_records.check_lengths`` against ``model``'s fields."""
    local_records.check_lengths(
        values, lambda name: getattr(model._meta.get_field(name), "max_length", None), model._meta.db_table, what
    )


def purge(model: Any, time_field: str, using: str, older_than: timedelta, batch_size: int) -> int:
    """Delete the rows of ``model`` whose ``time_field`` is more than ``older_than`` ago, in batches
    (``redis_txmq.core.local_records.purge_steps``); returns how many."""
    check_purge(older_than, batch_size)
    old = {f"{time_field}__lt": timezone.now() - older_than}

    def perform(effect: Any) -> Any:
        rows = model.objects.using(using)
        if isinstance(effect, OldKeys):
            return list(rows.filter(**old).order_by(time_field).values_list("pk", flat=True)[:batch_size])
        with transaction.atomic(using=using):
            return rows.filter(pk__in=effect.keys, **old).delete()[0]

    return run(purge_steps(batch_size), perform)
