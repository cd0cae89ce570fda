"""The database side of a transactional message, on SQLAlchemy 2.x (sync and asyncio; ``redis-txmq[sqlalchemy]``).

- [`TransactionLog`][redis_txmq.sqlalchemy.transaction_log.TransactionLog]: one row per local transaction, written
  inside it by ``session.execute(log.record(tx))``; ``checker=log.checker(engine)`` answers check-backs from it, safely
  (a fence row decides a race).
- [`Inbox`][redis_txmq.sqlalchemy.inbox.Inbox]: a consumer's effects applied once per message
  (``consumer.run(inbox.handler(...))``).
"""

try:
    import sqlalchemy  # noqa: F401 - a clear error when the extra is missing
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("redis_txmq.sqlalchemy needs SQLAlchemy 2.x: pip install 'redis-txmq[sqlalchemy]'") from exc

from .inbox import Inbox
from .transaction_log import TransactionLog

__all__ = ["Inbox", "TransactionLog"]
