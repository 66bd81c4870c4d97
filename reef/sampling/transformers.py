"""The transformers backend: `TransformersSampler`, the one in-process `generate` loop (the gate's
offline path, recipes that sample their own experience, offline traffic, the tests' model build,
notebooks, tests), on chats or on exact token ids.

Prompts are left-padded and generated `batch_size` prompts (`n` sequences each) at a time. At
temperature > 0 only the temperature shapes the distribution (no top-k/top-p), so temperature 1
samples the model's own distribution, as vLLM does when asked so; temperature 0 is greedy. A `seed`
reseeds torch's global generator first, so a call repeats; `seed=None` draws on from wherever the
generator is (a training loop's one stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reef.sampling.completion import Chat, Completion, Tools


def render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], tools: Tools | None = None, *,
           generation_prompt: bool = True) -> str:
    """The chat template's text of a conversation (with the next assistant turn's prompt)."""
    return cast(str, tokenizer.apply_chat_template(list(messages), tools=cast(Any, tools), tokenize=False,
                                                   add_generation_prompt=generation_prompt))


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                    tools: Tools | None = None) -> list[int]:
    """Rendered, then tokenized without extra special tokens: the ids vLLM serves a chat with."""
    return tokenizer.encode(render(tokenizer, messages, tools), add_special_tokens=False)


class TransformersSampler:
    """`Sampler` and `TokenSampler` (reef.sampling.completion) on a transformers model in this process.
    A prompt longer than `max_length - max_new_tokens` is cut from the left (the completion keeps the
    cut one); `logprobs` adds each completion token's logprob under the untempered model."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, batch_size: int = 32,
                 max_length: int | None = None, logprobs: bool = False) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_length, self.logprobs = max(1, batch_size), max_length, logprobs

    def prompt_ids(self, messages: Chat, tools: Tools | None = None) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages, tools)

    def sample(self, prompts: Sequence[Chat], n: int, *, max_new_tokens: int, temperature: float,
               seed: int | None = None, tools: Sequence[Tools | None] | None = None) -> list[list[Completion]]:
        ids = [self.prompt_ids(p, tools[k] if tools else None) for k, p in enumerate(prompts)]
        return self.sample_ids(ids, n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)

    @torch.no_grad()
    def sample_ids(self, prompts: Sequence[list[int]], n: int, *, max_new_tokens: int, temperature: float,
                   seed: int | None = None) -> list[list[Completion]]:
        if self.max_length is not None:
            room = max(1, self.max_length - max_new_tokens)
            prompts = [list(p)[-room:] for p in prompts]
        if seed is not None:
            torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        out: list[list[Completion]] = []
        try:
            for start in range(0, len(prompts), self.batch_size):
                out += self._generate(list(prompts[start : start + self.batch_size]), n, max_new_tokens, temperature)
        finally:
            self.model.train(was_training)
        return out

    def between_turns(self, turn: Completion, messages: Chat, reply_at: int, tools: Tools | None = None) -> list[int]:
        """The turn's end token when it was cut short, then what the chat template puts after the
        reply `messages[reply_at]` (past its end token) up to the next generation prompt."""
        tok = self.tokenizer
        closing = [tok.eos_token_id] if turn.completion_ids[-1:] != [tok.eos_token_id] else []
        eos = tok.eos_token
        done = render(tok, messages[: reply_at + 1], tools, generation_prompt=False)
        full = render(tok, messages, tools)
        if not full.startswith(done):
            raise ValueError("the chat template renders a conversation's start differently once it goes on")
        tail = done[done.rfind(eos) + len(eos):] if eos and eos in done else ""
        return closing + tok.encode(tail + full[len(done):], add_special_tokens=False)

    def _generate(self, batch: list[list[int]], n: int, max_new_tokens: int,
                  temperature: float) -> list[list[Completion]]:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        width = max(map(len, batch))
        sampling = temperature > 0
        # transformers types `generate` on each model class (GenerationMixin), not on PreTrainedModel.
        gen = cast(Any, self.model).generate(
            input_ids=torch.tensor([[pad] * (width - len(p)) + p for p in batch]),
            attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch]),
            max_new_tokens=max_new_tokens, do_sample=sampling, num_return_sequences=n,
            temperature=temperature if sampling else None, top_k=0 if sampling else None,
            top_p=1.0 if sampling else None, pad_token_id=pad, eos_token_id=eos,
            output_logits=self.logprobs, return_dict_in_generate=True,
        )
        new = gen.sequences[:, width:]
        logprobs = (torch.stack(gen.logits, dim=1).float().log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
                    if self.logprobs else None)
        rows = new.tolist()
        out = []
        for i, prompt in enumerate(batch):
            group = []
            for r in range(i * n, (i + 1) * n):
                end = rows[r].index(eos) + 1 if eos in rows[r] else len(rows[r])
                ids = rows[r][:end]
                group.append(Completion(prompt, ids, cast(str, self.tokenizer.decode(ids, skip_special_tokens=True)),
                                        "stop" if eos in ids else "length",
                                        logprobs[r, :end].tolist() if logprobs is not None else None))
            out.append(group)
        return out
