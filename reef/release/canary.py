"""Canary routing: a candidate answers a share of a scenario's live traffic, and the live rewards
of its requests are compared with the head's over the same period.

The gateway assigns each request of a scenario with a running canary to an arm ("candidate" or
"head", routing.Routes.pick) and tells this module; reports for those records feed the arms'
rewards. Once both arms hold `min_reports` rewards the rule decides: promote when the candidate's
mean reward is at least the head's minus `tolerance`, else abort. The publisher carries out the
decision (a `promote` release, or dropping the split).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from reef.scenario.schema import CanaryConfig

Arm = Literal["candidate", "head"]
CanaryState = Literal["running", "promoted", "aborted"]


class ArmStats(BaseModel):
    requests: int = 0
    reports: int = 0
    score_sum: float = 0.0

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.reports if self.reports else None

    def public(self) -> dict[str, float | int | None]:
        return {"requests": self.requests, "reports": self.reports, "mean_score": self.mean_score}


class Canary(BaseModel):
    scenario: str
    candidate_id: str
    head_release_id: str
    fraction: float
    min_reports: int
    tolerance: float
    started_at: float
    state: CanaryState = "running"
    reason: str | None = None
    release_id: str | None = None  # the promote release, once promoted
    arms: dict[str, ArmStats]

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
        verdict: CanaryState = "promoted" if delta >= -self.tolerance else "aborted"
        self.reason = (f"live reward {cand.mean_score:.3f} (candidate, {cand.reports} reports) vs "
                       f"{head.mean_score:.3f} ({self.head_release_id}, {head.reports}); delta {delta:+.3f} "
                       f"{'>=' if verdict == 'promoted' else '<'} -{self.tolerance:.3f}")
        return verdict


@dataclass
class Canaries:
    """Running canaries by scenario, and which arm each of their requests went to."""

    running: dict[str, Canary] = field(default_factory=dict)
    finished: dict[str, Canary] = field(default_factory=dict)
    _arms: dict[str, tuple[str, Arm]] = field(default_factory=dict)

    def start(self, scenario: str, candidate_id: str, head_release_id: str, rule: CanaryConfig,
              fraction: float | None = None) -> Canary:
        canary = Canary(scenario=scenario, candidate_id=candidate_id, head_release_id=head_release_id,
                        fraction=fraction if fraction is not None else rule.fraction,
                        min_reports=rule.min_reports, tolerance=rule.tolerance, started_at=time.time(),
                        arms={"candidate": ArmStats(), "head": ArmStats()})
        self.running[scenario] = canary
        return canary

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
            canary.arms[arm].reports += 1
            canary.arms[arm].score_sum += score
            if canary.decide() is not None and scenario not in ready:
                ready.append(scenario)
        return ready

    def finish(self, scenario: str, state: CanaryState, reason: str | None = None,
               release_id: str | None = None) -> Canary | None:
        canary = self.running.pop(scenario, None)
        if canary is None:
            return None
        canary.state = state
        canary.reason = reason or canary.reason
        canary.release_id = release_id
        self.finished[scenario] = canary
        self._arms = {r: v for r, v in self._arms.items() if v[0] != scenario}
        return canary

    def describe(self, scenario: str) -> dict[str, object] | None:
        canary = self.running.get(scenario) or self.finished.get(scenario)
        return canary.public() if canary else None
