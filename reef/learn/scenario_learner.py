"""One scenario's part of the learner (reef.learn.learner): its round plan, the thresholds its
rounds wait for, the ladder's rungs (harness, exploration), the void gate it retries, the next gate
it warms, and what its rounds did; `scenario_plans` builds one per scenario serve.yaml gives a
recipe, checking each recipe's params before the server serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.config import ServeConfig
from reef.learn.harness_rung import HarnessRung, harness_rung_for
from reef.learn.ladder import Exploration, exploration_for
from reef.learn.pending import pending
from reef.learn.plan import RoundPlan, Thresholds, plan_for_scenario, thresholds
from reef.learn.regate import void_retry
from reef.learn.round_log import RoundLog

if TYPE_CHECKING:
    from reef.recipe.base import Recipe

class LearnerConfigError(ValueError):
    """A scenario's recipe cannot be loaded with its params; names the scenario and key."""


def eligible(pending: dict[str, int]) -> int:
    """New records the recipe could take, whatever one round's batch_size caps."""
    return pending.get("eligible", pending.get("records", 0))


@dataclass
class ScenarioLearner:
    """One scenario's part of the learner: its plan, and what its rounds did."""

    plan: RoundPlan
    thresholds: Thresholds
    recipe: Recipe | None = None  # loaded once, for counting what waits
    rounds: int = 0
    pending: dict[str, int] | None = None
    waiting: str | None = None  # why no round starts yet (below a threshold); None: due, or not counted yet
    last: dict[str, Any] | None = None
    last_error: str | None = None
    running: bool = False
    # The eligible records counted when the last round found nothing new to learn (a harness that
    # already says what the failures teach): the next round waits for min_records more than that,
    # instead of asking again every interval about the same failures.
    idle_at: int | None = None
    gate_retries: int = 2  # learner.gate_retries: how often a void gate of this scenario's candidate is run again
    void_gate: dict[str, Any] | None = None  # the latest round's candidate whose gate was void, and what comes next
    # The ladder's exploration rung (reef.learn.ladder); None where exploring does not fit.
    exploration: Exploration | None = None
    exploring: bool = False  # the round running now is an exploration round
    # The rung before it: the first rewarded replies as few-shot examples (reef.learn.harness_rung).
    harness: HarnessRung | None = None
    harnessing: bool = False  # the round running now is the harness rung's
    warmed: str | None = None  # the head release whose next gate's head replies the warm-up finished (or gave up)
    warm: dict[str, Any] | None = None  # what the latest warm-up did (reef.gate.warm.Warmed), for the status

    @property
    def min_records(self) -> int:
        return self.thresholds.records

    @property
    def log(self) -> RoundLog:
        return RoundLog.for_data_dir(self.plan.data_dir, self.plan.scenario)

    def count(self) -> None:
        """Count what waits (reef.learn.pending) and whether it is enough to start a round."""
        self.pending = pending(self.plan, self.recipe)
        self.waiting = self.thresholds.shortfall(self.pending)
        if self.waiting is None and self.idle_at is not None:
            want, have = self.idle_at + self.thresholds.records, eligible(self.pending)
            if have < want:
                self.waiting = f"waiting: {have} of {want} records (the last round found nothing new to learn)"
            else:
                self.idle_at = None
        if self.pending is None:
            return
        shown = self.harness is not None and self.harness.check(self.pending, self.thresholds, self.waiting) is not None
        if self.exploration is not None:
            # The harness rung goes first: exploration waits for its round (and keeps its spacing).
            self.exploration.check(self.pending, self.thresholds, None if shown else self.waiting)

    def due(self) -> bool:
        """A round an earlier process left open (killed mid-round) is due whatever waits; else one
        is due when the last count reached every threshold."""
        return (self.log.open_round() is not None or (self.pending is not None and self.waiting is None)
                or self.void_candidate() is not None
                or (self.harness is not None and self.harness.reason is not None)
                or (self.exploration is not None and self.exploration.reason is not None))

    def round_plan(self) -> RoundPlan:
        """The plan of the round to run now, the ladder's lowest rung that is due: the scenario's
        own (a round open or due), else the harness rung's, else the exploration rung's."""
        own_due = self.log.open_round() is not None or (self.pending is not None and self.waiting is None)
        harness, explore = self.harness, self.exploration
        self.harnessing = not own_due and harness is not None and harness.reason is not None
        self.exploring = not own_due and not self.harnessing and explore is not None and explore.reason is not None
        if self.harnessing and harness is not None:
            return harness.plan
        if self.exploring and explore is not None:
            return explore.next_plan
        return self.plan

    def explored(self, idle_at: int | None, rounds_before: int) -> None:
        """After a round of a rung (`rounds_before`: the count before it; not more: it failed): the
        harness rung marks the head tried, exploration spaces the next one; the own recipe's idle
        mark stays as it was."""
        rung = self.harness if self.harnessing else self.exploration if self.exploring else None
        if rung is None:
            return
        last = (self.last or {}) if self.rounds > rounds_before else {}
        if rung is self.exploration and self.exploration is not None:
            self.exploration.finished(last.get("status"), last.get("release"), metrics=last.get("metrics"))
        else:
            rung.finished(last.get("status"), last.get("release"))
        self.idle_at, self.exploring, self.harnessing = idle_at, False, False

    def describe(self) -> dict[str, Any]:
        current = self.log.current()
        return {"recipe": self.plan.recipe, "min_records": self.min_records,
                "thresholds": self.thresholds.model_dump(), "waiting": None if self.running else self.waiting,
                "running": self.running, "rounds": self.rounds,
                "exploring": self.exploration.reason if self.exploration else None,
                "exploration": self.exploration.describe() if self.exploration else None,
                "harness": self.harness.reason if self.harness else None,
                "harness_rung": self.harness.describe() if self.harness else None,
                "warm": self.warm,
                "pending": self.pending, "last_round": self.last,
                "last_error": self.last_error, "round": current.public() if current else None,
                "void_gate": self.void_gate}

    def void_candidate(self) -> str | None:
        """The latest round's candidate to gate again (reef.learn.regate); `void_gate` says where it stands."""
        candidate_id, self.void_gate = void_retry(self.plan, self.log, self.gate_retries)
        return candidate_id


def scenario_plans(config: ServeConfig) -> dict[str, ScenarioLearner]:
    """Every declared scenario with a recipe, its recipe loaded and its params checked (a mistake
    raises LearnerConfigError naming the key, before the server serves)."""
    from reef.scenario import all_scenarios

    out: dict[str, ScenarioLearner] = {}
    for name, scenario in sorted(all_scenarios(config).items()):
        plan = plan_for_scenario(config, name)
        if plan is None:
            continue
        key = (f"recipes.{scenario.recipe}" if isinstance(scenario.recipe, str) and scenario.recipe in config.recipes
               else f"scenarios.{name}.recipe")
        try:
            recipe = plan.load_recipe()
        except (ValueError, TypeError, LookupError, ImportError) as exc:
            raise LearnerConfigError(f"{key}: {exc}") from exc
        wait_for = thresholds(config, name, recipe)
        # The round process checks the thresholds again on what it finds (reef.learn.round.run_round).
        out[name] = ScenarioLearner(plan=plan.model_copy(update={"wait_for": wait_for}), thresholds=wait_for,
                                    recipe=recipe)
        try:
            out[name].exploration = exploration_for(config, name, plan, recipe, wait_for)
        except (ValueError, TypeError, LookupError, ImportError) as exc:
            raise LearnerConfigError(f"learner.explore: {exc}") from exc
        try:
            out[name].harness = harness_rung_for(config, name, plan, recipe, wait_for)
        except (ValueError, TypeError, LookupError, ImportError) as exc:
            raise LearnerConfigError(f"learner.harness: {exc}") from exc
    return out
