"""Self-play in the style of Absolute Zero, for any scenario: the model proposes which problem to
practise and solves it; the scenario's reward is the verifier. No recorded traffic
(`needs_experience = False`).

The proposer. Absolute Zero's proposer writes new problems, which needs a model that can write a
well-formed, verifiable problem from scratch; a 1M-parameter chat model cannot, and a problem it
invented would have no fields (answer, tests) for the scenario's reward to check. So here the
proposer CHOOSES: it is shown `choices` tasks drawn from the scenario's `tasks:` (their last user
turn, numbered) and its reply is forced to "Problem <n>", where it writes only the number. Its
policy is the softmax of the number tokens' logits at that position (restricted to the shown
numbers, so every proposal is valid); the rest of the reply is context, never trained. What it
has to learn is which problems, by their text, are worth practising now: a curriculum over the
scenario's own tasks that moves as the solver improves. Tasks of the eval suite are never shown
(they must stay unseen; `eval_tasks_left_out` counts them).

Each round:
  propose  `proposals_per_round` menus of `choices` random tasks; the proposer picks one per menu.
  solve    `solve_attempts` (k) replies per picked task, with the task's own messages.
  reward   solver: the scenario's reward (a reply it cannot score is left out). Proposer:
           learnability, 1 - solve rate when 0 < solve rate < 1, else 0 (too easy or too hard
           teaches nothing; the solve rate is the mean reward of the k attempts).
  update   one optimizer step on both roles: GRPO-style group-relative advantages (the round's
           proposals form the proposer's group, the k attempts at a task a solver group; roles
           keep separate baselines, as in Absolute Zero's task-relative REINFORCE++), on-policy
           policy-gradient losses summed over roles.

`max_steps` is the number of rounds. candidate.json logs per-round proposer and solver rewards.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reef.recipe import Recipe, RecipeConfig, Snapshot
from reef.recipe.policy_gradient import group_advantages, policy_gradient_loss
from reef.recipe.practice import describe, practice_tasks
from reef.sampling.rollout import sample_tasks
from reef.sampling.transformers import chat_prompt_ids
from reef.scenario import Task, environment_for, reward_for

PROPOSER_SYSTEM = "You choose the next problem to practise: one you solve sometimes, but not always."
PROPOSER_HEAD = "Problem "


@dataclass
class SelfPlayConfig(RecipeConfig):
    learning_rate: float = 3e-4
    max_steps: int = 30  # rounds
    proposals_per_round: int = 8
    choices: int = 4  # tasks shown per proposal (at most 9: one number token each)
    solve_attempts: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0
    scale_rewards: bool = True


def learnability(solve_rate: float) -> float:
    return 1.0 - solve_rate if 0.0 < solve_rate < 1.0 else 0.0


class Proposer:
    """The proposer's prompt and its choice policy (see the module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, choices: int) -> None:
        if not 2 <= choices <= 9:
            raise ValueError(f"self_play: choices must be 2..9 (one number token each), got {choices}")
        self.tokenizer = tokenizer
        self.head = tokenizer.encode(PROPOSER_HEAD, add_special_tokens=False)
        self.labels = []
        for n in range(1, choices + 1):
            ids = tokenizer.encode(f"{PROPOSER_HEAD}{n}", add_special_tokens=False)
            if ids[: len(self.head)] != self.head or len(ids) != len(self.head) + 1:
                ids = self.head + tokenizer.encode(str(n), add_special_tokens=False)
            if len(ids) != len(self.head) + 1:
                raise ValueError(f"self_play: the tokenizer does not write {n} as one token")
            self.labels.append(ids[-1])

    def prompt_ids(self, menu: list[Task]) -> list[int]:
        """The chat up to and including the forced "Problem ": the next token is the choice."""
        listing = "\n".join(f"{n}. {describe(t)}" for n, t in enumerate(menu, 1))
        messages = [{"role": "system", "content": PROPOSER_SYSTEM},
                    {"role": "user", "content": f"Problems:\n{listing}\nWhich one do you practise next?"}]
        return chat_prompt_ids(self.tokenizer, messages) + self.head

    def log_probs(self, model: PreTrainedModel, prompts: list[list[int]], max_length: int) -> torch.Tensor:
        """log pi(choice | menu) over the shown numbers, one row per prompt (prompts cut from the left)."""
        prompts = [p[-max_length:] for p in prompts]
        width = max(map(len, prompts))
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
        attention = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
        logits = model(input_ids=ids, attention_mask=attention).logits
        last = logits[torch.arange(len(prompts)), torch.tensor([len(p) - 1 for p in prompts])]
        return last[:, self.labels].float().log_softmax(-1)

    def choose(self, model: PreTrainedModel, prompts: list[list[int]], temperature: float,
               max_length: int) -> list[int]:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logp = self.log_probs(model, prompts, max_length)
        model.train(was_training)
        return torch.multinomial((logp / temperature).softmax(-1), 1).squeeze(-1).tolist()

    def loss(self, model: PreTrainedModel, prompts: list[list[int]], chosen: list[int], advantages: list[float],
             max_length: int) -> torch.Tensor:
        """-A * log pi(choice), averaged over the proposals that carry a signal."""
        kept = [i for i, a in enumerate(advantages) if abs(a) > 1e-8]
        if not kept:
            return torch.zeros((), requires_grad=True)
        logp = self.log_probs(model, [prompts[i] for i in kept], max_length)
        picked = logp[torch.arange(len(kept)), torch.tensor([chosen[i] for i in kept])]
        return -(torch.tensor([advantages[i] for i in kept]) * picked).mean()


def task_name(task: Task, index: int) -> str:
    return str(task["task_id"]) if task.get("task_id") is not None else f"row-{index}"


class SelfPlay(Recipe):
    name = "self_play"
    config_class = SelfPlayConfig
    needs_experience = False

    def fit(self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
            output_dir: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
        c = self.config
        assert isinstance(c, SelfPlayConfig)
        scenario = self.scenario()
        pool, left_out = practice_tasks(scenario)
        reward = reward_for(scenario)
        environment = environment_for(scenario)  # episodes: the environment executes the tool calls
        max_turns = scenario.environment.max_turns if scenario.environment else 1
        if len(pool) < 2:
            raise ValueError(f"self_play: scenario {scenario.name!r} has {len(pool)} practice task(s); "
                             "the proposer needs at least 2 to choose from")
        proposer = Proposer(tokenizer, min(c.choices, len(pool)))
        rng = random.Random(c.seed)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=c.learning_rate,
                                      weight_decay=0.0)
        history: list[dict[str, Any]] = []
        start = time.monotonic()
        model.train()
        for step in range(c.max_steps):
            menus = [rng.sample(range(len(pool)), len(proposer.labels)) for _ in range(c.proposals_per_round)]
            p_prompts = [proposer.prompt_ids([pool[i] for i in menu]) for menu in menus]
            chosen = proposer.choose(model, p_prompts, c.temperature, c.max_length)
            picked = [menu[k] for menu, k in zip(menus, chosen, strict=True)]
            attempts = sample_tasks(model, tokenizer, [pool[i] for i in picked], c.solve_attempts,
                                    environment=environment, max_turns=max_turns, max_new_tokens=c.max_new_tokens,
                                    temperature=c.temperature, max_length=c.max_length)
            flat = reward([pool[i] for i, group in zip(picked, attempts, strict=True) for _ in group],
                          [r.text for group in attempts for r in group])
            scores: list[list[float | None]] = []
            for group in attempts:
                scores.append([s.value for s in flat[: len(group)]])
                flat = flat[len(group):]
            solve_rates = [sum(v for v in g if v is not None) / max(1, sum(v is not None for v in g)) for g in scores]
            p_rewards = [learnability(rate) if any(v is not None for v in g) else 0.0
                         for rate, g in zip(solve_rates, scores, strict=True)]
            loss = proposer.loss(model, p_prompts, chosen, group_advantages(p_rewards, c.scale_rewards), c.max_length)
            s_rollouts, s_adv = [], []
            for group, g in zip(attempts, scores, strict=True):
                scored = [(r, v) for r, v in zip(group, g, strict=True) if v is not None]
                if len(scored) > 1:
                    s_rollouts += [r for r, _ in scored]
                    s_adv += group_advantages([v for _, v in scored], c.scale_rewards)
            if s_rollouts:
                loss = loss + policy_gradient_loss(model, s_rollouts, s_adv, tokenizer.pad_token_id,
                                                   max_length=c.max_length)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            s_all = [v for g in scores for v in g if v is not None]
            history.append({
                "round": step, "proposer_reward": sum(p_rewards) / len(p_rewards),
                "learnable_fraction": sum(r > 0 for r in p_rewards) / len(p_rewards),
                "tasks": sorted({task_name(pool[i], i) for i in picked}),
                "solver_reward": sum(s_all) / len(s_all) if s_all else None,
                "unscored": sum(v is None for g in scores for v in g),
                "loss": loss.item(),
            })
            self.training_log.log(step + 1, loss=loss.item(), proposer_reward=history[-1]["proposer_reward"],
                                  solver_reward=history[-1]["solver_reward"],
                                  learnable_fraction=history[-1]["learnable_fraction"], grad_norm=float(grad_norm),
                                  learning_rate=c.learning_rate)

        def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
            values = [h[key] for h in rows if h[key] is not None]
            return round(sum(values) / len(values), 4) if values else None

        k = max(1, len(history) // 4)  # first vs last quarter of the rounds
        return model, {
            "rounds": len(history), "train_runtime": round(time.monotonic() - start, 3),
            "practice_tasks": len(pool), "eval_tasks_left_out": left_out,
            **{f"{key}_{part}": mean(key, rows) for key in ("proposer_reward", "solver_reward", "learnable_fraction")
               for part, rows in (("first", history[:k]), ("last", history[-k:]))},
            "proposer_rewards": [h["proposer_reward"] for h in history],
            "solver_rewards": [h["solver_reward"] for h in history], "history": history,
        }
