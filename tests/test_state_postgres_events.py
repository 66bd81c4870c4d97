"""Candidates and learner rounds shared by several gateways and learners (issue 26 part 3): writers
in two processes (threads in each, every one its own connection) racing illegal transitions on one
candidate -> exactly one wins, on both backends; a scenario's round lock held across processes in
PostgreSQL, dropped when its holder is killed, and a round that lost it writes nothing more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reef.learn.round_log import RoundBusyError, RoundLog
from reef.registry.candidates import CandidateEvent, CandidateRegistry, CandidateStateError, GateResult
from tests.helpers.postgres import postgres  # noqa: F401 - the session's server

pytestmark = pytest.mark.model_free

REPO = Path(__file__).resolve().parents[1]
S = "support"
CID = "e" * 64
WORKERS = 8  # threads per process

# The other process: for each line it reads, WORKERS threads try that attempt at once; it prints
# how many of them the register accepted.
OTHER = textwrap.dedent("""
    import json, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    from reef.registry.candidates import CandidateEvent, CandidateRegistry, CandidateStateError
    data, cid, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    REGISTERED = {"kind": "lora", "created_at": "2026-01-01T00:00:00+00:00"}
    for line in sys.stdin:
        attempt = line.strip()
        go = threading.Barrier(workers)
        def one(i):
            registry = CandidateRegistry(data, "support", fsync=False)
            go.wait()
            try:
                if attempt == "register":
                    registry._append(CandidateEvent(candidate_id=cid, event="registered", data=REGISTERED))
                elif i % 2:
                    registry.reject(cid, "far", by="bob")
                else:
                    registry.mark_released(cid, "support@r9", by="far")
                return 1
            except CandidateStateError:
                return 0
        with ThreadPoolExecutor(workers) as pool:
            print(json.dumps(sum(pool.map(one, range(workers)))), flush=True)
""")



def test_racing_transitions_on_one_candidate_one_wins(tmp_path: Path, backend: str) -> None:
    """16 writers over two processes: registering one candidate, then a person's rejection against
    its release (both final from selected): each time exactly one is accepted."""
    other = subprocess.Popen([sys.executable, "-c", OTHER, str(tmp_path), CID, str(WORKERS)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert other.stdin is not None and other.stdout is not None
    CandidateRegistry(tmp_path, S).list()  # the schema, and a warm connection

    def race(attempt: str, near: Callable[[CandidateRegistry, int], object]) -> int:
        go = threading.Barrier(WORKERS)

        def one(i: int) -> int:
            registry = CandidateRegistry(tmp_path, S, fsync=False)
            go.wait()
            try:
                near(registry, i)
                return 1
            except CandidateStateError:
                return 0

        other.stdin.write(attempt + "\n")  # type: ignore[union-attr]
        other.stdin.flush()  # type: ignore[union-attr]
        with ThreadPoolExecutor(WORKERS) as pool:
            won = sum(pool.map(one, range(WORKERS)))
        return won + int(json.loads(other.stdout.readline()))  # type: ignore[union-attr]

    try:
        registered = CandidateEvent(candidate_id=CID, event="registered",
                                    data={"kind": "lora", "created_at": "2026-01-01T00:00:00+00:00"})
        assert race("register", lambda r, i: r._append(registered)) == 1
        registry = CandidateRegistry(tmp_path, S)
        registry.record_gate(CID, GateResult(decision="select", reason="test", head_release_id=f"{S}@r0"))
        assert race("final", lambda r, i: r.reject(CID, "near", by="alice") if i % 2
                    else r.mark_released(CID, f"{S}@r8", by="near")) == 1
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    events = registry.events()
    assert [e.event for e in events] == ["registered", "evaluated", events[-1].event]
    view = registry.get(CID)
    assert view.status == {"rejected": "rejected", "released": "released"}[events[-1].event]
    assert (view.rejected_by or view.release_id) in ("alice", "bob", f"{S}@r8", f"{S}@r9")


def test_a_round_lock_in_postgres_spans_processes_and_dies_with_its_holder(tmp_path: Path, pg_url: str) -> None:
    """What keeps two learners (behind two gateways) from running one scenario's round at once."""
    code = textwrap.dedent(f"""
        import sys
        from reef.learn.round_log import RoundLog
        with RoundLog.for_data_dir({str(tmp_path)!r}, {S!r}).lock():
            print("held", flush=True)
            sys.stdin.readline()  # held until killed
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        log = RoundLog.for_data_dir(tmp_path / "elsewhere", S)  # another machine's data dir: one lock still
        with pytest.raises(RoundBusyError, match="round lock in the state database"), log.lock():
            pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        deadline = time.monotonic() + 30
        while True:  # the server ends the dead session's lock once it sees the socket closed
            try:
                with log.lock():
                    break
            except RoundBusyError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_round_that_lost_its_lock_writes_nothing_more(tmp_path: Path, pg_url: str) -> None:
    """The database ended the lock's session mid-round (a restart, a proxy): another learner may take
    the round over, so this one's next transition is refused before it is written."""
    import psycopg

    log = RoundLog.for_data_dir(tmp_path, S)
    with log.lock():
        rnd = log.begin("rft")
        with psycopg.connect(pg_url, autocommit=True) as admin:
            (ended,) = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_locks "
                                     "WHERE locktype = 'advisory' AND granted AND database = "
                                     "(SELECT oid FROM pg_database WHERE datname = current_database())").fetchone()  # type: ignore[misc]
        assert ended == 1
        with pytest.raises(RoundBusyError, match="lost its lock"):
            log.append(rnd, "snapshotted")
        with RoundLog.for_data_dir(tmp_path, S).lock():  # free for the next learner
            pass
    assert [r.state for r in log.rounds()] == ["planned"]
