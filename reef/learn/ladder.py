"""The learner's ladder, first rung: explore instead of waiting when live rewards are rare.

A scenario's own recipe (rft, online_rl, ...) waits for `min_rewarded` rewarded records (see
reef.learn.plan.Thresholds). When its live traffic shows that rewards are rare, at least
`learner.explore.min_reports` reported records of which fewer than `min_rewarded` earned one, and
live traffic would not bring the rest soon, the learner runs an exploration round instead
(`learner.explore.recipe`, `explore`: the policy's own rollouts on the scenario's practice tasks,
scored by its reward, the successes fine-tuned), whose candidate goes through the same gate and
release policy as any other. The reason shows in
`reef status`, e.g. `exploring: 0 of 4 rewarded in 20 reported records`.

"Soon" is `learner.explore.live_horizon_s`: live traffic is a policy sampling too, often faster
than a round's own rollouts, which share the engine with it. At a 1 % success rate and a few
reports a second it brings the rewarded records in a minute or two, sooner than an exploration
round would finish; where no reply has ever been rewarded, the expected wait grows with every
report until exploring is worth it. The expected wait is the missing rewarded records over the
rate of rewarded reports: the reports' rate over the last two minutes times the share rewarded so
far, counting half a success more (a Jeffreys-style prior: none seen yet in twenty reports is not
a rate of zero). It is not trusted before reports have been watched for `RATE_WINDOW_S`.

Once successes are not rare (at least `rl_above` of the last exploration round's unguided rollouts
passed), the next exploration round is on-policy RL instead (`learner.explore.rl_recipe`, `grpo`:
TRL's GRPOTrainer sampling the trained policy through the engine), and back to expert iteration
should that share fall again.

Only where it fits: the scenario declares a reward and `tasks:` with practice tasks (not all in
its eval suite; with an environment, explored in episodes), its recipe trains a LoRA
(what exploration makes: a full-weight round would start over from the base model) and waits for
rewarded records, and the learner has an engine to sample through. Rounds are spaced: `retry_s`
after each, doubled after each one that released nothing (up to 8x), so a scenario the policy
cannot solve does not explore back to back.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reef.config import ServeConfig
from reef.config.learner import ExploreSettings
from reef.learn.plan import RoundPlan, Thresholds, plan_round
from reef.recipe.practice import practice_tasks
from reef.scenario import ScenarioError
from reef.scenario.schema import RecipeSpec

if TYPE_CHECKING:
    from reef.recipe.base import Recipe

MAX_BACKOFF = 8
RATE_WINDOW_S = 30.0  # reports watched at least this long before their rate is trusted
RATE_HISTORY_S = 120.0  # the rate is over the reports of this long


def live_wait_s(counts: dict[str, int], thresholds: Thresholds, reports_per_s: float) -> float:
    """Seconds live traffic should take to bring the rewarded records the own recipe still wants, at
    `reports_per_s` and the share rewarded so far with half a success added (inf: no reports come)."""
    want, rewarded = thresholds.rewarded, counts.get("rewarded", 0)
    reported = rewarded + counts.get("unrewarded", 0)
    if reports_per_s <= 0:
        return math.inf
    return max(want - rewarded, 0) / ((rewarded + 0.5) / (reported + 1) * reports_per_s)


def explore_reason(counts: dict[str, int], thresholds: Thresholds, min_reports: int) -> str | None:
    """Why an exploration round is due on these counts (reef.learn.pending), or None: the recipe waits
    for rewarded records, fewer than it wants are rewarded, and at least `min_reports` are reported."""
    want, rewarded = thresholds.rewarded, counts.get("rewarded", 0)
    reported = rewarded + counts.get("unrewarded", 0)
    if want == 0 or rewarded >= want or reported < min_reports:
        return None
    return f"exploring: {rewarded} of {want} rewarded in {reported} reported records"


def exploration_plan(config: ServeConfig, scenario: str, plan: RoundPlan, recipe: Recipe | None,
                     thresholds: Thresholds) -> RoundPlan | None:
    """The exploration round for a scenario whose round is `plan`, or None where exploring does not fit
    (see the module docstring). A recipe that cannot take `learner.explore.params` raises ValueError."""
    settings = config.learner.explore
    if not settings.enabled or thresholds.rewarded == 0 or recipe is None or recipe.config.kind != "lora":
        return None
    declared = config.scenario(scenario)
    if declared.reward is None or declared.tasks is None:
        return None
    try:
        practice_tasks(declared)
    except (ScenarioError, OSError, ValueError):
        return None
    return _plan(settings.recipe, settings.params, scenario, plan)


def rl_plan(config: ServeConfig, scenario: str, plan: RoundPlan) -> RoundPlan | None:
    """The on-policy RL round that follows exploration once successes are not rare (None: off)."""
    settings = config.learner.explore
    return _plan(settings.rl_recipe, settings.rl_params, scenario, plan) if settings.rl_recipe else None


def _plan(recipe: str, params: dict[str, Any], scenario: str, plan: RoundPlan) -> RoundPlan:
    spec = RecipeSpec(recipe=recipe, params={"kind": "lora", **params})
    out = plan_round(scenario, spec, base_model=plan.base_model, data_dir=plan.data_dir, import_dirs=plan.import_dirs)
    out.load_recipe()  # its params checked before the server serves
    return out


def unguided_pass_rate(metrics: dict[str, Any] | None) -> float | None:
    """The share of a round's unguided rollouts that passed (None: it sampled none, or said nothing)."""
    if not metrics or "rollouts" not in metrics:
        return None
    tried = metrics["rollouts"] - metrics.get("guided_rollouts", 0)
    return (metrics.get("successes", 0) - metrics.get("guided_successes", 0)) / tried if tried > 0 else None


@dataclass
class Exploration:
    """One scenario's exploration rung: its plan, when it may run next, and why it is due."""

    plan: RoundPlan
    settings: ExploreSettings
    rl: RoundPlan | None = None  # the rung above, once successes are not rare
    on_policy: bool = False  # the next round is `rl`'s
    rounds: int = 0
    fruitless: int = 0  # rounds in a row that released nothing
    next_at: float = 0.0  # time.time() before which no exploration round starts
    reason: str | None = None  # set while one is due or running
    last: dict[str, Any] | None = None
    live_wait: float | None = None  # seconds live traffic should take to bring the rewarded records (None: unknown)
    _reports: deque[tuple[float, int]] = field(default_factory=deque)  # (time, reported) over RATE_HISTORY_S

    def check(self, counts: dict[str, int], thresholds: Thresholds, waiting: str | None,
              now: float | None = None) -> str | None:
        """The reason an exploration round is due now (None: the scenario's own round is due, rewards
        are not rare, live traffic should bring them soon, or the last exploration was too recent)."""
        now = time.time() if now is None else now
        reason = explore_reason(counts, thresholds, self.settings.min_reports) if waiting is not None else None
        horizon = self.settings.live_horizon_s
        if horizon is not None:
            rate = self._report_rate(counts.get("rewarded", 0) + counts.get("unrewarded", 0), now)
            self.live_wait = None if rate is None else live_wait_s(counts, thresholds, rate)
            if self.live_wait is None or self.live_wait <= horizon:
                reason = None
        self.reason = reason if reason is not None and now >= self.next_at else None
        return self.reason

    def _report_rate(self, reported: int, now: float) -> float | None:
        """Reports per second over the last RATE_HISTORY_S (None: watched for less than RATE_WINDOW_S).
        Fewer reports pending than before (a round consumed some) starts the watch again; a quiet
        time before the first report in the window is not counted (traffic that just began)."""
        points = self._reports
        if points and reported < points[-1][1]:
            points.clear()
        points.append((now, reported))
        while len(points) > 2 and now - points[1][0] >= RATE_HISTORY_S:
            points.popleft()
        if reported > points[0][1]:
            while points[1][1] == points[0][1]:
                points.popleft()
        since, first = points[0]
        return (reported - first) / (now - since) if now - since >= RATE_WINDOW_S else None

    @property
    def next_plan(self) -> RoundPlan:
        return self.rl if self.on_policy and self.rl is not None else self.plan

    def finished(self, status: str | None, released: str | None, now: float | None = None,
                 metrics: dict[str, Any] | None = None) -> None:
        """After an exploration round (status None: it failed): space the next one, and pick its rung
        from how often the round's unguided rollouts passed."""
        now = time.time() if now is None else now
        rate = unguided_pass_rate(metrics)
        if rate is not None:
            self.on_policy = rate >= self.settings.rl_above
        self.rounds += 1
        self.fruitless = 0 if released else self.fruitless + 1
        self.next_at = now + self.settings.retry_s * min(2 ** max(self.fruitless - 1, 0), MAX_BACKOFF)
        self.last = {"status": status or "failed", "release": released, "at": now}
        self.reason = None

    def describe(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        wait = self.live_wait
        return {"recipe": self.next_plan.recipe, "rounds": self.rounds, "last": self.last,
                "next_in_s": max(0.0, round(self.next_at - now, 1)),
                "live_wait_s": None if wait is None else round(wait, 1) if math.isfinite(wait) else "never"}


def exploration_for(config: ServeConfig, name: str, plan: RoundPlan, recipe: Recipe | None,
                    thresholds: Thresholds) -> Exploration | None:
    explore = exploration_plan(config, name, plan, recipe, thresholds)
    if explore is None:
        return None
    return Exploration(explore, config.learner.explore, rl=rl_plan(config, name, plan))

