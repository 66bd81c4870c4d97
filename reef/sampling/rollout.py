"""Self-generated experience for recipes that need no recorded traffic (test-time training,
self-play, next_turn's fresh targets): completions with their token ids from the policy being
trained, drawn from torch's one training stream (never reseeded), `batch_size` sequences per
`generate` call. A scenario with an environment gives whole episodes, each one completion whose
tool results are context, not actions (`Completion.mask`). The loss over them is
`reef.recipe.policy_gradient`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reef.sampling.completion import Completion
from reef.sampling.episodes import run_episodes
from reef.sampling.transformers import TransformersSampler, chat_prompt_ids


def sample(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]], n: int, *,
           max_new_tokens: int, temperature: float = 1.0, batch_size: int = 64,
           max_length: int | None = None) -> list[list[Completion]]:
    """`n` completions per prompt (token ids), a prompt longer than `max_length - max_new_tokens`
    cut from the left."""
    sampler = TransformersSampler(model, tokenizer, batch_size=batch_size // n, max_length=max_length)
    return sampler.sample_ids(prompts, n, max_new_tokens=max_new_tokens, temperature=temperature)


def sample_tasks(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[dict[str, Any]], n: int,
                 *, environment: Any = None, max_turns: int = 1, max_new_tokens: int, temperature: float = 1.0,
                 batch_size: int = 64, max_length: int | None = None) -> list[list[Completion]]:
    """`n` completions per scenario task: episodes through the scenario's `environment` when it has
    one (`reef.scenario.environment_for`), else one reply to the task's chat (with its tools)."""
    if environment is None:
        prompts = [chat_prompt_ids(tokenizer, t["messages"], t.get("tools")) for t in tasks]
        return sample(model, tokenizer, prompts, n, max_new_tokens=max_new_tokens, temperature=temperature,
                      batch_size=batch_size, max_length=max_length)
    sampler = TransformersSampler(model, tokenizer, batch_size=batch_size, max_length=max_length)
    return run_episodes(sampler, tasks, environment, max_turns, n, max_new_tokens=max_new_tokens,
                        temperature=temperature, exact_ids=True)
