"""Online RL from recorded traffic: GRPO-style group-relative advantages from reported scores,
with truncated importance sampling (TIS) against the behaviour logprobs vLLM recorded.

Why not TRL's `GRPOTrainer`: it samples prompts itself and wants `num_generations` fresh
completions per prompt (from its own generation or a `rollout_func`), while recorded traffic comes
already sampled, in groups of any size, by an older policy; and TRL corrects for off-policy
samples only for its own vLLM generations. So this is a small `transformers.Trainer` subclass
whose loss is the GRPO objective on fixed data:

    A_i    = (r_i - mean_g r) / (std_g r + eps)     per group g (same prompt, or a tag such as task_id)
    rho_it = min(exp(log pi(y_it) - log mu(y_it)), is_cap)      detached; mu = recorded logprobs
    loss   = -sum_it w_i * rho_it * A_i * log pi(y_it) / number of completion tokens

`w_i` is the snapshot's staleness weight: samples more than `max_staleness` releases behind are
down-weighted by `stale_weight` per extra release (`stale_policy: downweight`, the default here)
or dropped (`drop`); the snapshot manifest counts either. No KL term (beta = 0, as in recent GRPO
practice); the cap bounds each update instead. vLLM reports untempered logprobs by default, so
`mu` is exact for temperature-1 traffic and an approximation otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import polars as pl
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments

from reef.recipe import Recipe, RecipeConfig, Snapshot
from reef.recipe.tokens import CutStats, fit_left


@dataclass
class OnlineRLConfig(RecipeConfig):
    group_by: str | None = "prompt"
    drop_duplicates: bool = False  # the same reply sampled twice is evidence, not a duplicate
    max_staleness: int | None = 2
    stale_policy: str = "downweight"
    learning_rate: float = 5e-5
    is_cap: float = 2.0
    scale_rewards: bool = True


def rl_examples(samples: pl.DataFrame, scale: bool, max_length: int,
                stats: CutStats | None = None) -> tuple[datasets.Dataset, dict[str, int]]:
    """Per sample: served prompt+completion ids, completion mask, behaviour logprobs (aligned to
    positions), group-relative advantage and staleness weight. Zero-advantage samples are left out;
    long ones are cut from the left (`reef.recipe.tokens.fit_left`, counted in `stats`)."""
    ok = samples.filter(pl.col("logprobs").list.len() == pl.col("completion_ids").list.len())
    adv = pl.col("score") - pl.col("score").mean().over("group")
    std = pl.col("score").std(ddof=0).over("group")
    ok = ok.with_columns(advantage=(adv / (std + 1e-4)) if scale else adv)
    useful = ok.filter(pl.col("advantage").abs() > 1e-6)
    rows: dict[str, list[Any]] = {"input_ids": [], "completion_mask": [], "behaviour": [], "advantage": [],
                                  "weight": []}
    cuts = stats if stats is not None else CutStats()
    for prompt, completion, logprobs, a, w in useful.select(
        "prompt_ids", "completion_ids", "logprobs", "advantage", "weight"
    ).iter_rows():
        drop, keep, prompt_cut, completion_cut = fit_left(list(prompt), list(completion), max_length)
        cuts.add(prompt_cut, completion_cut)
        prompt, completion, logprobs = list(prompt)[drop:], list(completion)[:keep], list(logprobs)[:keep]
        rows["input_ids"].append(prompt + completion)
        rows["completion_mask"].append([0] * len(prompt) + [1] * len(completion))
        rows["behaviour"].append([0.0] * len(prompt) + logprobs)
        rows["advantage"].append(a)
        rows["weight"].append(w)
    counts = {"samples": samples.height, "no_logprobs": samples.height - ok.height,
              "zero_advantage": ok.height - useful.height, "train_samples": useful.height}
    return datasets.Dataset.from_dict(rows), counts


def collate(pad_id: int) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
    def pad(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
        width = max(map(len, rows))
        return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)

    def fn(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [b["input_ids"] for b in batch]
        return {
            "input_ids": pad(ids, pad_id, torch.long),
            "attention_mask": pad([[1] * len(r) for r in ids], 0, torch.long),
            "completion_mask": pad([b["completion_mask"] for b in batch], 0, torch.float32),
            "behaviour": pad([b["behaviour"] for b in batch], 0.0, torch.float32),
            "advantage": torch.tensor([b["advantage"] for b in batch], dtype=torch.float32),
            "weight": torch.tensor([b["weight"] for b in batch], dtype=torch.float32),
        }

    return fn


class TISTrainer(Trainer):
    def __init__(self, *args: Any, is_cap: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.is_cap = is_cap
        self._stats: dict[str, list[float]] = {"is_ratio": [], "is_truncated": [], "advantage_abs": []}

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, :-1]
        targets = inputs["input_ids"][:, 1:]
        logp = logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        mask = inputs["completion_mask"][:, 1:]
        ratio = torch.exp(logp.detach() - inputs["behaviour"][:, 1:])
        rho = ratio.clamp(max=self.is_cap)
        scale = (inputs["advantage"] * inputs["weight"]).unsqueeze(-1)
        loss = -(rho * scale * logp * mask).sum() / mask.sum().clamp(min=1.0)
        tokens = mask.sum().clamp(min=1.0)
        self._stats["is_ratio"].append(float((ratio * mask).sum() / tokens))
        self._stats["is_truncated"].append(float(((ratio > self.is_cap).float() * mask).sum() / tokens))
        self._stats["advantage_abs"].append(float(inputs["advantage"].abs().mean()))
        return (loss, {"logits": logits}) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        for key, values in self._stats.items():
            if values:
                logs[key] = sum(values) / len(values)
                values.clear()
        super().log(logs, *args, **kwargs)


class OnlineRL(Recipe):
    name = "online_rl"
    config_class = OnlineRLConfig
    min_group_size = 2  # a lone sample has no group baseline to compare against

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> TISTrainer:
        c = self.config
        assert isinstance(c, OnlineRLConfig)
        self._cuts = CutStats()
        dataset, self._counts = rl_examples(snapshot.samples(), c.scale_rewards, c.max_length, self._cuts)
        if len(dataset) == 0:
            raise ValueError(f"snapshot {snapshot.id}: no sample has a non-zero advantage ({self._counts})")
        args = TrainingArguments(**self.training_args(output_dir), remove_unused_columns=False)
        return TISTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate(tokenizer.pad_token_id),
                          is_cap=c.is_cap)

    def extra_metrics(self, trainer: Any) -> dict[str, Any]:
        logged = [h for h in trainer.state.log_history if "is_ratio" in h]
        last = {k: logged[-1][k] for k in ("is_ratio", "is_truncated")} if logged else {}
        return {**self._counts, **self._cuts.as_metrics(), **last}
