"""Self-play in the style of Absolute Zero: one model proposes tasks in a verifiable domain (the
demo's single-digit addition) and solves them; no recorded traffic (`needs_experience = False`).

Each round:
  propose  `proposals_per_round` tasks "What is a + b?": the reply is forced to that template
           and the model writes the two operand tokens (a 1M-parameter chat model cannot write a
           well-formed problem from scratch; only its two choices are trained, the template is
           context). An operand that is not one digit makes the proposal invalid.
  verify   Python computes a + b; a proposal that is a held-out eval pair is dropped (reward 0,
           never solved or trained on), so the eval suite stays unseen.
  solve    `solve_attempts` (k) replies per valid task, with the demo prompt; reward 1 if correct.
  reward   solver: correctness. Proposer: learnability, 1 - solve rate when 0 < solve rate < 1,
           else 0 (too easy or too hard teaches nothing); `invalid_reward` for invalid proposals.
  update   one optimizer step on both roles: GRPO-style group-relative advantages (all proposals
           of a round form the proposer's group, the k attempts at a task a solver group; roles
           keep separate baselines, as in Absolute Zero's task-relative REINFORCE++), with the
           on-policy loss in `reef.recipe.rollout`, summed over roles.

`max_steps` is the number of rounds. candidate.json logs per-round proposer and solver rewards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reef.demo import task as demo
from reef.recipe import Recipe, RecipeConfig, Snapshot
from reef.recipe.rollout import Rollout, chat_prompt_ids, group_advantages, policy_gradient_loss, sample

PROPOSER_PROMPT = [{"role": "system", "content": "You write addition problems."},
                   {"role": "user", "content": "Write a new addition problem."}]


@dataclass
class SelfPlayConfig(RecipeConfig):
    learning_rate: float = 3e-4
    max_steps: int = 30  # rounds
    proposals_per_round: int = 8
    solve_attempts: int = 4
    max_new_tokens: int = 8
    temperature: float = 1.0
    invalid_reward: float = -0.5
    scale_rewards: bool = True


@torch.no_grad()
def propose(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, n: int,
            temperature: float) -> list[tuple[Rollout, int | None, int | None]]:
    """`n` proposals: (rollout, a, b), a/b None when the model wrote something other than a digit."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    prompt, head, plus, tail = chat_prompt_ids(tokenizer, PROPOSER_PROMPT), enc("What is "), enc(" + "), enc("?")
    was_training = model.training
    model.eval()
    seqs = torch.tensor([prompt + head] * n)
    chosen = []
    for forced in (plus, []):  # write a, then " + ", write b
        logits = model(input_ids=seqs).logits[:, -1].float() / temperature
        token = torch.multinomial(logits.softmax(-1), 1)
        chosen.append(token.squeeze(-1).tolist())
        seqs = torch.cat([seqs, token, torch.tensor([forced] * n, dtype=torch.long).view(n, -1)], dim=1)
    model.train(was_training)
    out = []
    for a, b in zip(*chosen, strict=True):
        ids = head + [a] + plus + [b] + tail + [tokenizer.eos_token_id]
        mask = [0] * len(head) + [1] + [0] * len(plus) + [1] + [0] * (len(tail) + 1)
        digits = [tokenizer.decode([t]) for t in (a, b)]
        va, vb = (int(d) if len(d) == 1 and d.isdigit() else None for d in digits)
        out.append((Rollout(prompt, ids, tokenizer.decode(ids, skip_special_tokens=True), mask), va, vb))
    return out


def learnability(solve_rate: float) -> float:
    return 1.0 - solve_rate if 0.0 < solve_rate < 1.0 else 0.0


class SelfPlay(Recipe):
    name = "self_play"
    config_class = SelfPlayConfig
    needs_experience = False

    def fit(self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
            output_dir: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
        c = self.config
        assert isinstance(c, SelfPlayConfig)
        held_out = {t.task_id for t in demo.eval_tasks()}
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=c.learning_rate,
                                      weight_decay=0.0)
        history: list[dict[str, Any]] = []
        start = time.monotonic()
        model.train()
        for step in range(c.max_steps):
            proposals = propose(model, tokenizer, c.proposals_per_round, c.temperature)
            tasks = {i: demo.make_task(a, b, 0) for i, (_, a, b) in enumerate(proposals)
                     if a is not None and b is not None}
            tasks = {i: t for i, t in tasks.items() if t.task_id not in held_out}
            attempts = sample(model, tokenizer, [chat_prompt_ids(tokenizer, t.messages) for t in tasks.values()],
                              c.solve_attempts, max_new_tokens=c.max_new_tokens, temperature=c.temperature)
            solved = {i: [demo.score(t, r.text) for r in group]
                      for (i, t), group in zip(tasks.items(), attempts, strict=True)}
            valid = [a is not None and b is not None for _, a, b in proposals]
            p_rewards = [learnability(sum(solved[i]) / len(solved[i])) if i in solved
                         else 0.0 if valid[i] else c.invalid_reward for i in range(len(proposals))]
            loss = policy_gradient_loss(model, [p for p, _, _ in proposals],
                                        group_advantages(p_rewards, c.scale_rewards), tokenizer.pad_token_id)
            s_rollouts = [r for group in attempts for r in group]
            s_adv = [a for rewards in solved.values() for a in group_advantages(rewards, c.scale_rewards)]
            if s_rollouts:
                loss = loss + policy_gradient_loss(model, s_rollouts, s_adv, tokenizer.pad_token_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            s_all = [s for rewards in solved.values() for s in rewards]
            history.append({
                "round": step, "proposer_reward": sum(p_rewards) / len(p_rewards),
                "valid_fraction": sum(valid) / len(valid), "held_out_dropped": sum(valid) - len(tasks),
                "learnable_fraction": sum(r > 0 for r in p_rewards) / len(p_rewards),
                "tasks": sorted({t.task_id for t in tasks.values()}),
                "solver_reward": sum(s_all) / len(s_all) if s_all else None, "loss": loss.item(),
            })

        def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
            values = [h[key] for h in rows if h[key] is not None]
            return round(sum(values) / len(values), 4) if values else None

        k = max(1, len(history) // 4)  # first vs last quarter of the rounds
        return model, {
            "rounds": len(history), "train_runtime": round(time.monotonic() - start, 3),
            **{f"{key}_{part}": mean(key, rows) for key in ("proposer_reward", "solver_reward", "valid_fraction")
               for part, rows in (("first", history[:k]), ("last", history[-k:]))},
            "proposer_rewards": [h["proposer_reward"] for h in history],
            "solver_rewards": [h["solver_reward"] for h in history], "history": history,
        }
