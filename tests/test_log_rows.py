"""What a send ends a transaction with once its local transaction is over, given where its log rows stand
(``redis_txmq.core.log_rows``), without a database: the rules the Django and SQLAlchemy watches feed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from redis_txmq.core.log_rows import RowState, after_outer_commit, settle, take_watches, watch_row
from redis_txmq.core.message import LocalTransactionState

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN


class Watch:
    def __init__(self, state: RowState, learns: bool = True) -> None:
        self.row = state
        self.learns = learns
        self.then: list[Callable[[], None]] = []

    def state(self) -> RowState:
        return self.row

    def when_committed(self, then: Callable[[], None]) -> bool:
        if self.learns:
            self.then.append(then)
        return self.learns

    def commit(self) -> None:
        self.row = RowState.COMMITTED
        for call in self.then:
            call()


@pytest.mark.parametrize(
    ("rows", "asked", "remark", "expected"),
    [
        ([], COMMIT, None, COMMIT),
        ([], ROLLBACK, "raised", ROLLBACK),
        ([RowState.COMMITTED], ROLLBACK, "the block raised ValueError", COMMIT),
        ([RowState.COMMITTED], UNKNOWN, None, COMMIT),
        ([RowState.ROLLED_BACK], COMMIT, None, ROLLBACK),
        ([RowState.ROLLED_BACK], UNKNOWN, None, ROLLBACK),
        ([RowState.ROLLED_BACK], UNKNOWN, "the block lost its database connection", UNKNOWN),
        ([RowState.UNSEEN], COMMIT, None, COMMIT),
        ([RowState.UNSEEN], UNKNOWN, None, UNKNOWN),
        ([RowState.PENDING], COMMIT, None, UNKNOWN),
        ([RowState.PENDING], ROLLBACK, "raised", UNKNOWN),
        ([RowState.ROLLED_BACK, RowState.COMMITTED], ROLLBACK, "raised", COMMIT),
        ([RowState.ROLLED_BACK, RowState.PENDING], COMMIT, None, UNKNOWN),
        ([RowState.ROLLED_BACK, RowState.ROLLED_BACK], COMMIT, None, ROLLBACK),
    ],
)
def test_the_row_decides_over_the_block(
    rows: list[RowState], asked: LocalTransactionState, remark: str | None, expected: LocalTransactionState
) -> None:
    for state in rows:
        watch_row("tx-1", Watch(state))
    settled = settle("tx-1", "orders", asked, remark)
    assert settled.state is expected
    assert bool(settled.waiting) == (RowState.PENDING in rows and RowState.COMMITTED not in rows)
    assert take_watches("tx-1") == [], "a settle takes the watches: nothing is left behind"


def test_a_pending_row_commits_once_whichever_watch_learns_first() -> None:
    first, second, deaf = Watch(RowState.PENDING), Watch(RowState.PENDING), Watch(RowState.PENDING, learns=False)
    for watch in (first, second, deaf):
        watch_row("tx-2", watch)
    settled = settle("tx-2", "orders", COMMIT, None)
    commits: list[int] = []
    assert after_outer_commit(settled.waiting, lambda: commits.append(1))
    second.commit()
    first.commit()
    assert commits == [1]


def test_a_commit_that_fails_after_the_outer_commit_does_not_raise_into_the_host() -> None:
    watch = Watch(RowState.PENDING)

    def failing() -> None:
        raise RuntimeError("the event loop is closed")

    assert after_outer_commit((watch,), failing)
    watch.commit()  # logged; the check-back publishes the message


def test_no_watch_learns_of_the_commit() -> None:
    assert not after_outer_commit((Watch(RowState.PENDING, learns=False),), lambda: None)
