"""PostgreSQL, where several gateways share state (serve.yaml `state.url`): connections and schema.

One `Database` per URL and process (`Database.at(url)`): a small pool of connections (psycopg 3,
the optional `postgres` extra) that threads borrow for one statement or one transaction, and the
tables each backend declares, created once under an advisory lock (concurrent `CREATE TABLE IF NOT
EXISTS` can otherwise fail on a unique index of the catalog). A backend module (e.g.
reef.registry.chain_pg) owns its tables' DDL and SQL; this module knows none of them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import psycopg
except ImportError as exc:  # the optional `postgres` extra: only `state.url` needs it
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

# A pooled connection idle longer than this is checked before it is lent: one round trip, instead of
# failing the caller's statement on a connection the server closed meanwhile.
CHECK_IDLE_S = 5.0

# pg_advisory_xact_lock key for schema changes: "reef" in ASCII.
_SCHEMA_LOCK = 0x72656566

# The environment's form of serve.yaml `state.url` (the config's own env layer): `reef serve` sets it
# for the processes it starts (rounds, the gate), so a reader given only a data dir finds the state.
STATE_URL_ENV = "REEF_STATE__URL"


def state_url(url: str | None = None) -> str | None:
    """`url`, else REEF_STATE__URL; None: the state lives in files under the data dir."""
    return url or os.environ.get(STATE_URL_ENV) or None


class StateUnavailableError(RuntimeError):
    """PostgreSQL cannot be used: the extra is missing or the server refuses the connection."""


def is_unique_violation(exc: BaseException) -> bool:
    """A constraint said a row with that key is there already (SQLSTATE 23505)."""
    return getattr(exc, "sqlstate", None) == "23505"


def is_lock_timeout(exc: BaseException) -> bool:
    """A lock was not granted within the transaction's `lock_timeout` (SQLSTATE 55P03)."""
    return getattr(exc, "sqlstate", None) == "55P03"


def _alive(conn: Any) -> bool:
    try:
        conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


class Database:
    _by_url: dict[tuple[str, int], Database] = {}
    _by_url_guard = threading.Lock()

    def __init__(self, url: str, *, max_idle: int = 8, connect_timeout_s: float = 10.0) -> None:
        if _MISSING is not None:
            raise StateUnavailableError("state.url needs psycopg 3: pip install 'reef[postgres]'") from _MISSING
        self.url = url
        self.max_idle = max_idle
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[tuple[Any, float]] = []  # (connection, when it was handed back)
        self._lock = threading.Lock()
        self._schemas: set[str] = set()

    @classmethod
    def at(cls, url: str) -> Database:
        """The process's one Database for `url` (chains of every scenario share its connections).
        Keyed by process too: a forked child must not talk on its parent's sockets."""
        with cls._by_url_guard:
            key = (url, os.getpid())
            db = cls._by_url.get(key)
            if db is None:
                db = cls._by_url[key] = cls(url)
            return db

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection in autocommit mode: each statement commits, unless run inside
        `with conn.transaction():`. Returned to the pool unless it broke."""
        with self._lock:
            conn, since = self._idle.pop() if self._idle else (None, 0.0)
        if conn is not None and time.monotonic() - since > CHECK_IDLE_S and not _alive(conn):
            conn.close()  # the server restarted or a proxy dropped it while it idled
        if conn is None or conn.closed:
            try:
                # No server-side prepared statements: they break behind a transaction-pooling proxy
                # (pgbouncer before 1.21, most managed poolers), and these queries are few and cheap.
                conn = psycopg.connect(self.url, autocommit=True, connect_timeout=int(self.connect_timeout_s),
                                       prepare_threshold=None)
            except psycopg.OperationalError as exc:
                raise StateUnavailableError(f"cannot connect to the state database: {exc}") from exc
        try:
            yield conn
        except psycopg.OperationalError as exc:
            if not is_lock_timeout(exc):  # the server went away mid-use
                conn.close()
                raise StateUnavailableError(f"the state database: {exc}") from exc
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.close()
            raise  # the caller's own limit (SET lock_timeout): the server is fine
        except BaseException:
            # A connection left mid-transaction or broken by the server is not handed on.
            if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.close()
            raise
        finally:
            if not conn.closed:
                with self._lock:
                    if len(self._idle) < self.max_idle:
                        self._idle.append((conn, time.monotonic()))
                        conn = None
                if conn is not None:
                    conn.close()

    def ensure_schema(self, name: str, ddl: str) -> None:
        """Run `ddl` (idempotent statements) once per process for `name`, serialized across
        processes and machines."""
        if name in self._schemas:
            return
        with self.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(ddl)
        self._schemas.add(name)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()
