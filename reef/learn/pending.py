"""What waits for a round: the records the next snapshot would take, and the signal among them (the
counts the learner compares with a plan's `Thresholds`, reef.learn.plan). Nothing is written: the
learner counts every interval, the round counts again before it starts, `reef learn --once` asks
whether the snapshot would change."""

from __future__ import annotations

import dataclasses

import polars as pl

from reef.experience import load
from reef.learn.plan import RoundPlan
from reef.recipe import ledger
from reef.recipe.base import Recipe
from reef.recipe.snapshot import content_hash, select


def pending(plan: RoundPlan, recipe: Recipe | None = None) -> dict[str, int]:
    """How many records the next snapshot would take, why the others are left out, how many are
    eligible (whatever one round's `batch_size` takes) and how many of those are rewarded and
    unrewarded (`signal`)."""
    records, counts, _ = selection(plan, recipe, with_signal=True)
    return {"records": records, **counts}


def selection(plan: RoundPlan, recipe: Recipe | None = None, *,
              with_signal: bool = False) -> tuple[int, dict[str, int], str]:
    """What a snapshot would hold now, without writing anything: (records, counts, content hash);
    `with_signal`: the counts include `eligible`, `rewarded` and `unrewarded` (`signal`)."""
    recipe = recipe or plan.load_recipe()
    spec = recipe.experience()
    taken = set(ledger.consumed(plan.ledger_root, plan.scenario)["record_id"].to_list())
    experience = load(plan.scenario, plan.experience_dir).collect()
    frame, counts = select(experience, spec, taken)
    if with_signal:
        counts.update(signal(experience, recipe, taken, frame))
    return frame.height, counts, content_hash(frame, spec)


def signal(experience: pl.DataFrame, recipe: Recipe, taken: set[str],
           selected: pl.DataFrame | None = None) -> dict[str, int]:
    """What waits for the recipe, whatever one round takes: `eligible`, the new records its spec
    selects, not capped by `batch_size`; and of the new records it could learn from (unconsumed,
    trainable and reported, not cut by its `min_score` either) how many are `rewarded` (at least
    `recipe.success_threshold()`, or above 0 when it is None) and `unrewarded` (below it).
    `selected`: the spec's own selection, reused where it is the same."""
    spec = recipe.experience()
    # batch_size 0: a recipe that makes its own samples takes no records, however many wait.
    uncapped = dataclasses.replace(spec, batch_size=None) if spec.batch_size else spec
    eligible = selected if selected is not None and uncapped == spec else select(experience, uncapped, taken)[0]
    wide = dataclasses.replace(uncapped, min_score=None, needs_reports=True)
    frame = eligible if wide == uncapped else select(experience, wide, taken)[0]
    reported = frame.filter(pl.col("score").is_not_null())
    threshold = recipe.success_threshold()
    good = pl.col("score") >= threshold if threshold is not None else pl.col("score") > 0
    if spec.corrections:  # a correction is a target to learn from, however low the score
        good = good | pl.col("correction").is_not_null()
    rewarded = reported.filter(good).height
    return {"eligible": eligible.height, "rewarded": rewarded, "unrewarded": reported.height - rewarded}
