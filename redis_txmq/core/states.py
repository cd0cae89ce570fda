"""A transaction's states and the moves between them, written once (as Kafka keeps its transaction coordinator's
states and their valid predecessors in one table).

The Lua scripts make the moves (each one script call, atomic); this table says which moves exist. It is read by the code
that resolves dead letters (``redis_txmq.ops.admin.resolve_dead_transaction`` asks it where an operator's action leads),
by the model-based protocol test (every change of a transaction's state it observes on Redis between two steps must be a
path of this table: nothing leaves COMMITTED or ROLLED_BACK) and by the docs, whose diagram "A transaction's life" is
drawn from it when the site is built.

A transaction of several messages moves each of its messages through these states; its decision record
(``lua/decide_transaction.lua``) says which way they go once one of them is decided.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(str, enum.Enum):
    """Where a transaction (or one message of a transaction of several) stands, as Redis shows it."""

    NEW = "new"
    """Not written yet: before its half message."""
    IN_FLIGHT = "in flight"
    """Its half message is written and consumers cannot see it; an UNKNOWN answer keeps it here."""
    COMMITTED = "committed"
    """Its message is in the topic stream: consumers see it. Final."""
    ROLLED_BACK = "rolled back"
    """Its half message is gone and was never visible. Final."""
    DEAD_LETTERED = "dead-lettered"
    """The checks ran out (``check_max``) with no answer: an operator decides (``txmq dead``)."""


@dataclass(frozen=True)
class Transition:
    source: State
    target: State
    by: str
    """What makes the move (the script and who calls it)."""


TRANSITIONS: tuple[Transition, ...] = (
    Transition(State.NEW, State.IN_FLIGHT, "prepare: the half message (producer)"),
    Transition(State.IN_FLIGHT, State.IN_FLIGHT, "UNKNOWN: an end or a check answer that does not decide"),
    Transition(State.IN_FLIGHT, State.COMMITTED, "end COMMIT (producer, or checker on a check answer)"),
    Transition(State.IN_FLIGHT, State.ROLLED_BACK, "end ROLLBACK (producer, or checker on a check answer)"),
    Transition(State.IN_FLIGHT, State.DEAD_LETTERED, "checks run out (checker, after check_max)"),
    Transition(State.DEAD_LETTERED, State.COMMITTED, "txmq dead commit (operator)"),
    Transition(State.DEAD_LETTERED, State.ROLLED_BACK, "txmq dead rollback (operator)"),
    Transition(State.DEAD_LETTERED, State.IN_FLIGHT, "txmq dead recheck (operator): checked again"),
)
"""Every move a transaction can make; nothing else is one."""

FINAL = frozenset(state for state in State if not any(t.source is state for t in TRANSITIONS))
"""The states no move leaves: a committed message stays published, a rolled-back one stays unseen."""


def moves_from(source: State) -> tuple[Transition, ...]:
    return tuple(t for t in TRANSITIONS if t.source is source)


def reachable(source: State) -> frozenset[State]:
    """The states a transaction in ``source`` can be in later, by any number of moves (``source`` included)."""
    found, todo = {source}, [source]
    while todo:
        for move in moves_from(todo.pop()):
            if move.target not in found:
                found.add(move.target)
                todo.append(move.target)
    return frozenset(found)


def move(source: State, target: State) -> Transition:
    """The move from ``source`` to ``target``; ValueError when the table has none (a caller's bug, not a user's)."""
    for candidate in moves_from(source):
        if candidate.target is target:
            return candidate
    raise ValueError(f"a transaction does not move from {source.value} to {target.value}")
