"""The database side of a transactional message as a Django app (``redis-txmq[django]``; Django >= 4.2).

Add ``"redis_txmq.django"`` to ``INSTALLED_APPS`` and run ``manage.py migrate``: it brings two tables, the same ones (in
meaning) as [`redis_txmq.sqlalchemy`][redis_txmq.sqlalchemy]'s.

- [`TransactionLog`][redis_txmq.django.transaction_log.TransactionLog]: one row per local transaction, written inside it
  by ``log.record(tx)`` in ``transaction.atomic()``; ``checker=log.checker()`` answers check-backs from the Django
  database behind a fence.
- [`Inbox`][redis_txmq.django.inbox.Inbox]: a consumer's effects applied once per message
  (``consumer.run(inbox.handler(apply, ...))``, or ``manage.py txmq_consume``).

Importing this package does not touch the app registry: the models are imported when first used.
"""

try:
    import django  # noqa: F401 - a clear error when the extra is missing
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("redis_txmq.django needs Django >= 4.2: pip install 'redis-txmq[django]'") from exc

from .inbox import Inbox
from .transaction_log import TransactionLog

__all__ = ["Inbox", "TransactionLog"]
