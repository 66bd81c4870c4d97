"""A learner round killed with kill -9 resumes on the next start: nothing is trained twice and
nothing is lost. Real round processes (`python -m reef.learn.round`, what the server's learner runs):
one killed while it trains, one killed right after training (a crash point: the candidate is written
and its records consumed, not yet registered), then one that finishes what the second left. On both
backends of the round log, the candidates and the ledger: files under the data dir, and PostgreSQL
(REEF_STATE__URL, as `reef serve` passes it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reef.config import GateSettings
from reef.learn.pending import pending
from reef.learn.plan import RoundPlan, RoundRequest
from reef.learn.round_log import RoundLog
from reef.recipe import Snapshot, ledger
from reef.registry.candidates import CandidateRegistry
from reef.traffic.offline import record_offline_traffic
from tests.helpers.postgres import PostgresServer, postgres  # noqa: F401 - the session's server

S = "demo-add"


def _round(request_file: Path, out: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "reef.learn.round", "--request", str(request_file), "--out",
                             str(out)], env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait(what: str, until, timeout_s: float = 240.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, f"never got there: {what}"
        time.sleep(0.1)



def test_a_round_killed_mid_round_resumes_with_nothing_trained_twice_or_lost(tiny: Path, tmp_path: Path,
                                                                            backend: str) -> None:
    data = tmp_path / "data"
    record_offline_traffic(tiny, data, S, prompts=32, samples=4, seed=3)
    plan = RoundPlan(scenario=S, recipe="rft", base_model=str(tiny), experience_dir=data, data_dir=data,
                     ledger_root=data / "ledger", snapshot_dir=data / "snapshots" / S,
                     candidate_dir=data / "candidates" / S,
                     params={"kind": "lora", "max_steps": 30, "min_score": 1.0, "per_device_batch_size": 4})
    plan_file, out = tmp_path / "request.json", tmp_path / "round.json"
    plan_file.write_text(RoundRequest(plan=plan, gate=GateSettings(samples=1)).model_dump_json())
    eligible = pending(plan)["records"]
    assert eligible >= 8, "too few rewarded records to mean anything"
    log = RoundLog.for_data_dir(data, S)

    # 1. kill -9 in the train step: the snapshot is durable, the step after it (training) is running.
    first = _round(plan_file, out)
    _wait("the train step", lambda: first.poll() is not None or getattr(log.open_round(), "state", None)
          == "snapshotted")
    first.send_signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL, first.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    killed = log.open_round()
    assert killed is not None and killed.state == "snapshotted"  # killed before training finished
    in_flight = set(Snapshot.open(plan.snapshot_dir).record_ids)  # type: ignore[arg-type]
    assert len(in_flight) == eligible and ledger.consumed(data / "ledger", S).height == 0

    # 2. The next start abandons it (nothing was consumed) and trains its records in a new round,
    #    killed right after training: candidate written, records consumed, nothing registered.
    second = _round(plan_file, out, {"REEF_CRASH_AT": "round:trained"})
    assert second.wait(timeout=600) == -signal.SIGKILL, second.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    rounds = log.rounds()
    assert [(r.round_id, r.state) for r in rounds[:1]] == [(killed.round_id, "abandoned")] and rounds[0].resumed
    assert rounds[1].state == "trained" and not list((data / "candidates").glob(f".{S}.*"))  # staging cleaned
    assert set(ledger.consumed(data / "ledger", S)["record_id"]) == in_flight
    assert CandidateRegistry(data, S).list() == []

    # 3. The next start resumes that round from its last durable step: registered and gated, not retrained.
    third = _round(plan_file, out)
    assert third.wait(timeout=600) == 0, third.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    result = json.loads(out.read_text())
    assert result["round"] == rounds[1].round_id and result["resumed_from"] == "trained"
    final = log.rounds()
    assert len(final) == 2 and final[1].state in ("gated", "rejected") and final[1].candidate_id
    assert [r.state for r in final].count("trained") == 0  # no round stopped half way
    # Every record: consumed at most once, by the registered candidate, or still pending; none lost.
    consumed = ledger.consumed(data / "ledger", S)
    assert consumed["record_id"].n_unique() == consumed.height
    (view,) = CandidateRegistry(data, S).list()
    # Nothing of the shared state in files when it lives in PostgreSQL (and all of it when not).
    in_files = [(data / "learner" / S / "round-events.jsonl").is_file(),
                (data / "releases" / S / "candidates.jsonl").is_file(), (data / "ledger" / S).is_dir()]
    assert in_files == [backend == "files"] * 3
    assert view.candidate_id == final[1].candidate_id
    assert set(consumed["candidate_id"]) == {final[1].candidate}
    assert set(consumed["record_id"]) == in_flight and pending(plan)["records"] == 0
