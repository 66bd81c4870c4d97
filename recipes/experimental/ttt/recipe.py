"""Test-time training on ONE problem, in the style of TTT-Discover: sample -> score -> update, in
rounds, keeping an archive of the best solutions found; the output is the best solution (in
candidate.json's metrics) and the weights trained on the way there (a LoRA adapter by default).

Objective: the entropic one, which favours the best samples rather than the mean. A round's
group is its `samples_per_round` fresh samples plus the archive's `replay` best solutions (so a
solution once found keeps being reinforced when a round misses it), and each gets

    A_i = exp(beta * r_i) / mean_j exp(beta * r_j) - 1

(the gradient of (1/beta) log E[exp(beta R)] with a baseline): beta -> 0 is plain REINFORCE
with a mean baseline; a large beta gives the best sample(s) nearly all the positive weight.
beta is fixed here (TTT-Discover adapts it per batch). With a 0/1 reward only the step size
depends on beta, and Adam with gradient clipping evens that out; a graded reward is where the
weighting can show.

No recorded traffic: `needs_experience = False`, so the snapshot is empty (it pins scenario and
head release for lineage). The problem is one row of the scenario's `tasks:` named by `task_id`
(the row's `task_id` field, or its index; unset: the first row); a task of the scenario's eval
suite is refused (it must stay unseen). Replies are scored by the scenario's reward (`reward`:
another `module:function` instead, e.g. a graded one); a reply it cannot score is left out of the
update. Budget: `max_steps` rounds of one optimizer step each, cut short by `time_budget_s`, or
by `stop_at_score` once the archive's best reaches it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reef.recipe import Recipe, RecipeConfig, Snapshot
from reef.recipe.policy_gradient import policy_gradient_loss
from reef.recipe.practice import find_task
from reef.sampling.completion import Completion
from reef.sampling.rollout import sample_tasks
from reef.scenario import RewardFn, Task, environment_for, reward_for
from reef.scenario.reward import function_reward


@dataclass
class TTTConfig(RecipeConfig):
    kind: str = "lora"
    learning_rate: float = 2e-3
    lora_r: int = 16
    lora_alpha: int = 32
    max_steps: int = 16  # rounds
    task_id: str | int | None = None  # a row of the scenario's tasks: its task_id field or index; None: row 0
    reward: str | None = None  # module:function instead of the scenario's reward
    samples_per_round: int = 16
    max_new_tokens: int = 12
    temperature: float = 1.0
    beta: float = 2.0
    replay: int = 2
    archive_size: int = 16
    time_budget_s: float | None = None
    stop_at_score: float | None = None


def entropic_advantages(rewards: list[float], beta: float) -> list[float]:
    top = max(rewards)  # shifted for stability; the ratio is unchanged
    w = [math.exp(beta * (r - top)) for r in rewards]
    mean = sum(w) / len(w)
    return [x / mean - 1.0 for x in w]


class TTT(Recipe):
    name = "ttt"
    config_class = TTTConfig
    needs_experience = False

    def problem(self) -> tuple[Task, int, RewardFn]:
        """The task to practise, its row in the scenario's tasks, and the reward that scores replies."""
        c = self.config
        assert isinstance(c, TTTConfig)
        scenario = self.scenario()
        task, index = find_task(scenario, c.task_id)
        return task, index, function_reward(c.reward, scenario.base_dir) if c.reward else reward_for(scenario)

    def fit(self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
            output_dir: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
        c = self.config
        assert isinstance(c, TTTConfig)
        task, task_index, reward = self.problem()
        unscored = 0
        scenario = self.scenario()
        environment = environment_for(scenario)  # episodes: the environment executes the tool calls
        max_turns = scenario.environment.max_turns if scenario.environment else 1
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=c.learning_rate,
                                      weight_decay=0.0)
        # text -> entry; a solution found again counts as a hit, not a new entry
        archive: dict[str, dict[str, Any]] = {}
        rollouts: dict[str, Completion] = {}
        history: list[dict[str, Any]] = []
        start = time.monotonic()
        model.train()
        for step in range(c.max_steps):
            if c.time_budget_s is not None and time.monotonic() - start > c.time_budget_s:
                break
            drawn = sample_tasks(model, tokenizer, [task], c.samples_per_round, environment=environment,
                                 max_turns=max_turns, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                                 max_length=c.max_length)[0]
            scored = reward([task] * len(drawn), [r.text for r in drawn])
            unscored += sum(s.value is None for s in scored)
            fresh = [r for r, s in zip(drawn, scored, strict=True) if s.value is not None]
            scores = [s.value for s in scored if s.value is not None]
            if not fresh:
                history.append({"round": step, "mean_score": None, "max_score": None, "loss": None,
                                "best_so_far": max((e["score"] for e in archive.values()), default=None)})
                continue
            for r, s in zip(fresh, scores, strict=True):
                entry = archive.setdefault(r.text, {"text": r.text, "score": s, "round": step, "hits": 0})
                entry["hits"] += 1
                rollouts.setdefault(r.text, r)
            best = sorted(archive.values(), key=lambda e: (-e["score"], e["round"]))
            archive = {e["text"]: e for e in best[: max(c.archive_size, c.replay)]}
            replayed = [rollouts[e["text"]] for e in best[: c.replay]]
            group = fresh + replayed
            rewards = scores + [e["score"] for e in best[: c.replay]]
            loss = policy_gradient_loss(model, group, entropic_advantages(rewards, c.beta), tokenizer.pad_token_id,
                                        max_length=c.max_length)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            history.append({"round": step, "mean_score": sum(scores) / len(scores), "max_score": max(scores),
                            "best_so_far": best[0]["score"], "loss": loss.item()})
            self.training_log.log(step + 1, loss=loss.item(), reward=history[-1]["mean_score"],
                                  max_reward=max(scores), best_so_far=best[0]["score"], grad_norm=float(grad_norm),
                                  learning_rate=c.learning_rate)
            if c.stop_at_score is not None and best[0]["score"] >= c.stop_at_score:
                break
        if not archive:
            raise ValueError(f"ttt: the reward scored none of the {c.samples_per_round * len(history)} replies")
        ranked = sorted(archive.values(), key=lambda e: (-e["score"], e["round"]))[: c.archive_size]
        found = [h["round"] for h in history if h["max_score"] is not None and h["max_score"] >= ranked[0]["score"]]
        scored_rounds = [h for h in history if h["mean_score"] is not None]
        return model, {
            "task_id": task.get("task_id", task_index), "task_index": task_index,
            "best_solution": ranked[0]["text"], "best_score": ranked[0]["score"],
            "best_found_round": found[0] if found else None, "rounds": len(history), "archive": ranked,
            "first_round_mean_score": scored_rounds[0]["mean_score"],
            "last_round_mean_score": scored_rounds[-1]["mean_score"], "unscored_replies": unscored,
            "history": history, "train_runtime": round(time.monotonic() - start, 3),
        }
