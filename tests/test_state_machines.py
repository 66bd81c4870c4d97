"""The persisted state machines: candidate (register), canary (rule and log), learner round, their
transition tables. The logs' tests run on both backends: files under the data dir, and a real
PostgreSQL (`state.url`, here REEF_STATE__URL) with a fresh database per test."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from reef.core.eventlog import EventLog, FileEventLog
from reef.core.eventlog_pg import PgEventLog
from reef.core.statemachine import IllegalTransitionError, LogEvent, Transitions
from reef.registry.candidates import (
    TRANSITIONS,
    CandidateEvent,
    CandidateRegistry,
    CandidateStateError,
    GateResult,
)
from reef.serving.canary import Canary, CanaryLog
from tests.helpers.postgres import PostgresServer, postgres  # noqa: F401 - the session's server

pytestmark = pytest.mark.model_free

SCENARIO = "support"
CID = "c" * 64



def _force(log: EventLog, event: LogEvent) -> None:
    """Append `event` with no check: what older code (or a hand edit) could have left in a log."""
    if isinstance(log, FileEventLog):
        with log.path.open("ab") as f:
            f.write(event.model_dump_json().encode() + b"\n")
        return
    assert isinstance(log, PgEventLog)
    with log.db.connection() as conn:
        conn.execute("INSERT INTO reef_events (machine, scenario, seq, body) SELECT %s, %s, count(*), %s::jsonb "
                     "FROM reef_events WHERE machine = %s AND scenario = %s",
                     (log.machine, log.scenario, event.model_dump_json(), log.machine, log.scenario))


def _registry(tmp_path: Path) -> CandidateRegistry:
    registry = CandidateRegistry(tmp_path, SCENARIO, fsync=False)
    # A candidate without an artifact: the state machine is what is tested.
    registry._append(CandidateEvent(candidate_id=CID, event="registered",
                                    data={"kind": "lora", "created_at": "2026-01-01T00:00:00+00:00"}))
    return registry


def _gate(decision: str) -> GateResult:
    return GateResult(decision=decision, reason="test", head_release_id=f"{SCENARIO}@r0")  # type: ignore[arg-type]


def test_the_backend_is_chosen_by_the_url(tmp_path: Path, backend: str) -> None:
    from reef.learn.round_log import RoundLog

    kind = PgEventLog if backend == "postgres" else FileEventLog
    assert isinstance(CandidateRegistry(tmp_path, SCENARIO).log, kind)
    assert isinstance(CanaryLog(tmp_path, SCENARIO).log, kind)
    assert isinstance(RoundLog.for_data_dir(tmp_path, SCENARIO).log, kind)
    assert not (tmp_path / "releases").exists()  # nothing written by opening them


def test_a_released_candidate_stays_released(tmp_path: Path, backend: str) -> None:
    registry = _registry(tmp_path)
    assert registry.record_gate(CID, _gate("select")).status == "selected"
    registry.mark_released(CID, f"{SCENARIO}@r1")
    before = registry.events()
    with pytest.raises(CandidateStateError, match="from released to selected"):
        registry.record_gate(CID, _gate("select"))
    with pytest.raises(CandidateStateError, match="from released to gate_rejected"):
        registry.record_gate(CID, _gate("reject"))
    with pytest.raises(CandidateStateError):
        registry.reject(CID, "too late")
    with pytest.raises(CandidateStateError):
        registry.mark_released(CID, f"{SCENARIO}@r2")
    assert registry.events() == before  # nothing refused was appended
    assert (registry.path.is_file()) == (backend == "files")
    assert CandidateRegistry.scenarios(tmp_path) == [SCENARIO]
    view = registry.get(CID)
    assert (view.status, view.release_id) == ("released", f"{SCENARIO}@r1")


def test_regate_after_a_gate_rejection_but_not_after_a_person(tmp_path: Path, backend: str) -> None:
    registry = _registry(tmp_path)
    with pytest.raises(CandidateStateError, match="from registered to released"):
        registry.mark_released(CID, f"{SCENARIO}@r1")  # never released without the gate's selection
    assert registry.record_gate(CID, _gate("reject")).status == "rejected"
    assert registry.record_gate(CID, _gate("select")).status == "selected"  # e.g. the eval suite was fixed
    assert registry.reject(CID, "too risky", by="alice").status == "rejected"
    with pytest.raises(CandidateStateError, match="from rejected to selected"):
        registry.record_gate(CID, _gate("select"))
    assert registry.get(CID).reject_reason == "too risky"


def test_an_old_log_with_an_illegal_event_folds_through_the_table(tmp_path: Path, backend: str) -> None:
    """A log written before transitions were checked: `evaluated` after `released` no longer flips it back."""
    registry = _registry(tmp_path)
    registry.record_gate(CID, _gate("select"))
    registry.mark_released(CID, f"{SCENARIO}@r1")
    late = CandidateEvent(candidate_id=CID, event="evaluated", data=_gate("reject").model_dump(mode="json"))
    _force(registry.log, late)  # what the old code appended without a check
    assert registry.get(CID).status == "released"


def test_transition_table_is_explicit() -> None:
    assert TRANSITIONS.final("released") and TRANSITIONS.final("rejected")
    assert not TRANSITIONS.final("gate_rejected")
    table = Transitions("thing", {None: {"a"}, "a": {"b"}})
    table.check(None, "a")
    with pytest.raises(IllegalTransitionError, match="thing x cannot go from b to a"):
        table.check("b", "a", "x")




# --- canary -------------------------------------------------------------------------------------


def _canary(min_reports: int = 30, tolerance: float = 0.0) -> Canary:
    return Canary(scenario=SCENARIO, candidate_id=CID, head_release_id=f"{SCENARIO}@r0", fraction=0.5,
                  min_reports=min_reports, tolerance=tolerance, started_at=0.0)


def _promote_rate(p_candidate: float, p_head: float, trials: int = 2000, seed: int = 0) -> float:
    """Share of canaries promoted when each arm's rewards are 0/1 with these success rates."""
    rng = random.Random(seed)
    promoted = 0
    for _ in range(trials):
        canary = _canary()
        for arm, p in (("candidate", p_candidate), ("head", p_head)):
            for _ in range(canary.min_reports):
                canary.arms[arm].add(float(rng.random() < p))
        verdict = canary.decide()
        assert verdict in ("promoted", "aborted")
        promoted += verdict == "promoted"
    return promoted / trials


def test_equal_arms_rarely_promote_and_a_better_candidate_does() -> None:
    """The old rule (candidate mean >= head mean) promoted equal models about half the time."""
    equal = _promote_rate(0.5, 0.5)
    assert equal < 0.05, equal  # one look at a 95 % interval: about 2.5 %
    assert _promote_rate(0.9, 0.4) > 0.95
    assert _promote_rate(0.4, 0.6) < 0.01


def test_the_rule_waits_for_both_arms_and_names_its_interval() -> None:
    canary = _canary(min_reports=3)
    for score in (1.0, 1.0, 1.0):
        canary.arms["candidate"].add(score)
    assert canary.decide() is None  # the head has no reports yet
    for score in (0.0, 1.0, 1.0):
        canary.arms["head"].add(score)
    assert canary.decide() == "aborted"  # +0.333, but on 3 reports the interval reaches below 0
    assert canary.interval is not None and canary.interval[0] < 0 < canary.interval[1]
    assert "live reward" in (canary.reason or "") and "CI" in (canary.reason or "")


def test_canary_log_checks_and_persists_transitions(tmp_path: Path, backend: str) -> None:
    log = CanaryLog(tmp_path, SCENARIO)
    canary = _canary()
    log.append(canary, "running")
    log.append(canary, "promoting", "better")
    with pytest.raises(IllegalTransitionError, match="from promoting to promoting"):
        log.append(canary, "promoting")
    log.append(canary, "running", "resumed")  # a restart that found no promote release
    log.append(canary, "aborted", "stopped by a person")
    with pytest.raises(IllegalTransitionError, match="from aborted to promoted"):
        log.append(canary, "promoted", release_id=f"{SCENARIO}@r1")
    second = _canary()
    log.append(second, "running")
    found = CanaryLog(tmp_path, SCENARIO).canaries()  # a new reader: what a restarted server sees
    assert [(c.canary_id, c.state) for c in found] == [(canary.canary_id, "aborted"), (second.canary_id, "running")]
    assert found[0].reason == "stopped by a person" and found[1].min_reports == 30
    assert CanaryLog(tmp_path, SCENARIO).last().canary_id == second.canary_id  # type: ignore[union-attr]
    # A stale copy of a canary (another gateway moved it on) is judged by the log, not by itself.
    stale = found[1].model_copy()
    log.append(found[1], "aborted", "stopped on another gateway")
    with pytest.raises(IllegalTransitionError, match="from aborted to promoting"):
        log.append(stale, "promoting")
    assert CanaryLog.scenarios(tmp_path) == [SCENARIO]


# --- learner round ------------------------------------------------------------------------------


def test_round_log_checks_and_persists_transitions(tmp_path: Path, backend: str) -> None:
    from reef.learn.round_log import TRANSITIONS as ROUNDS
    from reef.learn.round_log import RoundEvent, RoundLog

    # Once its records are consumed (trained) a round is finished, never abandoned.
    assert ROUNDS.allowed("snapshotted", "abandoned") and not ROUNDS.allowed("trained", "abandoned")
    assert all(ROUNDS.final(s) for s in ("released", "rejected", "done", "failed", "abandoned"))
    log = RoundLog(tmp_path, SCENARIO, fsync=False)
    rnd = log.begin("rft")
    log.append(rnd, "snapshotted", snapshot_hash="h" * 64, records=3)
    assert log.open_round() == rnd
    with pytest.raises(IllegalTransitionError, match="learner round .* cannot go from snapshotted to gated"):
        log.append(rnd, "gated")
    log.append(rnd, "trained", candidate="c1", candidate_path="/x")
    log.append(rnd, "done", reason="not gated")
    # A line the table forbids (hand-edited, or from older code) is skipped by the fold.
    _force(log.log, RoundEvent(round_id=rnd.round_id, state="planned"))
    again = RoundLog(tmp_path, SCENARIO).current()
    assert again is not None and (again.state, again.records, again.candidate) == ("done", 3, "c1")
    assert log.open_round() is None
    # A process whose copy of the round is stale (another one moved it on) is refused by the log.
    other = RoundLog(tmp_path, SCENARIO).begin("rft")
    stale = other.model_copy()
    log.append(other, "abandoned", reason="killed")
    with pytest.raises(IllegalTransitionError, match="from abandoned to snapshotted"):
        log.append(stale, "snapshotted")


def test_one_process_runs_a_scenario_round_at_a_time(tmp_path: Path, backend: str) -> None:
    from reef.learn.round_log import RoundBusyError, RoundLog

    first, second = RoundLog.for_data_dir(tmp_path, SCENARIO), RoundLog.for_data_dir(tmp_path, SCENARIO)
    with first.lock():
        with pytest.raises(RoundBusyError, match="another process is running"), second.lock():
            pass
        with RoundLog.for_data_dir(tmp_path, "other").lock():  # another scenario's round is its own
            pass
    with second.lock():  # released with the block
        pass
