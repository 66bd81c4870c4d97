"""The learner round as a persisted state machine: one append-only, fsynced event log per
scenario, `<data_dir>/learner/<scenario>/round-events.jsonl`, every append checked by `TRANSITIONS`.

    planned -> snapshotted -> trained -> registered -> gated -> released | rejected | done
    planned | snapshotted -> abandoned (killed before training finished: nothing was consumed)
    any step before gated -> failed (an error; the round's process said why)

What each step leaves on disk decides how an interrupted round is closed (reef.learn.round.resume):
the snapshot is written before `snapshotted`; the candidate folder and the consumed ledger before
`trained` (the ledger last); registration before `registered`; the gate result before `gated`. A
round killed before `trained` consumed nothing, so it is abandoned and its records wait for the
next round; from `trained` on, its records are consumed, so it is resumed (registered, gated),
never abandoned and never trained again. `done` ends a round that was not gated here (`reef recipe
run`, `reef learn --once`) or whose selected candidate waits for a person (policy approval).

A process holds the scenario's round lock for as long as it runs a round, so a restarted learner
never resumes a round that another process is still running.

Where it lives: files under the data dir (`round-events.jsonl`, and `ROUND.LOCK`, a flock), or,
with serve.yaml's `state.url` (REEF_STATE__URL, which `reef serve` passes to its rounds), rows in
PostgreSQL (reef.core.eventlog_pg) and a session advisory lock held on a connection of its own for
the round: learners behind several gateways then never run or resume one scenario's round twice,
and each append is checked against the round's state as the log holds it, under the log's lock
(not only as this process last saw it), so a second process that lost the lock (its database
session dropped mid-round) still cannot write an illegal transition.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from reef.core.clock import utcnow
from reef.core.eventlog import EventLog, open_event_log
from reef.core.paths import DataDir
from reef.core.pg import state_url
from reef.core.statemachine import LogEvent, Transitions

RoundState = Literal["planned", "snapshotted", "trained", "registered", "gated", "released", "rejected", "done",
                     "failed", "abandoned"]
EVENTS_FILE = "round-events.jsonl"
LOCK_FILE = "ROUND.LOCK"
MACHINE = "round"  # the log's name in PostgreSQL (reef_events.machine)

TRANSITIONS = Transitions("learner round", {
    None: {"planned"},
    "planned": {"snapshotted", "failed", "abandoned"},
    "snapshotted": {"trained", "failed", "abandoned"},
    # From here the round's records are consumed: it is finished, never abandoned.
    "trained": {"registered", "done", "failed"},
    "registered": {"gated", "failed"},
    "gated": {"released", "rejected", "done"},
    "released": set(),
    "rejected": set(),
    "done": set(),
    "failed": set(),
    "abandoned": set(),
})


class RoundBusyError(RuntimeError):
    """Another process is running a round of this scenario."""


class RoundEvent(LogEvent):
    """One transition; the fields a step learned ride on the event that reports it."""

    round_id: str
    state: RoundState
    reason: str | None = None
    resumed: bool = False  # written by a later process than the one that started the round
    scenario: str | None = None
    recipe: str | None = None
    snapshot_id: str | None = None
    snapshot_hash: str | None = None
    records: int | None = None
    candidate: str | None = None  # the recipe's candidate folder id
    candidate_path: str | None = None
    candidate_id: str | None = None  # the registered candidate (content id)
    decision: str | None = None
    release_id: str | None = None

    def encode(self) -> str:
        # Most steps set a few of the fields: the others are not written (read back as None).
        return self.model_dump_json(exclude_none=True)


class Round(BaseModel):
    """A round as of its latest event (the fold of its events)."""

    round_id: str
    scenario: str
    recipe: str | None = None
    state: RoundState | None = None
    started_at: datetime
    updated_at: datetime
    reason: str | None = None
    resumed: int = 0  # transitions written by a later process
    snapshot_id: str | None = None
    snapshot_hash: str | None = None
    records: int | None = None
    candidate: str | None = None
    candidate_path: str | None = None
    candidate_id: str | None = None
    decision: str | None = None
    release_id: str | None = None

    @property
    def final(self) -> bool:
        return self.state is not None and TRANSITIONS.final(self.state)

    def apply(self, event: RoundEvent) -> None:
        self.state, self.updated_at = event.state, event.at
        if event.state == "planned":
            self.started_at = event.at
        self.resumed += event.resumed
        for key in ("reason", "recipe", "snapshot_id", "snapshot_hash", "records", "candidate", "candidate_path",
                    "candidate_id", "decision", "release_id"):
            value = getattr(event, key)
            if value is not None:
                setattr(self, key, value)

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"candidate_path"})


class RoundLog:
    """A scenario's rounds as an append-only log of transitions, each checked by `TRANSITIONS`: in
    files under `folder`, or in PostgreSQL at `url` (None: REEF_STATE__URL, else files)."""

    def __init__(self, folder: Path | str, scenario: str, *, url: str | None = None, fsync: bool = True) -> None:
        self.folder = Path(folder)
        self.scenario = scenario
        self.path = self.folder / EVENTS_FILE
        self.url = state_url(url)
        self.log: EventLog[RoundEvent] = open_event_log(MACHINE, scenario, self.path, RoundEvent, url=self.url,
                                                        fsync=fsync)
        # While lock() holds the round lock in PostgreSQL: whether its session still holds it.
        self._still_locked: Callable[[], bool] | None = None

    @classmethod
    def for_data_dir(cls, data_dir: Path | str, scenario: str, *, url: str | None = None) -> RoundLog:
        return cls(DataDir(data_dir).learner(scenario), scenario, url=url)

    def rounds(self) -> list[Round]:
        """Every round, oldest first. An event the table does not allow (never written by this code)
        is skipped, so a reader only ever sees legal histories."""
        return list(self._fold(self.log.events()).values())

    def _fold(self, events: list[RoundEvent]) -> dict[str, Round]:
        found: dict[str, Round] = {}
        for ev in events:
            rnd = found.get(ev.round_id)
            if rnd is None and ev.state == "planned":
                rnd = found[ev.round_id] = Round(round_id=ev.round_id, scenario=ev.scenario or self.scenario,
                                                 started_at=ev.at, updated_at=ev.at)
            if rnd is not None and TRANSITIONS.allowed(rnd.state, ev.state):
                rnd.apply(ev)
        return found

    def current(self) -> Round | None:
        rounds = self.rounds()
        return rounds[-1] if rounds else None

    def open_round(self) -> Round | None:
        """The latest round if it has not reached a final state (it was interrupted, or runs now)."""
        rnd = self.current()
        return rnd if rnd is not None and not rnd.final else None

    def begin(self, recipe: str) -> Round:
        now = utcnow()
        rnd = Round(round_id=uuid.uuid4().hex[:12], scenario=self.scenario, started_at=now, updated_at=now)
        self.append(rnd, "planned", scenario=self.scenario, recipe=recipe)
        return rnd

    def append(self, rnd: Round, state: RoundState, *, resumed: bool = False, **details: Any) -> Round:
        """Persist `rnd`'s transition to `state`, then apply it. IllegalTransitionError if the table
        refuses it from `rnd`'s state, or from the state the log holds for the round (another process
        moved it meanwhile)."""
        TRANSITIONS.check(rnd.state, state, rnd.round_id)
        if self._still_locked is not None and not self._still_locked():
            raise RoundBusyError(f"round {rnd.round_id} of {self.scenario} lost its lock (the state database ended "
                                 "its session): another process may run it now")
        event = RoundEvent(round_id=rnd.round_id, state=state, resumed=resumed, **details)

        def build(events: list[RoundEvent]) -> RoundEvent:
            logged = self._fold(events).get(rnd.round_id)
            TRANSITIONS.check(logged.state if logged else None, state, rnd.round_id)
            return event

        self.log.append(build)
        rnd.apply(event)
        return rnd

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Held while a process runs (or resumes) a round of this scenario; dropped when that process
        dies, however it dies (files: the kernel drops the flock; PostgreSQL: the server ends the
        lock's session)."""
        if self.url is not None:
            from reef.core.eventlog_pg import session_lock

            with session_lock(self.url, f"reef_round:{self.scenario}") as lock:
                if not lock.held:
                    raise RoundBusyError(f"another process is running a learning round of {self.scenario} "
                                         "(it holds the scenario's round lock in the state database)")
                self._still_locked = lock.still_held
                try:
                    yield
                finally:
                    self._still_locked = None
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise RoundBusyError(f"another process is running a learning round of {self.scenario} "
                                     f"(it holds {self.folder / LOCK_FILE})") from exc
            yield
        finally:
            os.close(fd)
