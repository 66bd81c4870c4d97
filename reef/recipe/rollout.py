"""Self-generated experience for recipes that need no recorded traffic (test-time training,
self-play): sample completions with their token ids, and take on-policy policy-gradient steps.

The loss is online_rl's objective without the importance ratio: samples are drawn from the very
weights the next step updates (one optimizer step per fresh batch), so the ratio is exactly 1 at
temperature 1 and there is nothing to correct.

    loss = -sum_it A_i * log pi(y_it) * m_it / sum_it m_it

`m` marks the tokens the model chose; tokens a recipe forces into a completion (a template around
the model's choices) are context, not actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reef.recipe.logprobs import completion_logprobs
from reef.recipe.tokens import fit_left


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


def group_advantages(rewards: Sequence[float], scale: bool = True, eps: float = 1e-4) -> list[float]:
    """GRPO's group-relative advantage: reward minus the group mean (over its std when `scale`)."""
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - mean) / (std + eps) if scale else r - mean for r in rewards]


def policy_gradient_loss(model: PreTrainedModel, rollouts: Sequence[Rollout], advantages: Sequence[float],
                         pad_id: int, max_length: int | None = None) -> torch.Tensor:
    """The on-policy loss above over a batch; zero-advantage rollouts are left out (no signal).
    Longer than `max_length`: the prompt is cut from the left (`reef.recipe.tokens.fit_left`)."""
    kept = [(r, a) for r, a in zip(rollouts, advantages, strict=True) if abs(a) > 1e-8 and r.completion_ids]
    if not kept:
        return torch.zeros((), requires_grad=True)
    seqs, masks = [], []
    for r, _ in kept:
        drop, keep = fit_left(r.prompt_ids, r.completion_ids, max_length)[:2] if max_length else (0, None)
        prompt = r.prompt_ids[drop:]
        seqs.append(prompt + r.completion_ids[:keep])
        masks.append([0] * len(prompt) + r.mask[:keep])
    width = max(map(len, seqs))
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    adv = torch.tensor([a for _, a in kept], dtype=torch.float32).unsqueeze(-1)
    logp, start = completion_logprobs(model, ids, attention, mask)
    mask = mask[:, start:]
    return -(adv * logp * mask).sum() / mask.sum().clamp(min=1.0)
