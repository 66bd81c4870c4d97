"""The learner's ladder, the rung before exploration: show the first rewarded replies as few-shot examples.

A scenario's own recipe (rft, ...) waits for `min_rewarded` rewarded records before it trains
(reef.learn.plan.Thresholds). Once a few are in (`learner.harness.min_rewarded`, 2) but fewer than
that, the learner first runs a harness round: `learner.harness.recipe` (`harness_evolve`, proposer
`mined`) writes up to `max_shots` of the rewarded replies (tool calls kept) and any corrections as the
harness's `shots.jsonl` (reef.recipe.shots), and the candidate is gated against the head on the eval
suite, same weights, and released under the scenario's policy like any other. A small model often
copies a format it is shown where it ignores one it is told, and a harness costs no training. The
reason shows in `reef status`, e.g. `harness: 3 rewarded replies as few-shot examples`.

The round reads its snapshot without consuming it (`consume: false`): the records it shows stay the
own recipe's to train on. Its rewarded threshold is the own recipe's (`failure_below` set to its
`success_threshold()`), so it shows exactly the replies the learner counted.

Only where it fits: the own recipe waits for rewarded records (and `learner.harness.min_rewarded`
is below what it wants), and the gateway applies the scenario's harness (`harness.inject` not `off`:
a harness clients fetch themselves is theirs to apply, so a gate on it would judge examples no user
is shown). Tried once per head release whose harness has no examples yet: a round that releases
nothing (the gate rejects the examples, nothing to propose, policy `approval` leaves it to a person)
marks the head tried, and the ladder moves on to exploration; a new head (a LoRA release, a rollback)
may be tried again. The mark lives in memory, and the candidate register keeps it across restarts:
a harness candidate that added examples to this head means it was tried (a round that proposed
nothing leaves no candidate, so a restarted server asks again, which costs no gate).

Harness and weights releases coexist on one chain: a harness release keeps the head's weights
(`content_id`, a LoRA head included) and a weights release keeps the head's harness
(reef.serving.publisher.Publisher.release).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.config import ServeConfig
from reef.config.learner import HarnessRungSettings
from reef.learn.plan import RoundPlan, Thresholds, plan_round
from reef.registry.artifacts import ArtifactStore
from reef.registry.candidates import CandidateRegistry
from reef.registry.harness import SHOTS_FILE, load_harness
from reef.registry.schema import release_name
from reef.registry.state import ReleaseState
from reef.scenario.schema import RecipeSpec

if TYPE_CHECKING:
    from reef.recipe.base import Recipe


def harness_reason(counts: dict[str, int], thresholds: Thresholds, min_rewarded: int) -> str | None:
    """Why a harness round is due on these counts (reef.learn.pending), or None: the own recipe waits
    for more rewarded records than are in, and at least `min_rewarded` are."""
    want, rewarded = thresholds.rewarded, counts.get("rewarded", 0)
    if want == 0 or rewarded >= want or rewarded < min_rewarded:
        return None
    return f"harness: {rewarded} rewarded replies as few-shot examples"


def head_shows_examples(data_dir: Path, scenario: str) -> tuple[str, bool]:
    """(the head release id, whether its harness holds few-shot examples). Before the scenario's first
    release, its r0 (the base model, no harness): what the first gate makes it."""
    state = ReleaseState(data_dir)
    if not state.has_chain(scenario):
        return release_name(scenario, 0), False
    store = ArtifactStore.for_data_dir(data_dir)
    head = state.chain(scenario, artifacts=store).head()
    if head is None:
        return release_name(scenario, 0), False
    if head.harness_id is None:
        return head.release_id, False
    return head.release_id, SHOTS_FILE in load_harness(store, head.harness_id).files


def examples_made_against(data_dir: Path, scenario: str, head: str) -> bool:
    """Whether the candidate register holds a harness candidate that added few-shot examples to
    `head` (a round of this rung, or of a learner before a restart, or anyone's)."""
    for view in CandidateRegistry(data_dir, scenario).list():
        parents = {view.lineage.parent_release if view.lineage else None,
                   view.gate.head_release_id if view.gate else None}
        if view.kind == "harness" and head in parents and any(
                m.get("op") == "create" and m.get("path") == SHOTS_FILE for m in view.mutations):
            return True
    return False


def harness_plan(config: ServeConfig, scenario: str, plan: RoundPlan, recipe: Recipe | None,
                 thresholds: Thresholds) -> RoundPlan | None:
    """The harness round for a scenario whose own round is `plan`, or None where the rung does not
    fit (see the module docstring). A recipe that cannot take the params raises ValueError."""
    settings = config.learner.harness
    # No room below the own threshold: the own round starts as soon as the rung would.
    if not settings.enabled or recipe is None or thresholds.rewarded <= settings.min_rewarded:
        return None
    if config.scenario(scenario).harness.inject == "off":
        return None
    threshold = recipe.success_threshold()
    params: dict[str, Any] = {"proposer": "mined", "consume": False,
                              **({"failure_below": threshold} if threshold is not None else {}), **settings.params}
    out = plan_round(scenario, RecipeSpec(recipe=settings.recipe, params=params), base_model=plan.base_model,
                     data_dir=plan.data_dir, import_dirs=plan.import_dirs)
    out.load_recipe()  # its params checked before the server serves
    return out


@dataclass
class HarnessRung:
    """One scenario's harness rung: its plan, the heads it tried, and why it is due."""

    plan: RoundPlan
    settings: HarnessRungSettings
    rounds: int = 0
    tried: list[str] = field(default_factory=list)  # head release ids a harness round ran against
    head: str | None = None  # the head at the last check
    reason: str | None = None  # set while one is due or running
    last: dict[str, Any] | None = None

    def check(self, counts: dict[str, int], thresholds: Thresholds, waiting: str | None) -> str | None:
        """The reason a harness round is due now (None: the own round is due, too few or enough
        rewarded records, the head shows examples already, or a round ran against this head)."""
        reason = harness_reason(counts, thresholds, self.settings.min_rewarded) if waiting is not None else None
        if reason is not None:
            data_dir, scenario = self.plan.data_dir, self.plan.scenario
            self.head, shows = head_shows_examples(data_dir, scenario)
            if self.head not in self.tried and examples_made_against(data_dir, scenario, self.head):
                self.tried.append(self.head)  # tried before this process started
            if shows or self.head in self.tried:
                reason = None
        self.reason = reason
        return reason

    def finished(self, status: str | None, released: str | None, now: float | None = None) -> None:
        """After a harness round (status None: it failed): this head is tried, whatever came of it."""
        self.rounds += 1
        if self.head is not None and self.head not in self.tried:
            self.tried.append(self.head)
        self.last = {"status": status or "failed", "release": released, "at": time.time() if now is None else now}
        self.reason = None

    def describe(self) -> dict[str, Any]:
        return {"recipe": self.plan.recipe, "rounds": self.rounds, "last": self.last, "tried": list(self.tried)}


def harness_rung_for(config: ServeConfig, name: str, plan: RoundPlan, recipe: Recipe | None,
                     thresholds: Thresholds) -> HarnessRung | None:
    rung = harness_plan(config, name, plan, recipe, thresholds)
    return HarnessRung(rung, config.learner.harness) if rung is not None else None
