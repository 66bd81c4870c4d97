"""The on-policy policy-gradient step of recipes that make their own experience (ttt, self_play).

The loss is online_rl's objective without the importance ratio: samples are drawn from the very
weights the next step updates (one optimizer step per fresh batch), so the ratio is exactly 1 at
temperature 1 and there is nothing to correct.

    loss = -sum_it A_i * log pi(y_it) * m_it / sum_it m_it

`m` marks the tokens the model chose; tokens a recipe forces into a completion (a template around
the model's choices) are context, not actions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from reef.recipe.logprobs import completion_logprobs
from reef.recipe.tokens import fit_left
from reef.sampling.completion import Completion


def group_advantages(rewards: Sequence[float], scale: bool = True, eps: float = 1e-4) -> list[float]:
    """GRPO's group-relative advantage: reward minus the group mean (over its std when `scale`)."""
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - mean) / (std + eps) if scale else r - mean for r in rewards]


def policy_gradient_loss(model: PreTrainedModel, rollouts: Sequence[Completion], advantages: Sequence[float],
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
