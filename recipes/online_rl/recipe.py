"""Online RL from recorded traffic: group-relative advantages from reported scores, with truncated
importance sampling (TIS) against the behaviour logprobs vLLM recorded.

Why not TRL's `GRPOTrainer`: it samples prompts itself and wants `num_generations` fresh
completions per prompt (from its own generation or a `rollout_func`), while recorded traffic comes
already sampled, in groups of any size, by an older policy; and TRL corrects for off-policy
samples only for its own vLLM generations. So this is a small `transformers.Trainer` subclass
whose loss is the GRPO objective on fixed data:

    A_i    = (r_i - b_i) / s_i                      b: baseline, s: scale (below)
    rho_it = min(exp(log pi(y_it) - log mu(y_it)), is_cap)      detached; mu = recorded logprobs
    loss   = -sum_it w_i * rho_it * A_i * log pi(y_it) / number of completion tokens

`baseline: group` (GRPO) takes b_i = the mean reward of i's group (same prompt, or a tag such as
task_id), so a group needs two samples and a reward spread to teach anything; `baseline: batch`
takes the mean over the whole round (REINFORCE with a batch baseline), so every sample with a
reward other than the mean counts, which is what live traffic needs: users rarely send one prompt
twice, and most groups have one sample. `scale_rewards` divides by the group's std (`group`,
GRPO), the round's (`batch`, REINFORCE++'s global normalisation) or nothing (`none`, Dr. GRPO).

`w_i` is the snapshot's staleness weight: samples more than `max_staleness` releases behind are
down-weighted by `stale_weight` per extra release (`stale_policy: downweight`, the default here)
or dropped (`drop`); the snapshot manifest counts either. No KL term (beta = 0, as in recent GRPO
practice); the cap bounds each update instead, and the logged `kl` (k3 estimate of KL(mu || pi)
on the trained tokens) shows how far the policy moved from the one that sampled. vLLM reports
untempered logprobs by default, so `mu` is exact for temperature-1 traffic and an approximation
otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import datasets
import polars as pl
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments

from reef.recipe import ExperienceSpec, Recipe, RecipeConfig, Snapshot
from reef.recipe.logprobs import completion_logprobs
from reef.recipe.tokens import CutStats, fit_left

Baseline = Literal["group", "batch"]
Scale = Literal["group", "batch", "none"]


@dataclass
class OnlineRLConfig(RecipeConfig):
    group_by: str | None = "prompt"
    drop_duplicates: bool = False  # the same reply sampled twice is evidence, not a duplicate
    max_staleness: int | None = 2
    stale_policy: str = "downweight"
    # Live traffic has few prompt groups with a reward spread, so a round needs several passes over
    # them: a higher rate and more steps than a gentle fine-tune (bench/online_rl_sweep.py compares
    # settings on one recorded round).
    learning_rate: float = 2e-4
    max_steps: int = 60
    is_cap: float = 2.0
    baseline: Baseline = "group"
    scale_rewards: Scale | bool = "group"  # True / False: "group" / "none"


def _scale_mode(scale: Scale | bool) -> Scale:
    return "group" if scale is True else "none" if scale is False else scale


def rl_examples(samples: pl.DataFrame, scale: Scale | bool, max_length: int, stats: CutStats | None = None,
                baseline: Baseline = "group") -> tuple[datasets.Dataset, dict[str, int]]:
    """Per sample: served prompt+completion ids, completion mask, behaviour logprobs (aligned to
    positions), advantage (see the module docstring), staleness weight and reward. Zero-advantage
    samples are left out; long ones are cut from the left (`reef.recipe.tokens.fit_left`,
    counted in `stats`)."""
    ok = samples.filter(pl.col("logprobs").list.len() == pl.col("completion_ids").list.len())
    over = "group" if baseline == "group" else None
    mean = pl.col("score").mean().over(over) if over else pl.col("score").mean()
    mode = _scale_mode(scale)
    std = pl.col("score").std(ddof=0)
    adv = pl.col("score") - mean
    if mode != "none":
        adv = adv / ((std.over("group") if mode == "group" else std) + 1e-4)
    ok = ok.with_columns(advantage=adv)
    useful = ok.filter(pl.col("advantage").abs() > 1e-6)
    rows: dict[str, list[Any]] = {"input_ids": [], "completion_mask": [], "behaviour": [], "advantage": [],
                                  "weight": [], "score": []}
    cuts = stats if stats is not None else CutStats()
    for prompt, completion, logprobs, a, w, score in useful.select(
        "prompt_ids", "completion_ids", "logprobs", "advantage", "weight", "score"
    ).iter_rows():
        drop, keep, prompt_cut, completion_cut = fit_left(list(prompt), list(completion), max_length)
        cuts.add(prompt_cut, completion_cut)
        prompt, completion, logprobs = list(prompt)[drop:], list(completion)[:keep], list(logprobs)[:keep]
        rows["input_ids"].append(prompt + completion)
        rows["completion_mask"].append([0] * len(prompt) + [1] * len(completion))
        rows["behaviour"].append([0.0] * len(prompt) + logprobs)
        rows["advantage"].append(a)
        rows["weight"].append(w)
        rows["score"].append(score)
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
            "score": torch.tensor([b["score"] for b in batch], dtype=torch.float32),
        }

    return fn


class TISTrainer(Trainer):
    def __init__(self, *args: Any, is_cap: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.is_cap = is_cap
        self._stats: dict[str, list[float]] = {k: [] for k in ("is_ratio", "is_truncated", "advantage_abs", "reward",
                                                               "kl")}

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        logp, start = completion_logprobs(model, inputs["input_ids"], inputs["attention_mask"],
                                          inputs["completion_mask"])
        mask = inputs["completion_mask"][:, start:]
        behaviour = inputs["behaviour"][:, start:]
        log_ratio = (logp.detach() - behaviour) * mask  # 0 off the completion (prompt, padding)
        ratio = torch.exp(log_ratio)
        rho = ratio.clamp(max=self.is_cap)
        scale = (inputs["advantage"] * inputs["weight"]).unsqueeze(-1)
        tokens = mask.sum().clamp(min=1.0)
        loss = -(rho * scale * logp * mask).sum() / tokens
        self._stats["is_ratio"].append(float((ratio * mask).sum() / tokens))
        self._stats["is_truncated"].append(float(((ratio > self.is_cap).float() * mask).sum() / tokens))
        self._stats["advantage_abs"].append(float(inputs["advantage"].abs().mean()))
        self._stats["reward"].append(float(inputs["score"].mean()))
        # k3 estimator of KL(mu || pi) per token: exp(-d) - 1 + d with d = log pi - log mu, always >= 0
        k3 = (torch.exp(-log_ratio) - 1 + log_ratio).clamp(min=0.0)  # >= 0 but for rounding
        self._stats["kl"].append(float((k3 * mask).sum() / tokens))
        return (loss, {"logprobs": logp}) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        for key, values in self._stats.items():
            if values:
                logs[key] = sum(values) / len(values)
                values.clear()
        super().log(logs, *args, **kwargs)


class OnlineRL(Recipe):
    name = "online_rl"
    config_class = OnlineRLConfig
    min_group_size = 2  # a lone sample has no group baseline to compare against (baseline: group)

    def experience(self) -> ExperienceSpec:
        spec = super().experience()
        # A batch baseline needs no groups: every sample compares with the round's mean.
        return dataclasses.replace(spec, min_group_size=1) if self.config.baseline == "batch" else spec

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> TISTrainer:
        c = self.config
        assert isinstance(c, OnlineRLConfig)
        self._cuts = CutStats()
        dataset, self._counts = rl_examples(snapshot.samples(), c.scale_rewards, c.max_length, self._cuts,
                                            baseline=c.baseline)
        if len(dataset) == 0:
            raise ValueError(f"snapshot {snapshot.id}: no sample has a non-zero advantage ({self._counts})")
        args = TrainingArguments(**self.training_args(output_dir, dataset), remove_unused_columns=False)
        return TISTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate(tokenizer.pad_token_id),
                          is_cap=c.is_cap)

    def extra_metrics(self, trainer: Any) -> dict[str, Any]:
        logged = [h for h in trainer.state.log_history if "is_ratio" in h]
        last = {k: logged[-1][k] for k in ("is_ratio", "is_truncated")} if logged else {}
        return {**self._counts, **self._cuts.as_metrics(), **last}
