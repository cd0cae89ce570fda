"""Ground truth: each service's own SQLite database, written by its local transactions.

``orders`` has a ``committed`` row for every transaction whose local transaction committed (with the transaction
id, as a real service stores it for the check-back), and an ``aborted`` tombstone for every transaction that a
check-back found without a row: from then on the local transaction can no longer commit it. Without the tombstone
a check that overtakes a slow local transaction (its prepare reply held up by a blackhole) would answer ROLLBACK
for an order that commits a moment later. ``attempts`` is the service's journal of its sends, for counting and for
resuming after a restart.

An order row's ``topic`` is its message's topic, or, for a transaction of several messages, the topics of its
messages by index, separated by spaces (:func:`recorded_topics`), with :data:`VOID` at the index of a send that
raised (the service sent that message again, under the next index): :func:`expected_messages` turns the rows into the
messages the topic streams must hold, :func:`voided_messages` into those that must never be visible. The journal
counts such sends per order (``failed_sends``)."""

from __future__ import annotations

import collections
import sqlite3
import threading
from pathlib import Path

from redis_txmq import Message

COMMITTED, ABORTED = "committed", "aborted"

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    transaction_id TEXT PRIMARY KEY, status TEXT NOT NULL, order_id TEXT, topic TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    n INTEGER PRIMARY KEY, order_id TEXT NOT NULL, behaviour TEXT NOT NULL, transaction_id TEXT, outcome TEXT,
    failed_sends INTEGER NOT NULL DEFAULT 0
);
"""


def recorded_topics(message: Message) -> str:
    """What an order row records as its topic: the topics of the order's messages (property ``parts``, on every
    message of a transaction of several), else the message's own."""
    return dict(message.properties or {}).get("parts") or message.topic


VOID = "-"
"""What an order row of several messages records at the index of a send that raised: never to be published."""


def expected_messages(committed: dict[str, str]) -> dict[str, str]:
    """Transaction id -> topic of every message the committed orders must have published: an order of several
    messages ``X`` published message ``i`` as ``X.i`` (unless its send raised)."""
    expected: dict[str, str] = {}
    for transaction_id, recorded in committed.items():
        topics = recorded.split()
        if len(topics) == 1:
            expected[transaction_id] = recorded
        else:
            expected |= {f"{transaction_id}.{i}": topic for i, topic in enumerate(topics) if topic != VOID}
    return expected


def voided_messages(committed: dict[str, str]) -> set[str]:
    """The messages of committed orders whose send raised (the order went on without them): never visible."""
    return {
        f"{transaction_id}.{i}"
        for transaction_id, recorded in committed.items()
        for i, topic in enumerate(recorded.split())
        if topic == VOID
    }


class Ledger:
    """One service's database; safe to use from several threads and processes (WAL, one connection per thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            self._local.db = db
        return db

    def _write(self, sql: str, *params: object) -> sqlite3.Cursor:
        return self._db().execute(sql, params)

    def commit_order(self, transaction_id: str, order_id: str, topic: str) -> bool:
        """The local transaction: insert the order row. False if a check-back aborted the transaction first."""
        try:
            self._write("INSERT INTO orders VALUES (?, ?, ?, ?)", transaction_id, COMMITTED, order_id, topic)
        except sqlite3.IntegrityError:
            return False
        return True

    def decide(self, transaction_id: str) -> bool:
        """The check-back: True if the order committed; otherwise abort it for good (tombstone) and say False."""
        self._write("INSERT OR IGNORE INTO orders (transaction_id, status) VALUES (?, ?)", transaction_id, ABORTED)
        row = self._db().execute("SELECT status FROM orders WHERE transaction_id = ?", (transaction_id,)).fetchone()
        return bool(row[0] == COMMITTED)

    def begin_attempt(self, n: int, order_id: str, behaviour: str) -> None:
        self._write("INSERT OR REPLACE INTO attempts (n, order_id, behaviour) VALUES (?, ?, ?)", n, order_id, behaviour)

    def finish_attempt(self, n: int, transaction_id: str | None, outcome: str, failed_sends: int = 0) -> None:
        """The outcome of send ``n``; ``failed_sends``: its sends of one message that raised and were tried again."""
        self._write(
            "UPDATE attempts SET transaction_id = ?, outcome = ?, failed_sends = ? WHERE n = ?",
            transaction_id,
            outcome,
            failed_sends,
            n,
        )

    def attempts_made(self) -> int:
        (count,) = self._db().execute("SELECT count(*) FROM attempts").fetchone()
        return int(count)

    def finished(self) -> int:
        """Sends journaled with an outcome (whatever it is) so far."""
        (count,) = self._db().execute("SELECT count(*) FROM attempts WHERE outcome IS NOT NULL").fetchone()
        return int(count)

    def outcomes(self) -> collections.Counter[str]:
        """How the sends ended, by outcome (``killed`` for sends whose process died before recording one)."""
        rows = self._db().execute("SELECT coalesce(outcome, 'killed'), count(*) FROM attempts GROUP BY 1")
        return collections.Counter({outcome: int(count) for outcome, count in rows})

    def failed_sends(self) -> collections.Counter[str]:
        """Sends of one message that raised inside a transaction of several, by the outcome of their order."""
        rows = self._db().execute(
            "SELECT coalesce(outcome, 'killed'), sum(failed_sends) FROM attempts WHERE failed_sends > 0 GROUP BY 1"
        )
        return collections.Counter({outcome: int(count) for outcome, count in rows})

    def committed(self) -> dict[str, str]:
        """Transaction id -> topic of every committed order."""
        rows = self._db().execute("SELECT transaction_id, topic FROM orders WHERE status = ?", (COMMITTED,))
        return dict(rows.fetchall())

    def aborted(self) -> int:
        (count,) = self._db().execute("SELECT count(*) FROM orders WHERE status = ?", (ABORTED,)).fetchone()
        return int(count)

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
