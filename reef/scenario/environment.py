"""A scenario's environment: what executes the model's tool calls in a multi-turn episode.

A scenario with `environment: {factory: "module:function", max_turns: 4}` is answered in episodes,
by the gate (eval), by `reef simulate` (the client executes the tools, as a real agent would) and by
the rollout helper (self-generated experience):

    model -> tool call -> environment -> tool result -> model -> ... -> final answer -> reward

The factory (imported like a reward, from the scenario's `base_dir` too) is called with no
arguments and returns an object with

    execute(task: dict, call: ToolCall) -> str     # the tool result the model reads next

`task` is the eval or training row (its hidden fields are the environment's state). An episode
ends at the first reply without a tool call, or after `max_turns` model turns; the reward scores
the final reply's text (a reply that still calls a tool shows its calls as text, so a verifier
looking for an answer finds none). `EpisodeState` is the one episode loop; callers only supply the
model's next message, one at a time (the engine) or in batches (transformers).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

Task = dict[str, Any]
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: Any  # the decoded JSON arguments (a dict), or the text when it is not JSON


class Environment(Protocol):
    def execute(self, task: Task, call: ToolCall) -> str: ...


class ToolEnvironmentError(ValueError):
    """The environment could not be loaded, or returned something that is not a tool result."""


def load_environment(ref: str, base_dir: Path | None = None) -> Environment:
    from reef.scenario.reward import RewardError, import_ref

    try:
        factory = import_ref(ref, base_dir)
    except RewardError as exc:
        raise ToolEnvironmentError(str(exc)) from exc
    if not callable(factory):
        raise ToolEnvironmentError(f"{ref} is not callable")
    env = factory()
    if not callable(getattr(env, "execute", None)):
        raise ToolEnvironmentError(f"{ref}() gave {type(env).__name__}, which has no execute(task, call) method")
    return env


def reply_text(message: dict[str, Any]) -> str:
    """A chat reply as the reward sees it: the content, then each tool call the way Hermes-style
    templates write them (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`)."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = fn.get("arguments")
        text += f"\n<tool_call>\n{json.dumps({'name': fn.get('name'), 'arguments': arguments})}\n</tool_call>"
    return text


def parse_reply(text: str) -> dict[str, Any]:
    """Generated text -> an OpenAI assistant message, reading Hermes `<tool_call>` JSON the way vLLM's
    `hermes` parser does (for replies sampled without an engine). A call that is not valid JSON
    leaves the whole text as content, as the parser does."""
    calls = []
    for k, match in enumerate(_TOOL_CALL.finditer(text)):
        try:
            obj = json.loads(match.group(1))
        except ValueError:
            return {"role": "assistant", "content": text}
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return {"role": "assistant", "content": text}
        arguments = obj.get("arguments", {})
        calls.append({"id": f"call_{k}", "type": "function", "function": {
            "name": obj["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    if not calls:
        return {"role": "assistant", "content": text}
    content = text[: text.find("<tool_call>")].strip()
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def _call_of(raw: dict[str, Any], k: int) -> ToolCall:
    fn = raw.get("function") or {}
    arguments: Any = fn.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return ToolCall(id=raw.get("id") or f"call_{k}", name=str(fn.get("name") or ""), arguments=arguments)


@dataclass
class EpisodeState:
    """One episode: the conversation so far, advanced by each model reply until it is done."""

    task: Task
    environment: Environment
    max_turns: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    reply: str | None = None  # the final reply's text, once done

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages = [dict(m) for m in self.task["messages"]]

    @property
    def done(self) -> bool:
        return self.reply is not None

    def advance(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """Take the model's reply (an assistant message); execute its tool calls unless this was the
        last turn. Returns the tool messages appended (empty when the episode is over)."""
        message = {"role": "assistant", "content": message.get("content"),
                   **({"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {})}
        self.messages.append(message)
        self.turns += 1
        calls = message.get("tool_calls") or []
        if not calls or self.turns >= self.max_turns:
            self.reply = reply_text(message)
            return []
        results = []
        for k, raw in enumerate(calls):
            call = _call_of(raw, k)
            content = self.environment.execute(self.task, call)
            if not isinstance(content, str):
                raise ToolEnvironmentError(f"execute() returned {type(content).__name__}, not the tool result text")
            results.append({"role": "tool", "tool_call_id": call.id, "content": content})
        self.tool_calls += len(calls)
        self.messages += results
        return results
