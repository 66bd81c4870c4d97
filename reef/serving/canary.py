"""Canary routing: a candidate answers a share of a scenario's live traffic, and the live rewards
of its requests are compared with the head's over the same period.

The gateway assigns each request of a scenario with a running canary to an arm ("candidate" or
"head", routing.Routes.pick) and tells this module; reports for those records feed the arms'
rewards. Once both arms hold `min_reports` rewards the rule decides, once: the interval of the
candidate's mean reward minus the head's (Welch, at `confidence`) must lie entirely above
`-tolerance` to promote; otherwise the canary is aborted. One look at a fixed sample, so two equal
models promote at most (1 - confidence) / 2 of the time, not half of it.

A canary is a persisted state machine (`TRANSITIONS`), one event per transition in
`<data_dir>/releases/<scenario>/canaries.jsonl`, or, with serve.yaml's `state.url`, in PostgreSQL
(reef.core.eventlog_pg), each append checked against the log under its lock; its arms' numbers
are not written anywhere else:
after a restart they are counted again from the recorded experience (records carry the arm's
release label, reports name records), so they are exactly what is durable.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist
from typing import Literal

import polars as pl
from pydantic import BaseModel, Field

from reef.core.eventlog import EventLog, open_event_log, scenarios_with_log
from reef.core.paths import DataDir
from reef.core.statemachine import LogEvent, Transitions
from reef.experience import shards
from reef.registry.schema import canary_label
from reef.scenario.schema import CanaryConfig

Arm = Literal["candidate", "head"]
CanaryState = Literal["running", "promoting", "promoted", "aborted"]
CANARIES_FILE = "canaries.jsonl"
MACHINE = "canary"  # the log's name in PostgreSQL (reef_events.machine)

# `promoting` is written before the promote release starts; a restart finds the release on the
# chain (-> promoted) or not (-> running again, and the rule decides again).
TRANSITIONS = Transitions("canary", {
    None: {"running"},
    "running": {"promoting", "aborted"},
    "promoting": {"promoted", "aborted", "running"},
    "promoted": set(),
    "aborted": set(),
})


class ArmStats(BaseModel):
    requests: int = 0
    reports: int = 0
    score_sum: float = 0.0
    score_sq_sum: float = 0.0

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.reports if self.reports else None

    @property
    def variance(self) -> float:
        """The sample variance of the arm's rewards (0 below two reports)."""
        if self.reports < 2:
            return 0.0
        mean = self.score_sum / self.reports
        return max(0.0, (self.score_sq_sum - self.reports * mean * mean) / (self.reports - 1))

    def add(self, score: float) -> None:
        self.reports += 1
        self.score_sum += score
        self.score_sq_sum += score * score

    def public(self) -> dict[str, float | int | None]:
        return {"requests": self.requests, "reports": self.reports, "mean_score": self.mean_score}


def _arms() -> dict[str, ArmStats]:
    return {"candidate": ArmStats(), "head": ArmStats()}


class Canary(BaseModel):
    canary_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    scenario: str
    candidate_id: str
    # The routing release that split the traffic: the head arm's records carry it, and the canary runs
    # while it heads the chain (a promotion expects it as its parent).
    head_release_id: str
    fraction: float
    min_reports: int
    tolerance: float
    confidence: float = 0.95
    started_at: float
    state: CanaryState = "running"
    reason: str | None = None
    release_id: str | None = None  # the promote release, once promoted
    interval: tuple[float, float] | None = None  # the reward difference's interval, once decided
    arms: dict[str, ArmStats] = Field(default_factory=_arms)

    @property
    def label(self) -> str:
        """The release label the candidate arm's records carry."""
        return canary_label(self.scenario, self.candidate_id)

    def public(self) -> dict[str, object]:
        out = self.model_dump(exclude={"arms"})
        out["arms"] = {name: arm.public() for name, arm in self.arms.items()}
        return out

    def decide(self) -> CanaryState | None:
        """The rule's verdict once both arms have enough reports; None while it needs more."""
        cand, head = self.arms["candidate"], self.arms["head"]
        if self.state != "running" or min(cand.reports, head.reports) < self.min_reports:
            return None
        assert cand.mean_score is not None and head.mean_score is not None
        delta = cand.mean_score - head.mean_score
        half = NormalDist().inv_cdf(0.5 + self.confidence / 2) * math.sqrt(
            cand.variance / cand.reports + head.variance / head.reports)
        low, high = delta - half, delta + half
        verdict: CanaryState = "promoted" if low >= -self.tolerance else "aborted"
        self.interval = (round(low, 4), round(high, 4))
        self.reason = (f"live reward {cand.mean_score:.3f} (candidate, {cand.reports} reports) vs "
                       f"{head.mean_score:.3f} ({self.head_release_id}, {head.reports}); delta {delta:+.3f}, "
                       f"{self.confidence:.0%} CI [{low:+.3f}, {high:+.3f}] "
                       f"{'lies' if verdict == 'promoted' else 'does not lie'} above {-self.tolerance:+.3f}")
        return verdict


class CanaryEvent(LogEvent):
    canary_id: str
    state: CanaryState
    reason: str | None = None
    release_id: str | None = None
    canary: dict[str, object] | None = None  # the whole canary, on its first event


class CanaryLog:
    """A scenario's canaries as an append-only log of transitions, each checked by `TRANSITIONS`: in
    files under `data_dir`, or in PostgreSQL at `url` (None: REEF_STATE__URL, else files)."""

    def __init__(self, data_dir: Path | str, scenario: str, *, url: str | None = None, fsync: bool = True) -> None:
        self.path = DataDir(data_dir).releases(scenario) / CANARIES_FILE
        self.log: EventLog[CanaryEvent] = open_event_log(MACHINE, scenario, self.path, CanaryEvent, url=url,
                                                         fsync=fsync)

    @staticmethod
    def scenarios(data_dir: Path | str, url: str | None = None) -> list[str]:
        """The scenarios that have had a canary."""
        found = scenarios_with_log(MACHINE, url)
        if found is not None:
            return found
        return sorted(p.parent.name for p in DataDir(data_dir).releases().glob(f"*/{CANARIES_FILE}"))

    def canaries(self) -> list[Canary]:
        """Every canary of the scenario, oldest first, as of its latest event."""
        return list(_fold(self.log.events()).values())

    def last(self) -> Canary | None:
        canaries = self.canaries()
        return canaries[-1] if canaries else None

    def append(self, canary: Canary, state: CanaryState, reason: str | None = None,
               release_id: str | None = None) -> None:
        """Persist `canary`'s transition to `state` from the state the log holds for it (raises
        IllegalTransitionError), then apply it."""

        def build(events: list[CanaryEvent]) -> CanaryEvent:
            logged = _fold(events).get(canary.canary_id)
            TRANSITIONS.check(logged.state if logged else None, state, canary.canary_id)
            first = canary.model_dump(mode="json", exclude={"arms", "state"}) if logged is None else None
            return CanaryEvent(canary_id=canary.canary_id, state=state, reason=reason, release_id=release_id,
                               canary=first)

        self.log.append(build)
        canary.state, canary.reason = state, reason or canary.reason
        canary.release_id = release_id or canary.release_id


def _fold(events: list[CanaryEvent]) -> dict[str, Canary]:
    found: dict[str, Canary] = {}
    for ev in events:
        canary = found.get(ev.canary_id)
        if canary is None and ev.canary is not None:
            canary = found[ev.canary_id] = Canary.model_validate({**ev.canary, "arms": _arms()})
        if canary is not None and TRANSITIONS.allowed(canary.state if ev.canary is None else None, ev.state):
            canary.state, canary.reason = ev.state, ev.reason or canary.reason
            canary.release_id = ev.release_id or canary.release_id
    return found


def recount(data_dir: Path | str, canary: Canary) -> tuple[dict[str, ArmStats], dict[str, Arm]]:
    """Both arms' numbers since the canary started, from the recorded experience (after a restart):
    (arms, record id -> arm)."""
    data_dir = Path(data_dir)
    arms = _arms()
    by_record: dict[str, Arm] = {}
    if not shards.has_shards(data_dir, canary.scenario, "records"):
        return arms, by_record
    since = datetime.fromtimestamp(canary.started_at, UTC)
    labels = {canary.label: "candidate", canary.head_release_id: "head"}
    records = (pl.scan_parquet(shards.shard_glob(data_dir, canary.scenario, "records"))
               .filter(pl.col("release_id").is_in(list(labels)) & (pl.col("created_at") >= since))
               .select("record_id", "release_id").unique("record_id").collect())
    for record_id, release_id in records.iter_rows():
        by_record[record_id] = labels[release_id]  # type: ignore[assignment]
        arms[labels[release_id]].requests += 1
    if shards.has_shards(data_dir, canary.scenario, "reports"):
        reports = (pl.scan_parquet(shards.shard_glob(data_dir, canary.scenario, "reports"))
                   .unique("report_id").explode("record_ids")
                   .filter(pl.col("record_ids").is_in(list(by_record)))
                   .select("record_ids", "score").collect())
        for record_id, score in reports.iter_rows():
            arms[by_record[record_id]].add(float(score))
    return arms, by_record


@dataclass
class Canaries:
    """Running canaries by scenario, and which arm each of their requests went to (in memory; the
    canary controller persists their transitions)."""

    running: dict[str, Canary] = field(default_factory=dict)
    finished: dict[str, Canary] = field(default_factory=dict)
    _arms: dict[str, tuple[str, Arm]] = field(default_factory=dict)

    def new(self, scenario: str, candidate_id: str, head_release_id: str, rule: CanaryConfig,
            fraction: float | None = None) -> Canary:
        return Canary(scenario=scenario, candidate_id=candidate_id, head_release_id=head_release_id,
                      fraction=fraction if fraction is not None else rule.fraction, min_reports=rule.min_reports,
                      tolerance=rule.tolerance, confidence=rule.confidence, started_at=time.time())

    def run(self, canary: Canary, by_record: dict[str, Arm] | None = None) -> None:
        self.running[canary.scenario] = canary
        for record_id, arm in (by_record or {}).items():
            self._arms[record_id] = (canary.scenario, arm)

    def assign(self, record_id: str, scenario: str, arm: str) -> None:
        canary = self.running.get(scenario)
        if canary is None or arm not in canary.arms:
            return
        canary.arms[arm].requests += 1
        self._arms[record_id] = (scenario, arm)  # type: ignore[assignment]

    def observe(self, record_ids: list[str], score: float) -> list[str]:
        """A report's reward for its records; the scenarios whose canary can now be decided."""
        ready = []
        for record_id in record_ids:
            found = self._arms.get(record_id)
            if found is None:
                continue
            scenario, arm = found
            canary = self.running.get(scenario)
            if canary is None:
                continue
            canary.arms[arm].add(score)
            if canary.state == "running" and scenario not in ready and min(
                    a.reports for a in canary.arms.values()) >= canary.min_reports:
                ready.append(scenario)
        return ready

    def end(self, scenario: str) -> Canary | None:
        """Stop counting for the scenario's canary (already moved to a final state)."""
        canary = self.running.pop(scenario, None)
        if canary is None:
            return None
        self.finished[scenario] = canary
        self._arms = {r: v for r, v in self._arms.items() if v[0] != scenario}
        return canary

    def describe(self, scenario: str) -> dict[str, object] | None:
        canary = self.running.get(scenario) or self.finished.get(scenario)
        return canary.public() if canary else None
