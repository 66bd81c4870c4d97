"""A scenario's release chain in PostgreSQL: the backend of `reef.registry.chain_api.Chain` for
several gateways sharing one truth (serve.yaml `state: {url: postgresql://...}`).

    reef_chain_heads(scenario PK, release_id, seq)      one row per scenario: the head, and its lock
    reef_releases(scenario, seq PK, release_id UNIQUE, parent_release_id, body jsonb)

The compare-and-swap is ONE transaction: `SELECT ... FOR UPDATE` on the scenario's head row (every
publisher of the scenario, on any machine, queues there), compare it with `expected_parent`, insert
the release and move the head row, commit. A publisher that loses the race reads the winner's head
once the lock is released and raises HeadMovedError (HTTP 409); a crash before the commit leaves
nothing behind. The primary key (scenario, seq) and the parent check are a second guard: a
release can never be inserted beside another with the same seq.

Readers fetch only what is new (a chain is append-only: rows past the last seq they hold).

`head_file`, when given (a gateway's `<data_dir>/releases/<scenario>/HEAD`), is written after each
commit, as the file backend does: reef.experience.load and snapshots read it for staleness. It is
a cache: a gateway that follows another's releases (reef.serving.follow) rewrites it when it
notices the head moved.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Any

from reef.core.durable import replace_atomically
from reef.core.pg import Database, is_unique_violation
from reef.registry.artifacts import ArtifactStore
from reef.registry.chain_api import Build, Chain, HeadMovedError
from reef.registry.schema import RELEASE_ID_RE, Release, validate_scenario

HEAD_LOCK_FILE = "HEAD.lock"

SCHEMA = """
CREATE TABLE IF NOT EXISTS reef_chain_heads (
    scenario text PRIMARY KEY,
    release_id text,
    seq integer
);
CREATE TABLE IF NOT EXISTS reef_releases (
    scenario text NOT NULL REFERENCES reef_chain_heads (scenario),
    seq integer NOT NULL CHECK (seq >= 0),
    release_id text NOT NULL UNIQUE,
    parent_release_id text REFERENCES reef_releases (release_id),
    body jsonb NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scenario, seq)
);
"""


def open_database(url: str) -> Database:
    db = Database.at(url)
    db.ensure_schema("chain", SCHEMA)
    return db


def heads(db: Database) -> dict[str, str | None]:
    """Every scenario's head release id (None: a chain with no release yet), in one query: what a
    gateway polls to notice releases made through another."""
    with db.connection() as conn:
        return dict(conn.execute("SELECT scenario, release_id FROM reef_chain_heads ORDER BY scenario").fetchall())


def _seq(release_id: str) -> int:
    match = RELEASE_ID_RE.match(release_id)
    return int(match["seq"]) if match else -1


def has_chain(db: Database, scenario: str) -> bool:
    with db.connection() as conn:
        return conn.execute("SELECT 1 FROM reef_chain_heads WHERE scenario = %s AND release_id IS NOT NULL",
                            (scenario,)).fetchone() is not None


class PgChain(Chain):
    """The PostgreSQL backend of `Chain`."""

    def __init__(self, url: str, scenario: str, *, artifacts: ArtifactStore | None = None,
                 head_file: Path | None = None) -> None:
        self.scenario = validate_scenario(scenario)
        self.artifacts = artifacts
        self.head_file = head_file
        self.db = open_database(url)
        self._cache: list[Release] = []
        self._cache_lock = threading.Lock()

    @property
    def location(self) -> str:
        return f"the state database's chain of {self.scenario}"

    # --- reading -------------------------------------------------------------------------------

    def releases(self) -> list[Release]:
        with self.db.connection() as conn:
            return self._read(conn)

    def _read(self, conn: Any) -> list[Release]:
        with self._cache_lock:
            have = len(self._cache)
        rows = conn.execute(
            "SELECT body::text FROM reef_releases WHERE scenario = %s AND seq >= %s ORDER BY seq",
            (self.scenario, have)).fetchall()
        with self._cache_lock:
            for (body,) in rows:
                release = Release.model_validate_json(body)
                if release.seq < len(self._cache):
                    continue  # another thread of this object appended it meanwhile
                self._check_link(release, self._cache)
                self._cache.append(release)
            return list(self._cache)

    # --- publishing ----------------------------------------------------------------------------

    def _commit(self, expected_parent: str | None, build: Build) -> Release:
        try:
            release = self._transaction(expected_parent, build)
        except Exception as exc:
            if not is_unique_violation(exc):
                raise
            # The second guard held where the first should have (the row lock): still a lost race.
            head = self.head()
            raise HeadMovedError(self.scenario, expected_parent, head.release_id if head else None) from exc
        # Committed (the transaction's end is the commit point): now the readers' cache.
        self.write_head_file(release.release_id)
        return release

    def _transaction(self, expected_parent: str | None, build: Build) -> Release:
        with self.db.connection() as conn:
            # The head row is the lock every publisher of the scenario takes: it must exist first.
            conn.execute("INSERT INTO reef_chain_heads (scenario) VALUES (%s) ON CONFLICT DO NOTHING",
                         (self.scenario,))
            with conn.transaction():
                conn.execute("SELECT release_id FROM reef_chain_heads WHERE scenario = %s FOR UPDATE",
                             (self.scenario,))
                # Under the row lock every earlier commit is visible (READ COMMITTED: a new snapshot
                # per statement), so this is the whole chain.
                releases = self._read(conn)
                release = self._next_release(releases, expected_parent, build)
                conn.execute(
                    "INSERT INTO reef_releases (scenario, seq, release_id, parent_release_id, body) "
                    "VALUES (%s, %s, %s, %s, %s::jsonb)",
                    (self.scenario, release.seq, release.release_id, release.parent_release_id,
                     release.model_dump_json()))
                conn.execute("UPDATE reef_chain_heads SET release_id = %s, seq = %s WHERE scenario = %s",
                             (release.release_id, release.seq, self.scenario))
        return release

    def write_head_file(self, release_id: str) -> None:
        """The HEAD cache says `release_id`, unless it already names a later release: two publishers
        (or a publisher and a follower) that write after their commits never move it back."""
        if self.head_file is None:
            return
        self.head_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.head_file.with_name(HEAD_LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                have = _seq(self.head_file.read_text().strip())
            except FileNotFoundError:
                have = -1
            if _seq(release_id) > have:
                replace_atomically(self.head_file, f"{release_id}\n".encode())
        finally:
            os.close(fd)
