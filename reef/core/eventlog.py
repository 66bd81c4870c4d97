"""Where a persisted state machine's events live (candidates, canaries, learner rounds): one
append-only log per machine and scenario, every append decided under a lock that every writer of
that log takes, on any machine. Two backends, chosen here only (`open_event_log`):

    FileEventLog   <path>.jsonl, appended and fsynced under a flock (the embedded default: one
                   machine, one gateway)
    PgEventLog     rows of reef_events in PostgreSQL at serve.yaml's `state.url`, each append one
                   transaction (reef.core.eventlog_pg: several gateways and learners)

A backend stores events and nothing else. What an event may be is decided by the log's owner
(its `Transitions` table and its fold, e.g. reef.registry.candidates), through `append(build)`:
`build` gets every event so far, read under the lock, and returns the event to append (None: none)
or raises to refuse it. So the same fold and the same check run whatever stores the log, and two
writers can never both append after the same history.
"""

from __future__ import annotations

import fcntl
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Generic, TypeVar

from reef.core.durable import append_line, read_log
from reef.core.pg import state_url
from reef.core.statemachine import LogEvent

E = TypeVar("E", bound=LogEvent)

# The event to append given the log so far (read under the lock); None: append nothing.
Build = Callable[[list[E]], E | None]


class EventLog(ABC, Generic[E]):
    """One state machine's events of one scenario, oldest first."""

    def __init__(self, model: type[E]) -> None:
        self.model = model

    @abstractmethod
    def events(self) -> list[E]:
        """Every event appended so far."""

    @abstractmethod
    def append(self, build: Build[E]) -> E | None:
        """Atomically with respect to every other writer of this log, on any machine: read every
        event, `build(events)`, append what it returns; durable when this returns. An exception from
        `build` propagates with nothing written."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the log lives, for messages."""


class FileEventLog(EventLog[E]):
    """A jsonl file, appended under a flock on `lock_path` (default: beside it, `<name>.lock`)."""

    def __init__(self, path: Path | str, model: type[E], *, lock_path: Path | str | None = None,
                 fsync: bool = True) -> None:
        super().__init__(model)
        self.path = Path(path)
        self.lock_path = Path(lock_path) if lock_path is not None else self.path.with_suffix(".lock")
        self.fsync = fsync

    @property
    def location(self) -> str:
        return str(self.path)

    def events(self) -> list[E]:
        return read_log(self.path, self.model.model_validate_json)

    def append(self, build: Build[E]) -> E | None:
        with self._locked():
            event = build(self.events())
            if event is not None:
                append_line(self.path, event.encode().encode() + b"\n", fsync=self.fsync)
            return event

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def open_event_log(machine: str, scenario: str, path: Path | str, model: type[E], *, url: str | None = None,
                   lock_path: Path | str | None = None, fsync: bool = True) -> EventLog[E]:
    """`machine`'s log of `scenario` in PostgreSQL at `url` (None: REEF_STATE__URL), else the file
    `path`."""
    url = state_url(url)
    if url is None:
        return FileEventLog(path, model, lock_path=lock_path, fsync=fsync)
    from reef.core.eventlog_pg import PgEventLog  # psycopg only where state.url is set

    return PgEventLog(url, machine, scenario, model)


def scenarios_with_log(machine: str, url: str | None = None) -> list[str] | None:
    """The scenarios that have `machine` events in PostgreSQL at `url` (None: REEF_STATE__URL);
    None when the logs are files (the caller looks for them under its data dir)."""
    url = state_url(url)
    if url is None:
        return None
    from reef.core.eventlog_pg import scenarios

    return scenarios(url, machine)
