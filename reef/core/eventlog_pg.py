"""State machines' event logs in PostgreSQL (serve.yaml `state.url`): the PostgreSQL backend of
reef.core.eventlog, for candidates, canaries and learner rounds shared by several gateways and
learners.

    reef_events(machine, scenario, seq, body jsonb, committed_at)   PK (machine, scenario, seq)

An append is ONE transaction: `pg_advisory_xact_lock` on the (machine, scenario) log, then every
event of that log is read, the owner's `build` folds them and decides (its Transitions table), and
the event goes in at the next seq; the commit releases the lock. Every writer of the log, on any
machine, queues on that lock, and under READ COMMITTED each statement after it sees every append
committed before, so the fold is the whole history: of a person's rejection and a gate's select
racing on one candidate, the second to get the lock sees the first and is refused by the table.

Why an advisory lock: a log has no row to lock before its first event (the chain locks its head
row, which must be inserted first), and SERIALIZABLE would make every writer retry on
serialization failures that a queue avoids. The primary key is the second guard: two appends at one
seq (a writer that took no lock) cannot both commit; the loser reads again and decides again.

`session_lock` is the other kind: held for as long as a process runs a learner round (the file
backend's ROUND.LOCK flock), on a connection of its own, released when the process ends it or
PostgreSQL drops the session (the process died: its socket closes; its machine died: TCP
keepalives, set short on that session, end it within about half a minute).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from reef.core.eventlog import Build, E, EventLog
from reef.core.pg import Database, StateUnavailableError, is_unique_violation

SCHEMA = """
CREATE TABLE IF NOT EXISTS reef_events (
    machine text NOT NULL,
    scenario text NOT NULL,
    seq bigint NOT NULL CHECK (seq >= 0),
    body jsonb NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (machine, scenario, seq)
);
"""

# How often an append reads and decides again after losing its seq to a writer that took no lock.
_RETRIES = 3

# The server's keepalives on a round's lock session: a client machine that vanished without closing
# its socket loses the lock after about idle + interval * count seconds.
_KEEPALIVE = {"tcp_keepalives_idle": 10, "tcp_keepalives_interval": 5, "tcp_keepalives_count": 3}


def open_database(url: str) -> Database:
    db = Database.at(url)
    db.ensure_schema("events", SCHEMA)
    return db


def scenarios(url: str, machine: str) -> list[str]:
    with open_database(url).connection() as conn:
        rows = conn.execute("SELECT DISTINCT scenario FROM reef_events WHERE machine = %s ORDER BY 1",
                            (machine,)).fetchall()
    return [s for (s,) in rows]


class PgEventLog(EventLog[E]):
    def __init__(self, url: str, machine: str, scenario: str, model: type[E]) -> None:
        super().__init__(model)
        self.db = open_database(url)
        self.machine = machine
        self.scenario = scenario

    @property
    def location(self) -> str:
        return f"the state database's {self.machine} events of {self.scenario}"

    def events(self) -> list[E]:
        with self.db.connection() as conn:
            return self._read(conn)

    def _read(self, conn: Any) -> list[E]:
        rows = conn.execute(
            "SELECT body::text FROM reef_events WHERE machine = %s AND scenario = %s ORDER BY seq",
            (self.machine, self.scenario)).fetchall()
        return [self.model.model_validate_json(body) for (body,) in rows]

    def append(self, build: Build[E]) -> E | None:
        for attempt in range(_RETRIES):
            try:
                return self._transaction(build)
            except Exception as exc:
                if not is_unique_violation(exc) or attempt == _RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _transaction(self, build: Build[E]) -> E | None:
        with self.db.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                         (f"reef_events:{self.machine}:{self.scenario}",))
            events = self._read(conn)
            event = build(events)
            if event is not None:
                conn.execute("INSERT INTO reef_events (machine, scenario, seq, body) VALUES (%s, %s, %s, %s::jsonb)",
                             (self.machine, self.scenario, len(events), event.encode()))
        return event


class SessionLock:
    """An advisory lock held by a session of its own (`session_lock`)."""

    def __init__(self, conn: Any, held: bool) -> None:
        self._conn = conn
        self.held = held

    def still_held(self) -> bool:
        """Whether the session holding it is alive (one round trip): a session the server ended (a
        restart, a dropped connection) took the lock with it, and another process may hold it now."""
        try:
            self._conn.execute("SELECT 1")
            return self.held
        except Exception:  # noqa: BLE001 - any failure: the session, and the lock, are gone
            return False


@contextmanager
def session_lock(url: str, key: str) -> Iterator[SessionLock]:
    """Try to take the advisory lock `key` for as long as the block runs, on a connection of its own
    (never pooled: the lock belongs to the session); `.held` says whether it was granted."""
    import psycopg

    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10, prepare_threshold=None)
    except psycopg.OperationalError as exc:
        raise StateUnavailableError(f"cannot connect to the state database: {exc}") from exc
    try:
        for name, value in _KEEPALIVE.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, str(value)))
        row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()
        yield SessionLock(conn, bool(row and row[0]))
    finally:
        conn.close()  # ends the session, and with it the lock
