"""Reports' idempotency keys in PostgreSQL (serve.yaml `state.url`): the table and its SQL, for
reef.experience.report_keys's PostgreSQL backend. A report retried through another gateway finds
the key the first one committed.

    reef_report_keys(report_id PK, scenario, content_hash, record_ids jsonb, created_at)

A key is claimed by inserting its row in a transaction that commits only once the report is durable
in the claiming gateway's store (the caller's block). Until then a concurrent claim of the same id,
through any gateway, waits on the primary key's index entry (PostgreSQL's own row lock), then finds
the committed row, or claims the id itself when the first one rolled back (an error, or its gateway
died: the server drops the connection and the transaction with it). No key is left behind by a
report that was not stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson

from reef.core.pg import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS reef_report_keys (
    report_id text PRIMARY KEY,
    scenario text NOT NULL,
    content_hash text NOT NULL,
    record_ids jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""

# (scenario, content_hash, record ids) of a stored report.
Row = tuple[str, str, list[str]]


def open_database(url: str) -> Database:
    db = Database.at(url)
    db.ensure_schema("report_keys", SCHEMA)
    return db


def find(db: Database, report_id: str) -> Row | None:
    with db.connection() as conn:
        row = conn.execute("SELECT scenario, content_hash, record_ids FROM reef_report_keys WHERE report_id = %s",
                           (report_id,)).fetchone()
    return None if row is None else (row[0], row[1], list(row[2]))


@contextmanager
def claim(db: Database, report_id: str, scenario: str, content_hash: str, record_ids: list[str],
          wait_s: float) -> Iterator[Row | None]:
    """None: the id is this call's, committed when the block ends without an exception (rolled back
    otherwise). A row: the id was another call's (stored before, or concurrently and committed while
    this one waited). Waits at most `wait_s` for a concurrent claim (lock_timeout: SQLSTATE 55P03)."""
    with db.connection() as conn, conn.transaction():
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(wait_s * 1000))}ms",))
        inserted = conn.execute(
            "INSERT INTO reef_report_keys (report_id, scenario, content_hash, record_ids) "
            "VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT (report_id) DO NOTHING RETURNING 1",
            (report_id, scenario, content_hash, orjson.dumps(record_ids).decode())).fetchone()
        if inserted is not None:
            yield None
            return
        # READ COMMITTED: this statement's snapshot holds the row the insert waited for.
        row = conn.execute("SELECT scenario, content_hash, record_ids FROM reef_report_keys WHERE report_id = %s",
                           (report_id,)).fetchone()
    yield (row[0], row[1], list(row[2]))
