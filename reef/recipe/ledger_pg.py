"""The consumed ledger in PostgreSQL (serve.yaml `state.url`): the table and its SQL, for
reef.recipe.ledger's PostgreSQL backend. Learners behind several gateways share one ledger, so no
two rounds, wherever they run, consume the same record.

    reef_consumed(scenario, record_id, snapshot_hash, candidate_id, consumed_at)   PK (scenario, record_id)

A round's records go in as ONE transaction under the scenario's advisory lock: the snapshot already
there (the first round wins: nothing is written), or any of its records consumed by another snapshot
(nothing is written: the caller raises), or every record inserted at once. The primary key is the
second guard: a record can never be held by two snapshots.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reef.core.pg import Database, is_unique_violation

SCHEMA = """
CREATE TABLE IF NOT EXISTS reef_consumed (
    scenario text NOT NULL,
    record_id text NOT NULL,
    snapshot_hash text NOT NULL,
    candidate_id text NOT NULL,
    consumed_at timestamptz NOT NULL,
    PRIMARY KEY (scenario, record_id)
);
CREATE INDEX IF NOT EXISTS reef_consumed_snapshot ON reef_consumed (scenario, snapshot_hash);
"""

# (record_id, snapshot_hash, candidate_id, consumed_at)
Row = tuple[str, str, str, datetime]


def open_database(url: str) -> Database:
    db = Database.at(url)
    db.ensure_schema("ledger", SCHEMA)
    return db


def consumed(db: Database, scenario: str) -> list[Row]:
    with db.connection() as conn:
        return list(conn.execute(
            "SELECT record_id, snapshot_hash, candidate_id, consumed_at FROM reef_consumed WHERE scenario = %s "
            "ORDER BY consumed_at, record_id", (scenario,)).fetchall())


def taken(db: Database, scenario: str, snapshot_hash: str, record_ids: list[str]) -> list[str]:
    """Of `record_ids`, the snapshot hashes (other than `snapshot_hash`) that consumed some."""
    with db.connection() as conn:
        return _taken(conn, scenario, snapshot_hash, record_ids)


def _taken(conn: Any, scenario: str, snapshot_hash: str, record_ids: list[str]) -> list[str]:
    rows = conn.execute(
        "SELECT DISTINCT snapshot_hash FROM reef_consumed WHERE scenario = %s AND record_id = ANY(%s) "
        "AND snapshot_hash <> %s ORDER BY 1", (scenario, record_ids, snapshot_hash)).fetchall()
    return [h for (h,) in rows]


def mark(db: Database, scenario: str, snapshot_hash: str, record_ids: list[str], candidate_id: str,
         now: datetime) -> list[str]:
    """Consume `record_ids` for the snapshot, in one transaction. Returns the other snapshots that
    hold some of them ([] when this call wrote them, or the snapshot was there already)."""
    ids = list(dict.fromkeys(record_ids))
    try:
        with db.connection() as conn, conn.transaction():
            # Every round of the scenario, on any machine, queues here (released at commit).
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"reef_consumed:{scenario}",))
            if conn.execute("SELECT 1 FROM reef_consumed WHERE scenario = %s AND snapshot_hash = %s LIMIT 1",
                            (scenario, snapshot_hash)).fetchone() is not None:
                return []  # this snapshot's round was recorded: the first one wins
            others = _taken(conn, scenario, snapshot_hash, ids)
            if others:
                return others
            with conn.cursor().copy("COPY reef_consumed (scenario, record_id, snapshot_hash, candidate_id, "
                                    "consumed_at) FROM STDIN") as copy:
                for record_id in ids:
                    copy.write_row((scenario, record_id, snapshot_hash, candidate_id, now))
    except Exception as exc:
        if not is_unique_violation(exc):
            raise
        # The key held where the lock should have (a writer that took no lock): still a conflict.
        return taken(db, scenario, snapshot_hash, ids) or ["(unknown)"]
    return []
