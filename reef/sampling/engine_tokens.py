"""Token-exact samples from the running engine, for experience a recipe makes itself (exploration
rollouts): each choice's prompt and completion token ids, its behaviour logprobs (vLLM's,
untempered) and the message as vLLM's tool-call parser read it.

Through an `EngineSession` (reef.sampling.engine): its adapters (the policy loaded under a
temporary name) and its share of the engine (reef.sampling.sharing), which bounds how many of
these sequences the engine holds beside the users' at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from reef.core.chat import CHAT_PATH, chat_body
from reef.sampling.completion import Completion
from reef.sampling.engine import EngineSession, GateEngineError
from reef.scenario.environment import reply_text


@dataclass(frozen=True)
class EngineSample:
    """One sampled choice: its tokens (`completion.text` is the reply as a reward reads it, tool calls
    written as `<tool_call>` markup) and the assistant message the engine answered."""

    completion: Completion
    message: dict[str, Any]


def read_samples(data: dict[str, Any]) -> list[EngineSample]:
    """The choices of a chat completion asked with `return_token_ids` and `logprobs`."""
    prompt = [int(t) for t in data.get("prompt_token_ids") or []]
    out = []
    for choice in sorted(data["choices"], key=lambda c: int(c.get("index", 0))):
        message = dict(choice.get("message") or {})
        content = (choice.get("logprobs") or {}).get("content") or []
        ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs = [float(item["logprob"]) for item in content]
        out.append(EngineSample(Completion(
            prompt_ids=prompt, completion_ids=ids, text=reply_text(message),
            finish_reason=choice.get("finish_reason") or "stop",
            logprobs=logprobs if len(logprobs) == len(ids) else None), message))
    return out


async def token_samples(session: EngineSession, model: str, messages: list[dict[str, Any]], *,
                        tools: list[dict[str, Any]] | None = None, tool_choice: Any = None, n: int,
                        max_tokens: int, temperature: float, seed: int | None = None,
                        structured_outputs: dict[str, Any] | None = None) -> list[EngineSample]:
    """`n` samples of one chat from `model` (a name `session.prepare` gave), at `temperature` with no
    top-k/top-p (the model's own distribution). `tool_choice: "required"` makes vLLM's guided
    decoding write a call, `structured_outputs` (a scenario's reply format) a reply of that shape;
    left None with tools, an engine started without a tool-call parser gets `"none"` (the tools stay
    in the prompt, the reply is text)."""
    body = chat_body(model, messages, n=n, max_tokens=max_tokens, temperature=temperature, seed=seed, tools=tools,
                     tool_choice=tool_choice, top_p=1.0, top_k=0, logprobs=True, return_token_ids=True,
                     structured_outputs=structured_outputs)
    async with session.share.slot(n):
        response = await _post(session, body)
        if response.status_code == 400 and "tool choice" in response.text and tool_choice is None and tools:
            response = await _post(session, {**body, "tool_choice": "none"})
    if response.status_code >= 400:
        raise GateEngineError(f"{model} answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        return read_samples(response.json())
    except (ValueError, KeyError, TypeError) as exc:
        raise GateEngineError(f"{model} answered a malformed reply ({exc!r}): {response.text[:300]}") from exc


async def _post(session: EngineSession, body: dict[str, Any]) -> httpx.Response:
    try:
        return await session.http.post(CHAT_PATH, json=body)
    except httpx.HTTPError as exc:
        raise GateEngineError(f"{body['model']}: {exc!r}") from exc
