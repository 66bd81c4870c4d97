"""Learning from next-turn signals, with no reports at all (in the style of OpenClaw-RL): in a
session, what the user (or a tool) says after a reply is that reply's reward, and the model
re-prompted with it is a better target to distil into the policy.

The framework hands over sessions of two turns or more (`group_by: session`, `min_group_size: 2`,
no reports needed) and reads their next turns by the scenario's declared rules or judge
(`recipes.next_turn.signals`). Two kinds of training rows, one loss:

- RL: every reply whose next turn was read, with advantage r - mean(r) over the round (a batch
  baseline: sessions rarely share a prompt), truncated importance sampling against the recorded
  logprobs, as in `online_rl` (`rl_coef` scales it).
- Hindsight distillation: for a reply the next turn rejected (r < 0.5), a target for the SAME,
  un-hinted prompt, taken from the model with the hint in context: the recorded reply of the next
  turn (the served model re-prompted with the hint) when its own next turn accepted it; and, with
  `hint_samples` > 0, the best of that many fresh samples from the current model on the hinted
  prompt (the one generate helper, `reef.sampling.rollout.sample`), kept only if the scenario's
  reward scores it at least `min_target_score` (for prompts that are one of the scenario's
  training `tasks:`; never its eval tasks). Loss: cross-entropy on the target's tokens after the
  original prompt (SFT toward the hinted model), times `distill_coef`.

    loss = -[ sum_rl rho * A * w * log pi(y) + distill_coef * sum_distil w * log pi(y*) ] / tokens

Nothing here reads a report: a round on a scenario whose users never report learns from their
follow-ups alone. Limits: a reply whose next turn has not arrived when the snapshot is taken is
consumed without a signal (its session already had two turns); rules see one message, not a
whole exchange.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import polars as pl
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments

from recipes.next_turn.signals import next_turn_signals
from recipes.online_rl.recipe import TISTrainer, collate, rl_examples
from reef.recipe import Recipe, RecipeConfig, Snapshot
from reef.recipe.logprobs import completion_logprobs
from reef.recipe.practice import practice_tasks
from reef.recipe.tokens import CutStats, fit_left
from reef.sampling.rollout import sample
from reef.scenario import ScenarioError, Task, reward_for
from reef.scenario.reward import judge_reward

REJECTED = 0.5  # a next-turn reward below this rejects the reply


@dataclass
class NextTurnConfig(RecipeConfig):
    group_by: str | None = "session"
    drop_duplicates: bool = False  # a repeated reply in another session is another signal
    max_staleness: int | None = 2
    stale_policy: str = "downweight"
    learning_rate: float = 5e-4
    max_steps: int = 40
    is_cap: float = 2.0
    rl_coef: float = 1.0
    distill_coef: float = 1.0
    hint_samples: int = 4  # fresh samples per rejected reply on its hinted prompt; 0: recorded targets only
    min_target_score: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int | None = None  # fresh samples' length; None: the eval suite's max_new_tokens, else 64


def _messages_key(messages: list[dict[str, Any]]) -> str:
    return json.dumps([[m["role"], m.get("content") or ""] for m in messages])


def distil_row(prompt: list[int], target: list[int], weight: float, coef: float, max_length: int,
               cuts: CutStats) -> dict[str, Any]:
    drop, keep, prompt_cut, completion_cut = fit_left(prompt, target, max_length)
    cuts.add(prompt_cut, completion_cut)
    prompt, target = prompt[drop:], target[:keep]
    return {"input_ids": prompt + target, "completion_mask": [0] * len(prompt) + [1] * len(target),
            "behaviour": [0.0] * (len(prompt) + len(target)), "advantage": coef, "weight": weight,
            "score": 1.0, "distil": 1}


class NextTurnTrainer(TISTrainer):
    """online_rl's loss on the RL rows; plain cross-entropy (ratio 1) on the distillation rows."""

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        logp, start = completion_logprobs(model, inputs["input_ids"], inputs["attention_mask"],
                                          inputs["completion_mask"])
        mask = inputs["completion_mask"][:, start:]
        distil = inputs["distil"].unsqueeze(-1).bool()
        log_ratio = (logp.detach() - inputs["behaviour"][:, start:]) * mask
        ratio = torch.exp(log_ratio)
        rho = torch.where(distil, torch.ones_like(ratio), ratio.clamp(max=self.is_cap))
        scale = (inputs["advantage"] * inputs["weight"]).unsqueeze(-1)
        tokens = mask.sum().clamp(min=1.0)
        loss = -(rho * scale * logp * mask).sum() / tokens
        rl_mask = mask * (~distil).float()
        rl_tokens = rl_mask.sum().clamp(min=1.0)
        self._stats["is_ratio"].append(float((ratio * rl_mask).sum() / rl_tokens))
        self._stats["is_truncated"].append(float(((ratio > self.is_cap).float() * rl_mask).sum() / rl_tokens))
        self._stats["advantage_abs"].append(float(inputs["advantage"].abs().mean()))
        self._stats["reward"].append(float(inputs["score"][~inputs["distil"].bool()].mean().nan_to_num(0.0)))
        k3 = (torch.exp(-log_ratio) - 1 + log_ratio).clamp(min=0.0)
        self._stats["kl"].append(float((k3 * rl_mask).sum() / rl_tokens))
        self._stats.setdefault("distil_nll", []).append(
            float(-(logp.detach() * mask * distil.float()).sum() / (mask * distil.float()).sum().clamp(min=1.0)))
        return (loss, {"logprobs": logp}) if return_outputs else loss


def _collate(pad_id: int) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
    base = collate(pad_id)

    def fn(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {**base(batch), "distil": torch.tensor([b["distil"] for b in batch], dtype=torch.long)}

    return fn


class NextTurn(Recipe):
    name = "next_turn"
    config_class = NextTurnConfig
    needs_reports = False
    min_group_size = 2  # a session of one turn has no next turn (yet): it waits, unconsumed
    waits_for = frozenset({"records"})  # its rewards are the next turns, read in the round, not reports

    def signals(self, snapshot: Snapshot) -> pl.DataFrame:
        """The snapshot's replies with their next-turn reward and hinted turn (`recipes.next_turn.signals`)."""
        scenario = self.scenario()
        if scenario.next_turn is None:
            raise ValueError(f"scenario {scenario.name!r} declares no next_turn rules or judge (Scenario.next_turn)")
        spec = scenario.next_turn
        judge = judge_reward(spec.judge) if spec.judge is not None else None
        return next_turn_signals(snapshot.frame(), spec, judge)

    def _fresh_targets(self, rejected: pl.DataFrame, model: PreTrainedModel,
                       tokenizer: PreTrainedTokenizerBase) -> dict[str, list[int]]:
        """record id -> the best fresh sample on its hinted prompt that the scenario's reward accepts."""
        c = self.config
        assert isinstance(c, NextTurnConfig)
        scenario = self.scenario()
        if c.hint_samples <= 0 or rejected.height == 0 or scenario.reward is None:
            return {}
        try:
            tasks, _ = practice_tasks(scenario)
        except ScenarioError:
            return {}
        by_prompt: dict[str, Task] = {_messages_key(t["messages"]): t for t in tasks}
        rows = [r for r in rejected.iter_rows(named=True) if _messages_key(r["messages"]) in by_prompt]
        if not rows:
            return {}
        reward = reward_for(scenario)
        length = c.max_new_tokens or (scenario.eval.max_new_tokens if scenario.eval is not None else 64)
        drawn = sample(model, tokenizer, [r["hinted_prompt_ids"] for r in rows], c.hint_samples,
                       max_new_tokens=length, temperature=c.temperature, max_length=c.max_length)
        out: dict[str, list[int]] = {}
        for row, group in zip(rows, drawn, strict=True):
            task = by_prompt[_messages_key(row["messages"])]
            scores = reward([task] * len(group), [g.text for g in group])
            best = max(((s.value, g) for s, g in zip(scores, group, strict=True) if s.value is not None),
                       key=lambda p: p[0], default=None)
            if best is not None and best[0] >= c.min_target_score and best[1].completion_ids:
                out[row["record_id"]] = best[1].completion_ids
        self._counts["fresh_scored_prompts"] = len(rows)
        return out

    def build_trainer(
        self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, output_dir: Path
    ) -> Trainer:
        c = self.config
        assert isinstance(c, NextTurnConfig)
        signals = self.signals(snapshot)
        read = signals.filter(pl.col("reward").is_not_null())
        self._cuts = CutStats()
        self._counts: dict[str, Any] = {"replies_with_next_turn": signals.height, "next_turn_read": read.height,
                                        "next_turn_unread": signals.height - read.height,
                                        "rejected": read.filter(pl.col("reward") < REJECTED).height,
                                        "accepted": read.filter(pl.col("reward") >= REJECTED).height}
        rl_rows: dict[str, list[Any]] = {}
        if c.rl_coef > 0 and read.height:
            samples = read.select("record_id", "prompt_ids", "completion_ids", "logprobs", "weight",
                                  pl.col("reward").alias("score"), pl.lit("round").alias("group"))
            rl, rl_counts = rl_examples(samples, "none", c.max_length, self._cuts, baseline="batch")
            rl_rows = rl.to_dict()
            rl_rows["advantage"] = [a * c.rl_coef for a in rl_rows["advantage"]]
            rl_rows["distil"] = [0] * len(rl_rows["advantage"])
            self._counts["rl_samples"] = rl_counts["train_samples"]
        rejected = read.filter(pl.col("reward") < REJECTED)
        recorded = rejected.filter(pl.col("hinted_reward") >= REJECTED)
        fresh = self._fresh_targets(rejected, model, tokenizer) if c.distill_coef > 0 else {}
        distil = []
        if c.distill_coef > 0:
            targets = {r: list(t) for r, t in recorded.select("record_id", "hinted_completion_ids").iter_rows()}
            for row in rejected.iter_rows(named=True):
                for target in (targets.get(row["record_id"]), fresh.get(row["record_id"])):
                    if target:
                        distil.append(distil_row(list(row["prompt_ids"]), target, row["weight"], c.distill_coef,
                                                 c.max_length, self._cuts))
        self._counts.update(distil_recorded_targets=recorded.height, distil_fresh_targets=len(fresh),
                            distil_samples=len(distil))
        keys = ("input_ids", "completion_mask", "behaviour", "advantage", "weight", "score", "distil")
        columns = {k: list(rl_rows.get(k, [])) + [d[k] for d in distil] for k in keys}
        if not columns["input_ids"]:
            raise ValueError(f"snapshot {snapshot.id}: no next turn gave a signal to learn from ({self._counts})")
        self._counts["train_samples"] = len(columns["input_ids"])
        dataset = datasets.Dataset.from_dict(columns)
        args = TrainingArguments(**self.training_args(output_dir, dataset), remove_unused_columns=False)
        return NextTurnTrainer(model=model, args=args, train_dataset=dataset,
                               data_collator=_collate(tokenizer.pad_token_id), is_cap=c.is_cap)

    def extra_metrics(self, trainer: Any) -> dict[str, Any]:
        return {**self._counts, **self._cuts.as_metrics()}
