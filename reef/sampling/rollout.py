"""Self-generated experience for recipes that need no recorded traffic (test-time training,
self-play): sample completions with their token ids (`Rollout`), in process with transformers.
For a scenario with an environment, `sample_episodes` samples whole episodes (the model's turns,
the tool results in between) as one completion whose tool results are context, not actions:
`Rollout.mask` marks the tokens the model chose. The loss over rollouts is
`reef.recipe.policy_gradient`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    # 1 where the model chose the token; empty means every completion token.
    action_mask: list[int] = field(default_factory=list)

    @property
    def mask(self) -> list[int]:
        return self.action_mask or [1] * len(self.completion_ids)


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Rendered, then tokenized without extra special tokens: the ids vLLM serves a chat with."""
    text = tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@torch.no_grad()
def sample(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]], n: int, *,
           max_new_tokens: int, temperature: float = 1.0, batch_size: int = 64,
           max_length: int | None = None) -> list[list[Rollout]]:
    """`n` completions per prompt (ids up to and including the first eos), with plain `generate`
    and no top-k/top-p, so temperature 1 samples the policy the loss differentiates. A prompt
    longer than `max_length - max_new_tokens` is cut from the left (the rollout keeps the cut one)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if max_length is not None:
        room = max(1, max_length - max_new_tokens)
        prompts = [list(p)[-room:] for p in prompts]
    was_training = model.training
    model.eval()
    out: list[list[Rollout]] = []
    for start in range(0, len(prompts), max(1, batch_size // n)):
        batch = list(prompts[start : start + max(1, batch_size // n)])
        width = max(map(len, batch))
        gen = model.generate(
            input_ids=torch.tensor([[pad] * (width - len(p)) + p for p in batch]),
            attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch]),
            max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
            num_return_sequences=n, pad_token_id=pad, eos_token_id=eos,
        )
        for i, prompt in enumerate(batch):
            group = []
            for row in gen[i * n : (i + 1) * n, width:].tolist():
                ids = row[: row.index(eos) + 1] if eos in row else row
                group.append(Rollout(prompt, ids, tokenizer.decode(ids, skip_special_tokens=True)))
            out.append(group)
    model.train(was_training)
    return out


def _between_turns(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], reply_at: int,
                   tools: list[dict[str, Any]] | None) -> list[int]:
    """The ids the chat template puts after the model's reply `messages[reply_at]` (past its end
    token) up to the next generation prompt: the tool results and the turn markup."""
    eos = tokenizer.eos_token
    done = tokenizer.apply_chat_template(list(messages[: reply_at + 1]), tools=tools, tokenize=False)
    full = tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True, tokenize=False)
    if not full.startswith(done):
        raise ValueError("the chat template renders a conversation's start differently once it goes on")
    tail = done[done.rfind(eos) + len(eos):] if eos and eos in done else ""
    return tokenizer.encode(tail + full[len(done):], add_special_tokens=False)


def sample_episodes(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[dict[str, Any]],
                    environment: Any, max_turns: int, n: int, *, max_new_tokens: int, temperature: float = 1.0,
                    batch_size: int = 64, max_length: int | None = None) -> list[list[Rollout]]:
    """`n` episodes per task (reef.scenario.environment): each model turn sampled by `sample` on
    exactly the ids the episode holds so far, the tool calls executed by `environment`. A rollout's
    completion is every turn after the task's prompt; `action_mask` is 1 on the model's own tokens
    (tool results and template tokens are 0), `text` is the final reply the reward scores."""
    from reef.scenario import EpisodeState
    from reef.scenario.environment import parse_reply

    eos = tokenizer.eos_token_id
    states = [[EpisodeState(task, environment, max_turns) for _ in range(n)] for task in tasks]
    flat = [state for group in states for state in group]
    prompts = [chat_prompt_ids(tokenizer, s.messages, s.task.get("tools")) for s in flat]
    completions: list[list[int]] = [[] for _ in flat]
    masks: list[list[int]] = [[] for _ in flat]
    while active := [k for k, s in enumerate(flat) if not s.done]:
        got = sample(model, tokenizer, [prompts[k] + completions[k] for k in active], 1,
                     max_new_tokens=max_new_tokens, temperature=temperature, batch_size=batch_size,
                     max_length=max_length)
        for k, (turn,) in zip(active, got, strict=True):
            state = flat[k]
            completions[k] += turn.completion_ids
            masks[k] += [1] * len(turn.completion_ids)
            reply_at = len(state.messages)
            if state.advance(parse_reply(turn.text)):  # tool results came back: the episode goes on
                context = ([eos] if turn.completion_ids[-1:] != [eos] else []) + _between_turns(
                    tokenizer, state.messages, reply_at, state.task.get("tools"))
                completions[k] += context
                masks[k] += [0] * len(context)
    out, at = [], 0
    for group in states:
        out.append([Rollout(prompts[at + j], completions[at + j], s.reply or "", masks[at + j])
                    for j, s in enumerate(group)])
        at += len(group)
    return out


def sample_tasks(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[dict[str, Any]], n: int,
                 *, environment: Any = None, max_turns: int = 1, max_new_tokens: int, temperature: float = 1.0,
                 batch_size: int = 64, max_length: int | None = None) -> list[list[Rollout]]:
    """`n` rollouts per scenario task: episodes through the scenario's `environment` when it has
    one (`reef.scenario.environment_for`), else one reply to the task's chat (with its tools)."""
    if environment is not None:
        return sample_episodes(model, tokenizer, tasks, environment, max_turns, n, max_new_tokens=max_new_tokens,
                               temperature=temperature, batch_size=batch_size, max_length=max_length)
    prompts = [chat_prompt_ids(tokenizer, t["messages"], t.get("tools")) for t in tasks]
    return sample(model, tokenizer, prompts, n, max_new_tokens=max_new_tokens, temperature=temperature,
                  batch_size=batch_size, max_length=max_length)
