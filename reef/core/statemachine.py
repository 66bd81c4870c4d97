"""Explicit transition tables for Reef's persisted state machines (candidates, canaries, learner
rounds). Each is an append-only event log; every append is checked against its table first, so a
log can only ever hold legal histories, and a reader folds it with the same table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field


class LogEvent(BaseModel):
    """One line of a state machine's event log: no unknown fields, stamped when it was appended.
    Each log adds its subject's id and the transition's own fields."""

    model_config = ConfigDict(extra="forbid")

    at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    def encode(self) -> str:
        """The event as its log stores it (a jsonl line, a jsonb row)."""
        return self.model_dump_json()


class IllegalTransitionError(RuntimeError):
    """An event that the state machine does not allow from the current state."""


class Transitions:
    """`table[state]` is the set of states reachable from it; `None` is "does not exist yet"."""

    def __init__(self, name: str, table: Mapping[str | None, Iterable[str]]) -> None:
        self.name = name
        self.table = {state: frozenset(nexts) for state, nexts in table.items()}

    def allowed(self, current: str | None, new: str) -> bool:
        return new in self.table.get(current, frozenset())

    def check(self, current: str | None, new: str, what: str = "") -> None:
        if not self.allowed(current, new):
            nexts = sorted(self.table.get(current, frozenset())) or ["nothing (final)"]
            subject = f"{self.name} {what}".strip()
            raise IllegalTransitionError(f"{subject} cannot go from {current or 'nothing'} to {new}; "
                                         f"from {current or 'nothing'} it can go to {', '.join(nexts)}")

    def final(self, state: str) -> bool:
        return not self.table.get(state)
