"""What asking a model gives back, whichever backend answers: `Completion`, and the `Sampler` protocol
(chats in, `n` completions per chat out) that every backend implements, with `TokenSampler` for a
backend that sees token ids (transformers in process: episodes continued on their exact ids)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Chat = list[dict[str, Any]]  # OpenAI chat messages
Tools = list[dict[str, Any]]  # OpenAI tool definitions, rendered into the chat template


@dataclass(frozen=True)
class Completion:
    """One sampled completion of a prompt. Ids are empty where the backend does not see tokens."""

    prompt_ids: list[int]
    completion_ids: list[int]  # up to and including the end token
    text: str  # decoded without special tokens; an episode's: its final reply, as the reward reads it
    finish_reason: str = "stop"  # "stop": the model ended it; "length": max_new_tokens ran out
    logprobs: list[float] | None = None  # per completion token, the untempered model's (when asked for)
    # 1 where the model chose the token (an episode's tool results are 0); empty: every token.
    action_mask: list[int] = field(default_factory=list)

    @property
    def mask(self) -> list[int]:
        return self.action_mask or [1] * len(self.completion_ids)


class Sampler(Protocol):
    def sample(self, prompts: Sequence[Chat], n: int, *, max_new_tokens: int, temperature: float,
               seed: int | None = None, tools: Sequence[Tools | None] | None = None) -> list[list[Completion]]:
        """`n` completions per chat (temperature 0: greedy, else the model's own distribution at that
        temperature, no top-k/top-p); `tools[i]` is chat i's tool list; `seed` makes it repeatable."""
        ...


class TokenSampler(Sampler, Protocol):
    """A sampler that sees token ids: it renders chats itself and continues given ids exactly."""

    def prompt_ids(self, messages: Chat, tools: Tools | None = None) -> list[int]:
        """The ids a chat is sampled from (rendered with a generation prompt)."""
        ...

    def sample_ids(self, prompts: Sequence[list[int]], n: int, *, max_new_tokens: int, temperature: float,
                   seed: int | None = None) -> list[list[Completion]]:
        """`sample` on prompts given as token ids."""
        ...

    def between_turns(self, turn: Completion, messages: Chat, reply_at: int, tools: Tools | None = None) -> list[int]:
        """The ids that follow the model's `turn` (which is `messages[reply_at]`) up to the next
        generation prompt: the tool results and the turn markup."""
        ...


def texts(groups: Sequence[Sequence[Completion]]) -> list[list[str]]:
    """Each completion's text, grouped as sampled."""
    return [[c.text for c in group] for group in groups]
