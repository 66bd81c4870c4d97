"""The learner's consumed ledger (issue 26 part 3), in files and in a real PostgreSQL, through the
same functions: idempotent per snapshot (the first round wins), records of another snapshot
refused with nothing written. With PostgreSQL, learners behind two gateways (here: threads and a
second process, each its own connection) marking overlapping snapshots at once never consume a
record twice, and a snapshot goes in whole or not at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reef.core.pg import STATE_URL_ENV
from reef.recipe import ledger
from tests.helpers.postgres import postgres  # noqa: F401 - the session's server

pytestmark = pytest.mark.model_free

REPO = Path(__file__).resolve().parents[1]
S = "demo"
H1, H2, H3 = ("1" * 64, "2" * 64, "3" * 64)



def test_the_backend_is_chosen_by_the_url(tmp_path: Path, backend: str) -> None:
    kind = ledger.PgLedger if backend == "postgres" else ledger.FileLedger
    assert isinstance(ledger.open_ledger(tmp_path), kind)


def test_first_round_wins_and_other_snapshots_are_refused(tmp_path: Path, backend: str) -> None:
    assert ledger.consumed(tmp_path, S).height == 0
    assert ledger.mark_consumed(tmp_path, S, H1, [], "cand-0") is None  # nothing trained on: nothing kept
    written = ledger.mark_consumed(tmp_path, S, H1, ["rec-1", "rec-2"], "cand-1")
    assert (written is not None and written.is_file()) if backend == "files" else written is None
    # The same snapshot again (a sibling candidate, a resumed round): nothing changes.
    ledger.check_unconsumed(tmp_path, S, H1, ["rec-1", "rec-2"])
    ledger.mark_consumed(tmp_path, S, H1, ["rec-1"], "cand-2")
    rows = ledger.consumed(tmp_path, S).sort("record_id")
    assert rows.columns == ["record_id", "snapshot_hash", "candidate_id", "consumed_at"]
    assert rows.select("record_id", "snapshot_hash", "candidate_id").rows() == [
        ("rec-1", H1, "cand-1"), ("rec-2", H1, "cand-1")]
    assert str(rows.schema["consumed_at"]) == "Datetime(time_unit='us', time_zone='UTC')"
    assert abs((datetime.now(UTC) - rows["consumed_at"][0]).total_seconds()) < 60
    # Another snapshot holding one of them: refused, before training and when marking, nothing written.
    with pytest.raises(ledger.ConsumedError, match=r"1 record\(s\) of snapshot 222222222222 .*111111111111"):
        ledger.check_unconsumed(tmp_path, S, H2, ["rec-2", "rec-3"])
    with pytest.raises(ledger.ConsumedError):
        ledger.mark_consumed(tmp_path, S, H2, ["rec-2", "rec-3"], "cand-3")
    assert ledger.consumed(tmp_path, S).height == 2
    # Disjoint records: a new round; another scenario's ledger is its own.
    ledger.mark_consumed(tmp_path, S, H3, ["rec-3"], "cand-4")
    ledger.mark_consumed(tmp_path, "other", H2, ["rec-2"], "cand-5")
    assert sorted(ledger.consumed(tmp_path, S)["record_id"].to_list()) == ["rec-1", "rec-2", "rec-3"]
    assert ledger.consumed(tmp_path, "other")["candidate_id"].to_list() == ["cand-5"]


def test_concurrent_rounds_never_consume_a_record_twice(tmp_path: Path, pg_url: str) -> None:
    """16 rounds at once over overlapping snapshots (round i: records i..i+3), half of them in a
    second process: every record consumed once, each snapshot whole or not at all."""
    snapshots = {f"{i:064x}": [f"rec-{j}" for j in range(i, i + 4)] for i in range(16)}
    mine = dict(list(snapshots.items())[::2])
    theirs = dict(list(snapshots.items())[1::2])
    code = textwrap.dedent(f"""
        import json, sys
        from concurrent.futures import ThreadPoolExecutor
        from reef.recipe import ledger
        snapshots = json.loads(sys.argv[1])
        sys.stdin.readline()  # go
        def one(item):
            try:
                ledger.mark_consumed({str(tmp_path)!r}, "demo", item[0], item[1], "far-" + item[0][-2:])
                return item[0]
            except ledger.ConsumedError:
                return None
        with ThreadPoolExecutor(8) as pool:
            print(json.dumps([h for h in pool.map(one, snapshots.items()) if h]), flush=True)
    """)
    other = subprocess.Popen([sys.executable, "-c", code, json.dumps(theirs)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO), STATE_URL_ENV: pg_url})
    ledger.consumed(tmp_path, S)  # the schema, and a warm connection
    go = threading.Barrier(8)

    def one(item: tuple[str, list[str]]) -> str | None:
        go.wait()
        try:
            ledger.mark_consumed(tmp_path, S, item[0], item[1], f"near-{item[0][-2:]}")
            return item[0]
        except ledger.ConsumedError:
            return None

    assert other.stdin is not None
    other.stdin.write("\n")
    other.stdin.flush()
    with ThreadPoolExecutor(8) as pool:
        won = [h for h in pool.map(one, mine.items()) if h]
    out, _ = other.communicate(timeout=120)
    won += json.loads(out)
    rows = ledger.consumed(tmp_path, S)
    assert rows["record_id"].is_unique().all()  # no record consumed twice
    assert sorted(set(rows["snapshot_hash"].to_list())) == sorted(won)
    for h in won:  # each winner whole
        assert sorted(rows.filter(rows["snapshot_hash"] == h)["record_id"].to_list()) == sorted(snapshots[h])
    assert won  # and somebody won
    # Whatever won, what is left of the records is free for a new snapshot, and only that.
    free = [r for r in (f"rec-{j}" for j in range(19)) if r not in set(rows["record_id"].to_list())]
    if free:
        ledger.check_unconsumed(tmp_path, S, "f" * 64, free)
