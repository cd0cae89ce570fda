"""Where a transaction log's row stands in the host's database transaction, as the send sees it.

"Committed" means the **outermost** database transaction committed. Under Django's ``ATOMIC_REQUESTS``, inside a
caller's ``transaction.atomic()`` or a SQLAlchemy session whose outer transaction is still open, the block around
``log.record(tx)`` only releases a savepoint: the row, and the service's data with it, commit later or never. A log's
``record()`` therefore attaches a ``RowWatch`` to the transaction id, and the send asks it, when the local transaction
is over, what to end the transaction with (``settle``):

- the row **committed** (the outermost transaction committed): COMMIT, also when the block raised afterwards
  (the data is in the database: the message must go with it);
- the row **rolled back** (its savepoint or the whole transaction): ROLLBACK;
- the row is **pending** in an outer transaction still open: nothing is sent now; the end waits for that
  transaction's commit (``RowWatch.when_committed``), and if it rolls back instead, the check-back finds no row, fences
  the transaction and rolls it back. The message is never visible before the commit, nor after a rollback.

No database library is imported here: the Django and SQLAlchemy logs each bring their watch.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .message import LocalTransactionState

logger = logging.getLogger(__name__)

COMMIT = LocalTransactionState.COMMIT
ROLLBACK = LocalTransactionState.ROLLBACK
UNKNOWN = LocalTransactionState.UNKNOWN


class RowState(enum.Enum):
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    PENDING = "pending"
    """Written in a database transaction that is still open (an outer one, the block's own having ended)."""
    UNSEEN = "unseen"
    """The watch cannot tell (a connection's transaction ended, and the library says not how): the block decides."""
    IN_DOUBT = "in doubt"
    """A commit may or may not have happened (its connection was lost, or its commit hooks were cut short or are
    running on another thread): nothing is guessed, the check-back reads the row."""


class RowWatch(Protocol):
    """One log row of a transaction, in the database transaction that wrote it."""

    def state(self) -> RowState:
        """Where the row stands now; safe to call from another thread than the one that wrote it."""
        ...

    def when_committed(self, then: Callable[[], None]) -> bool:
        """Call ``then`` once the outermost transaction holding the row commits (at once when it has); returns
        False when this watch cannot learn of that commit (the check-back settles the transaction then)."""
        ...


_WATCHES: dict[str, list[RowWatch]] = {}
"""Transaction id -> the watches of the log rows written for it in this process, until its send takes them."""
_WATCHES_LOCK = threading.Lock()


class Settles(Protocol):
    """What a transaction handle tells a log: whether its end is settled (a row recorded later is not watched)."""

    rows_settled: bool


def watch_row(transaction_id: str, watch: RowWatch, owner: Settles | None = None) -> None:
    """Called by a log's ``record()``: the send of ``transaction_id`` asks ``watch`` before it ends. A handle
    (``owner``) whose end is already settling is not watched any more: its block was left (cancelled while a thread
    still recorded), and nobody would take the watch."""
    with _WATCHES_LOCK:
        if owner is None or not owner.rows_settled:
            _WATCHES.setdefault(transaction_id, []).append(watch)


def take_watches(transaction_id: str, owner: Settles | None = None) -> list[RowWatch]:
    with _WATCHES_LOCK:
        if owner is not None:
            owner.rows_settled = True
        return _WATCHES.pop(transaction_id, [])


def row_state(states: list[RowState]) -> RowState | None:
    """The state of the transaction's rows (None: no row was recorded here). A row committed wins (the data is in
    the database); then one in doubt, one still pending, one unseen; rolled back only when every row was."""
    if not states:
        return None
    for state in (RowState.COMMITTED, RowState.IN_DOUBT, RowState.PENDING, RowState.UNSEEN):
        if state in states:
            return state
    return RowState.ROLLED_BACK


@dataclass(frozen=True, slots=True)
class Settled:
    """What the send ends the transaction with now; ``waiting``: the watches of rows pending in an outer
    transaction (``state`` is UNKNOWN then: the end waits for their commit)."""

    state: LocalTransactionState
    remark: str | None
    waiting: tuple[RowWatch, ...] = ()


WAITING_REMARK = "its log row waits for the outer database transaction to commit"


def settle(
    transaction_id: str, topic: str, state: LocalTransactionState, remark: str | None, owner: Settles | None = None
) -> Settled:
    """The end of ``transaction_id`` once its local transaction is over (``state``: what the block or the listener
    said), corrected by where its log rows stand in the host's database transaction."""
    watches = take_watches(transaction_id, owner)
    states = [watch.state() for watch in watches]
    rows = row_state(states)
    if rows is None or rows is RowState.UNSEEN:
        return Settled(state, remark)
    if rows is RowState.IN_DOUBT:
        logger.warning(
            "tx=%s topic=%s its database commit is in doubt: left to the check-back, which reads the row",
            transaction_id,
            topic,
        )
        return Settled(UNKNOWN, "its database commit is in doubt (a lost connection, or commit hooks cut short)")
    if rows is RowState.COMMITTED:
        if state is not COMMIT:
            logger.warning(
                "tx=%s topic=%s the local transaction said %s (%s), but its database transaction had committed its "
                "log row: COMMIT",
                transaction_id,
                topic,
                state.value,
                remark,
            )
        return Settled(COMMIT, None)
    if rows is RowState.ROLLED_BACK:
        if state is UNKNOWN and remark is not None:
            return Settled(state, remark)  # the connection was lost: a commit may have been applied after all
        if state is not ROLLBACK:
            logger.info("tx=%s topic=%s its log row was rolled back: ROLLBACK", transaction_id, topic)
        return Settled(ROLLBACK, remark or "its log row was rolled back with its database transaction")
    logger.info("tx=%s topic=%s %s", transaction_id, topic, WAITING_REMARK)
    return Settled(
        UNKNOWN, WAITING_REMARK, tuple(w for w, at in zip(watches, states, strict=True) if at is RowState.PENDING)
    )


def after_outer_commit(waiting: tuple[RowWatch, ...], commit: Callable[[], None]) -> bool:
    """Run ``commit`` once (the first of ``waiting`` to learn of its outer commit); False when none can learn of
    it: the check-back settles the transaction."""
    done = threading.Lock()

    def once() -> None:
        if not done.acquire(blocking=False):
            return
        try:
            commit()
        except Exception:  # noqa: BLE001 - runs inside the host's commit, after its data committed: never fail it
            logger.exception("the COMMIT after the outer database commit failed; the check-back will publish it")

    return any([watch.when_committed(once) for watch in waiting])
