"""Rejection-sampling fine-tuning: supervised training (TRL `SFTTrainer`) on the served
completions whose reported score passed `min_score`, and on the `correction` a report carries for
a reply that did not pass (`corrections: true`, the default): the reply the application wanted is
a target even while the model earns no reward at all, which is how a small real model starts on a
binary verifier it almost never satisfies (a cold start from live traffic, no demonstrations).

The threshold is part of the experience spec, so records below it are never snapshotted and
never consumed: a later recipe (online_rl) can still learn from them. With `trajectories: true` a
training example is a whole session (every turn of an agent's run, the loss on the model's own
tokens only, see `reef.recipe.trajectory`): report a session (`session_id`) and every turn is
credited. Stale samples are dropped
(`stale_policy: drop` only): imitating a behaviour is only sensible while it is close to the
current policy, and SFTTrainer has no per-sample weights to down-weight them with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.recipe import ExperienceSpec, Recipe, RecipeConfig, Snapshot
from reef.recipe.tokens import CutStats, sft_examples, trajectory_examples, with_corrections

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import SFTTrainer


@dataclass
class RFTConfig(RecipeConfig):
    min_score: float | None = 1.0
    learning_rate: float = 5e-4
    trajectories: bool = False  # one example per session instead of per call
    corrections: bool = True  # a report's correction of a reply below min_score is a target too


class RFT(Recipe):
    name = "rft"
    config_class = RFTConfig
    stale_policies = ("drop",)
    # It trains on the rewarded records only, so it waits for those: a scenario whose traffic is all
    # imported demonstrations (every one rewarded) still learns. `min_unrewarded` on a recipe setting opts in.
    waits_for = frozenset({"records", "rewarded"})

    def experience(self) -> ExperienceSpec:
        c = self.config
        assert isinstance(c, RFTConfig)
        return dataclasses.replace(super().experience(), corrections=c.corrections and not c.trajectories)

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> SFTTrainer:
        # Imported here: importing trl takes seconds, and the snapshot stage only needs experience().
        from trl import SFTConfig, SFTTrainer

        c = self.config
        assert isinstance(c, RFTConfig)
        self._cuts = CutStats()
        self._corrections = 0
        if c.trajectories:
            trajs = snapshot.trajectories()
            self._dataset = trajectory_examples(trajs, c.max_length, self._cuts).remove_columns("session_id")
        else:
            samples, self._corrections = with_corrections(snapshot.samples(), tokenizer, c.min_score)
            self._dataset = sft_examples(samples, c.max_length, self._cuts).remove_columns("record_id")
        args = SFTConfig(**self.training_args(output_dir, self._dataset), max_length=c.max_length, packing=False)
        return SFTTrainer(model=model, args=args, train_dataset=self._dataset, processing_class=tokenizer)

    def extra_metrics(self, trainer: Any) -> dict[str, int]:
        return {"train_samples": len(self._dataset), "corrections": self._corrections, **self._cuts.as_metrics()}
