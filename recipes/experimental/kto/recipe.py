"""KTO (TRL `KTOTrainer`) from thumbs-up/down reports: a served completion whose reported score is
>= `threshold` is desirable, below it undesirable. Unlike rft, the bad answers teach too.

Token ids: TRL 1.16's `KTOTrainer` always re-tokenizes a text dataset in `_prepare_dataset`
(prompt and prompt+completion rendered and split where they diverge), but its collator takes
`prompt_ids` / `completion_ids` / `label` rows. `TokenKTOTrainer` overrides `_prepare_dataset`
for such rows, so training sees exactly the served ids, and does what the original does to
tokenized rows: drop rows whose prompt fills `max_length`, add the KL completions (each batch's
completions rotated by one, with `train_sampling_strategy="sequential"`, as KTO requires).

Reference model: a frozen copy of the base (TRL loads it from `base_model`; for LoRA it disables
the adapter), or reference log-probs computed once up front with `precompute_ref_log_probs`.
`desirable_weight` defaults to n_undesirable / n_desirable, the low end of the KTO paper's
recommended range, so a mostly-wrong model's few good answers still count. Stale samples are
dropped (`stale_policy: drop` only): KTO has no per-sample weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import polars as pl

from reef.recipe import Recipe, RecipeConfig, Snapshot
from reef.recipe.tokens import CutStats, fit_left

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import KTOTrainer


@dataclass
class KTOConfig(RecipeConfig):
    drop_duplicates: bool = False  # the same reply to the same prompt, reported twice, is still evidence
    learning_rate: float = 5e-5
    threshold: float = 0.5  # score >= threshold: thumbs up (1/0 and 1/-1 reports both split here)
    beta: float = 0.1
    desirable_weight: float | None = None  # None: n_undesirable / n_desirable
    undesirable_weight: float = 1.0
    precompute_ref_log_probs: bool = False


def kto_examples(samples: pl.DataFrame, threshold: float, seed: int, max_length: int | None = None,
                 stats: CutStats | None = None) -> datasets.Dataset:
    """One row per sample: served prompt and completion ids, label = score >= threshold; shuffled
    once, because KTO batches in order and each batch should mix both labels for its KL estimate.
    Longer than `max_length`: the prompt is cut from the left (TRL's collator would cut the
    completion's end instead), counted in `stats`."""
    rows = samples.filter(pl.col("completion_ids").list.len() > 0).select(
        pl.col("prompt_ids").cast(pl.List(pl.Int64)), pl.col("completion_ids").cast(pl.List(pl.Int64)),
        label=pl.col("score") >= threshold,
    ).to_dict(as_series=False)
    if max_length is not None:
        stats = stats if stats is not None else CutStats()
        for i, (prompt, completion) in enumerate(zip(rows["prompt_ids"], rows["completion_ids"], strict=True)):
            drop, keep, prompt_cut, completion_cut = fit_left(prompt, completion, max_length)
            stats.add(prompt_cut, completion_cut)
            rows["prompt_ids"][i], rows["completion_ids"][i] = prompt[drop:], completion[:keep]
    return datasets.Dataset.from_dict(rows).shuffle(seed=seed).flatten_indices()


def _token_kto_trainer() -> type[KTOTrainer]:
    from trl import KTOTrainer

    class TokenKTOTrainer(KTOTrainer):
        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            if "prompt_ids" not in dataset.column_names:
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            if args.max_length is not None:
                dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
            if self.calculate_KL:
                def rotate(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
                    batch["KL_completion_ids"] = batch["completion_ids"][-1:] + batch["completion_ids"][:-1]
                    return batch

                dataset = dataset.map(rotate, batched=True, batch_size=args.per_device_train_batch_size)
            return dataset

    return TokenKTOTrainer


class KTO(Recipe):
    name = "kto"
    config_class = KTOConfig
    stale_policies = ("drop",)

    def success_threshold(self) -> float | None:
        """Thumbs up: a round waits for enough of both labels."""
        assert isinstance(self.config, KTOConfig)
        return self.config.threshold

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> KTOTrainer:
        from trl import KTOConfig as TRLKTOConfig

        c = self.config
        assert isinstance(c, KTOConfig)
        self._cuts = CutStats()
        self._dataset = kto_examples(snapshot.samples(), c.threshold, c.seed, c.max_length, self._cuts)
        n_good = sum(self._dataset["label"])
        n_bad = len(self._dataset) - n_good
        if not n_good or not n_bad:
            raise ValueError(f"snapshot {snapshot.id}: KTO needs both thumbs up and down, got {n_good} up, "
                             f"{n_bad} down at threshold {c.threshold}")
        self._counts = {"train_samples": len(self._dataset), "desirable": n_good, "undesirable": n_bad,
                        **self._cuts.as_metrics(),
                        "desirable_weight": c.desirable_weight if c.desirable_weight is not None else n_bad / n_good}
        args = TRLKTOConfig(
            **self.training_args(output_dir, self._dataset), max_length=c.max_length, beta=c.beta,
            desirable_weight=self._counts["desirable_weight"], undesirable_weight=c.undesirable_weight,
            precompute_ref_log_probs=c.precompute_ref_log_probs,
        )
        return _token_kto_trainer()(model=model, args=args, train_dataset=self._dataset, processing_class=tokenizer)

    def fit(self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
            output_dir: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
        trained, metrics = super().fit(snapshot, model, tokenizer, output_dir)
        # With LoRA, TRL keeps the untrained adapter as a frozen "ref" copy: not part of the candidate.
        if "ref" in getattr(trained, "peft_config", {}):
            trained.delete_adapter("ref")
        return trained, metrics

    def extra_metrics(self, trainer: Any) -> dict[str, Any]:
        logged = [h for h in trainer.state.log_history if "rewards/margins" in h]
        return {**self._counts, **({"reward_margin": logged[-1]["rewards/margins"]} if logged else {})}
