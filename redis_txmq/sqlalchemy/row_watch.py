"""Where the transaction log's row stands in a SQLAlchemy session or connection (``redis_txmq.core.log_rows``).

``TransactionLog.record(tx)`` marks its INSERT with an execution option; two listeners, installed once for every
session and engine of the process, see that statement run and attach a watch to the transaction:

- run by a ``Session`` (``AsyncSession`` included): the session's events say when the outermost transaction holding
  the row commits (``after_commit`` while it is the session's root) or when the transaction or savepoint holding it
  rolls back or ends without a commit (``after_soft_rollback``, ``after_transaction_end``): the COMMIT waits for the
  former, the others end it with ROLLBACK;
- run by a ``Connection`` (Core), or by a session bound to one (``Session(bind=connection)``, joined to its caller's
  transaction: its commit is not the database's): a row whose outermost transaction is still open when the block
  ends is pending (the check-back settles it: a connection has no event after its commit); a rollback of that
  transaction or of the row's savepoint rolls it back; one whose transaction has ended otherwise is left to the
  block's own outcome (a block that commits its connection, then raises, rolls the message back: end the block
  after the commit, or use a Session).
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from ..core.local_records import open_handle
from ..core.log_rows import RowState, watch_row

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

    def after_commit(self, session: Session) -> None:
        """The session's ``after_commit`` fires for a released savepoint too, and for the transactions of a session
        used again after its row's transaction ended: only the commit of the row's outermost one counts."""
        root = self._chain[-1]
        if session.get_transaction() is root and not root.is_active:
            self._finish(RowState.COMMITTED)

    def after_transaction_end(self, transaction: Any) -> None:
        """The row's outermost transaction ended without a commit seen (``close()``, a rollback): rolled back."""
        if transaction is self._chain[-1]:
            self._finish(RowState.ROLLED_BACK)

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
    """A row written through a ``Connection`` (or a session bound to one: its commit need not be the database's):
    pending while the outermost transaction it ran in is still the connection's and active; rolled back when the
    connection rolled that transaction, or the savepoint the row was written in, back; unseen once the transaction
    ended otherwise (a connection has no event after its commit: the block's outcome decides, as without a watch)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._root = connection.get_transaction()
        nested = connection.get_nested_transaction()
        self._savepoint = getattr(nested, "_savepoint", None) if nested is not None else None
        self._rolled_back = False
        if self._root is not None:
            _connection_watches(connection).append(self)

    def rolled_back(self, savepoint: str | None) -> None:
        if savepoint is None or savepoint == self._savepoint:
            self._rolled_back = True

    def state(self) -> RowState:
        if self._rolled_back:
            return RowState.ROLLED_BACK
        root = self._root
        if root is not None and root.is_active and self._connection.get_transaction() is root:
            return RowState.PENDING
        return RowState.UNSEEN

    def when_committed(self, then: Callable[[], None]) -> bool:
        return False


_CONNECTION_WATCHES: weakref.WeakKeyDictionary[Any, list[ConnectionWatch]] = weakref.WeakKeyDictionary()


def _connection_watches(connection: Any) -> list[ConnectionWatch]:
    """The watches of rows written through ``connection``, with one pair of listeners per connection for them."""
    watches = _CONNECTION_WATCHES.get(connection)
    if watches is None:
        watches = _CONNECTION_WATCHES[connection] = []

        def rollback(conn: Any) -> None:
            for watch in watches:
                if watch.state() is RowState.PENDING:
                    watch.rolled_back(None)

        def rollback_savepoint(conn: Any, name: str, context: Any) -> None:
            for watch in watches:
                watch.rolled_back(name)

        event.listen(connection, "rollback", rollback)
        event.listen(connection, "rollback_savepoint", rollback_savepoint)
    watches[:] = [watch for watch in watches if watch.state() is RowState.PENDING]
    return watches


def _watches_of(session: Session) -> list[SessionWatch]:
    """The session's pending watches (in ``session.info``), with one set of listeners per session for them all."""
    watches = session.info.get(_WATCHES_INFO)
    if watches is None:
        watches = session.info[_WATCHES_INFO] = []
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
        event.listen(session, "after_transaction_end", _after_transaction_end)
    return watches


_WATCHES_INFO = "txmq_row_watches"


def _after_commit(session: Session) -> None:
    watches = session.info.get(_WATCHES_INFO, [])
    for watch in list(watches):
        watch.after_commit(session)
    watches[:] = [watch for watch in watches if watch.state() is RowState.PENDING]


def _after_transaction_end(session: Session, transaction: Any) -> None:
    watches = session.info.get(_WATCHES_INFO, [])
    for watch in list(watches):
        watch.after_transaction_end(transaction)
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
    session = orm_execute_state.session
    if isinstance(session.bind, Connection):  # joined to a transaction of its caller's: its commit is not the end
        watch: Any = ConnectionWatch(session.bind)
    else:
        watch = SessionWatch(session)
    watch_row(transaction_id, watch, open_handle(transaction_id))
    return result


def _on_connection_execute(
    connection: Any, clauseelement: Any, multiparams: Any, params: Any, execution_options: Any, result: Any
) -> None:
    """After the statement ran: a connection that begins its transaction with it ("commit as you go") has it now."""
    transaction_id = execution_options.get(ROW_OPTION) if execution_options else None
    if transaction_id is None:
        transaction_id = getattr(clauseelement, "_execution_options", {}).get(ROW_OPTION)
    if transaction_id and not _IN_SESSION.get():
        watch_row(transaction_id, ConnectionWatch(connection), open_handle(transaction_id))


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """The two listeners, once per process (SQLAlchemy keeps class-level listeners for every instance)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        event.listen(Session, "do_orm_execute", _on_session_execute)
        event.listen(Engine, "after_execute", _on_connection_execute)
        _installed = True
