"""Pinned programs of the model-based tests: known defect shapes written as explicit sequences of a state machine's
steps (hypothesis' ``@example`` does not apply to a state machine). Each runs in every run of its model, whatever
the random search draws, checked as a hypothesis run checks: every invariant after each step, then the machine's
teardown (quiescence and its checks). ``tests/model_defects/`` holds the patch that re-introduces each defect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Machine(Protocol):
    def check_now(self) -> None:
        """Every invariant of the machine."""

    def teardown(self) -> None: ...

    def close(self) -> None:
        """Release what the machine holds, without its teardown's checks (after a failed step)."""


class Steps:
    """A pinned program's hold on the machine: each method it calls runs, then every invariant is checked."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.machine, name)

        def step(**arguments: Any) -> Any:
            result = method(**arguments)
            self.machine.check_now()
            return result

        return step


class Programs(dict[str, Callable[[Steps], None]]):
    """A model's pinned programs by name; ``@programs.pin`` adds one."""

    def pin(self, program: Callable[[Steps], None]) -> Callable[[Steps], None]:
        self[program.__name__] = program
        return program

    def run(self, name: str, machine: Machine) -> None:
        """Run program ``name`` on a fresh ``machine``, as hypothesis runs an example."""
        try:
            machine.check_now()
            self[name](Steps(machine))
        except BaseException:
            machine.close()
            raise
        machine.teardown()
