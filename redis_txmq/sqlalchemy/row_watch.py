"""Where the transaction log's row stands in a SQLAlchemy session or connection (:mod:`redis_txmq.log_rows`).

``TransactionLog.record(tx)`` marks its INSERT with an execution option; two listeners, installed once for every
session and engine of the process, see that statement run and attach a watch to the transaction:

- run by a ``Session`` (``AsyncSession`` included): the session's events say when the outermost transaction holding
  the row commits (``after_commit``) or when the transaction or savepoint holding it rolls back
  (``after_soft_rollback``): the COMMIT waits for the former, a rollback ends it;
- run by a ``Connection`` (Core): a row whose outermost transaction is still open when the block ends is pending
  (the check-back settles it: a connection has no event after its commit); one whose transaction has ended is
  left to the block's own outcome, as before.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ..log_rows import RowState, watch_row

ROW_OPTION = "txmq_log_row"
"""The execution option of ``record()``'s INSERT: the transaction id its row is of."""

_IN_SESSION: contextvars.ContextVar[bool] = contextvars.ContextVar("txmq_log_row_in_session", default=False)
"""Set while a session runs the INSERT: its connection's listener leaves the watch to the session's."""


class SessionWatch:
    """A row written through ``session``: the transactions that hold it, from the innermost savepoint to the
    outermost transaction, and the session's events about them."""

    def __init__(self, session: Session) -> None:
        chain = []
        current = session.get_nested_transaction() or session.get_transaction()
        while current is not None:
            chain.append(current)
            current = current.parent
        self._chain = chain
        self._state = RowState.PENDING if chain else RowState.UNSEEN
        self._then: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        if chain:
            _watches_of(session).append(self)

    def after_commit(self) -> None:
        """The session's ``after_commit`` fires for a released savepoint too: only the outermost one counts."""
        if not self._chain[-1].is_active:
            self._finish(RowState.COMMITTED)

    def after_soft_rollback(self, previous_transaction: Any) -> None:
        if any(previous_transaction is held for held in self._chain):
            self._finish(RowState.ROLLED_BACK)

    def _finish(self, state: RowState) -> None:
        with self._lock:
            if self._state is not RowState.PENDING:
                return
            self._state = state
            then, self._then = self._then, []
        if state is RowState.COMMITTED:
            for call in then:
                call()

    def state(self) -> RowState:
        with self._lock:
            return self._state

    def when_committed(self, then: Callable[[], None]) -> bool:
        with self._lock:
            if self._state is RowState.PENDING:
                self._then.append(then)
                return True
            committed = self._state is RowState.COMMITTED
        if committed:
            then()
        return committed


class ConnectionWatch:
    """A row written through a ``Connection``: pending while the outermost transaction it ran in is still the
    connection's and active; unseen once it ended (the block's outcome decides, as without a watch)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._root = connection.get_transaction()

    def state(self) -> RowState:
        root = self._root
        if root is not None and root.is_active and self._connection.get_transaction() is root:
            return RowState.PENDING
        return RowState.UNSEEN

    def when_committed(self, then: Callable[[], None]) -> bool:
        return False


def _watches_of(session: Session) -> list[SessionWatch]:
    """The session's pending watches (in ``session.info``), with one pair of listeners per session for them all."""
    watches = session.info.get(_WATCHES_INFO)
    if watches is None:
        watches = session.info[_WATCHES_INFO] = []
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
    return watches


_WATCHES_INFO = "txmq_row_watches"


def _after_commit(session: Session) -> None:
    watches = session.info.get(_WATCHES_INFO, [])
    for watch in list(watches):
        watch.after_commit()
    watches[:] = [watch for watch in watches if watch.state() is RowState.PENDING]


def _after_soft_rollback(session: Session, previous_transaction: Any) -> None:
    watches = session.info.get(_WATCHES_INFO, [])
    for watch in list(watches):
        watch.after_soft_rollback(previous_transaction)
    watches[:] = [watch for watch in watches if watch.state() is RowState.PENDING]


def _on_session_execute(orm_execute_state: Any) -> Any:
    transaction_id = orm_execute_state.execution_options.get(ROW_OPTION)
    if not transaction_id:
        return None
    token = _IN_SESSION.set(True)
    try:
        result = orm_execute_state.invoke_statement()
    finally:
        _IN_SESSION.reset(token)
    watch_row(transaction_id, SessionWatch(orm_execute_state.session))
    return result


def _on_connection_execute(
    connection: Any, clauseelement: Any, multiparams: Any, params: Any, execution_options: Any
) -> None:
    transaction_id = execution_options.get(ROW_OPTION) if execution_options else None
    if transaction_id is None:
        transaction_id = getattr(clauseelement, "_execution_options", {}).get(ROW_OPTION)
    if transaction_id and not _IN_SESSION.get():
        watch_row(transaction_id, ConnectionWatch(connection))


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """The two listeners, once per process (SQLAlchemy keeps class-level listeners for every instance)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        event.listen(Session, "do_orm_execute", _on_session_execute)
        event.listen(Engine, "before_execute", _on_connection_execute)
        _installed = True
