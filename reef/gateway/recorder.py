"""Turning one chat completion exchange into a `Record`.

The gateway always asks the model server for token ids and logprobs (recipes need the exact
behaviour policy), and removes them from what the client sees unless the client asked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from reef.experience.schema import Choice, ContentPart, Message, Record, Tag, Tool, ToolCall, record_content_hash
from reef.gateway.sessions import _text, reply_hashes


@dataclass(frozen=True)
class ClientWants:
    """Which of the fields the gateway adds for itself the client asked for too."""

    logprobs: bool
    token_ids: bool
    usage: bool


def upstream_request(body: dict[str, Any], model: str, token_ids: bool = True,
                     default_max_tokens: int | None = None) -> tuple[dict[str, Any], ClientWants]:
    """The body sent upstream; `token_ids`: the server takes vLLM's `return_token_ids` (a strict
    OpenAI-compatible provider refuses unknown fields, so it only gets what the client sent).
    `default_max_tokens` bounds a chat that names no length: vLLM would otherwise generate up to its
    context length, for each of `n` choices, and one such request can hold a CPU engine for minutes."""
    up = dict(body)
    up["model"] = model
    if default_max_tokens is not None and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        up["max_tokens"] = default_max_tokens
    up["logprobs"] = True
    if token_ids:
        up["return_token_ids"] = True
    usage = True
    if body.get("stream"):
        options = dict(body.get("stream_options") or {})
        usage = bool(options.get("include_usage"))
        options["include_usage"] = True
        up["stream_options"] = options
    wants = ClientWants(bool(body.get("logprobs")), bool(body.get("return_token_ids")), usage)
    return up, wants


def for_client(payload: dict[str, Any], wants: ClientWants, model: str) -> dict[str, Any] | None:
    """The response or chunk as the client should see it; None drops a usage-only chunk.

    `payload` is left as it is (the record keeps the full upstream response): only the top level
    and the choices, which this changes, are copied; nested values are shared, never modified.
    """
    out = dict(payload)
    if out.get("usage") is not None and not wants.usage:
        if not out.get("choices"):
            return None
        out["usage"] = None
    if "model" in out:
        out["model"] = model
    if not wants.token_ids:
        out.pop("prompt_token_ids", None)
    if out.get("choices"):
        choices = []
        for choice in out["choices"]:
            choice = dict(choice)
            if not wants.logprobs:
                choice["logprobs"] = None
            if not wants.token_ids:
                choice.pop("token_ids", None)
            choices.append(choice)
        out["choices"] = choices
    return out


def _logprobs(choice: dict[str, Any]) -> list[float]:
    content = (choice.get("logprobs") or {}).get("content") or ()
    return [float(item["logprob"]) for item in content]


@dataclass
class _ChoiceAcc:
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


class StreamAccumulator:
    """Rebuilds the complete response from streamed chunks, token ids and logprobs included."""

    def __init__(self) -> None:
        self.choices: dict[int, _ChoiceAcc] = {}
        self.prompt_token_ids: list[int] = []
        self.usage: dict[str, Any] | None = None
        self.id = ""
        self.model = ""
        self.created = int(time.time())
        self.first_token_at: float | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        self.id = chunk.get("id", self.id)
        self.model = chunk.get("model", self.model)
        self.created = chunk.get("created", self.created)
        if chunk.get("prompt_token_ids"):
            self.prompt_token_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            acc = self.choices.setdefault(choice.get("index", 0), _ChoiceAcc())
            delta = choice.get("delta") or {}
            # The first generated token, whatever it is: a reply that is only end-of-turn (or only a
            # tool call) has a time to first token too.
            if self.first_token_at is None and (delta.get("content") or delta.get("tool_calls")
                                                or choice.get("token_ids") or choice.get("finish_reason")):
                self.first_token_at = time.perf_counter()
            if delta.get("content"):
                acc.content.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                slot = acc.tool_calls.setdefault(
                    call.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            acc.token_ids.extend(choice.get("token_ids") or ())
            acc.logprobs.extend(_logprobs(choice))
            if choice.get("finish_reason"):
                acc.finish_reason = choice["finish_reason"]

    def response(self) -> dict[str, Any]:
        """The non-streaming response the same exchange would have produced."""
        choices = []
        for index in sorted(self.choices):
            acc = self.choices[index]
            message: dict[str, Any] = {"role": "assistant", "content": "".join(acc.content)}
            if acc.tool_calls:
                message["tool_calls"] = [acc.tool_calls[i] for i in sorted(acc.tool_calls)]
            choices.append({
                "index": index,
                "message": message,
                "logprobs": {"content": [{"logprob": lp} for lp in acc.logprobs]},
                "finish_reason": acc.finish_reason,
                "token_ids": acc.token_ids,
            })
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage,
            "prompt_token_ids": self.prompt_token_ids,
        }


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _tool_calls(calls: Any) -> list[ToolCall]:
    """OpenAI `tool_calls` as columns; arguments stay the JSON text the model wrote (a client that
    resends them parsed gets them serialised)."""
    out = []
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        out.append(ToolCall(id=_str(call.get("id")), type=str(call.get("type") or "function"),
                            name=str(fn.get("name") or ""), arguments=_str(fn.get("arguments")) or ""))
    return out


def _parts(content: Any) -> list[ContentPart]:
    if not isinstance(content, list):
        return []
    return [ContentPart(type=str(p.get("type", "")), text=_str(p.get("text")))
            for p in content if isinstance(p, dict)]


def _message(m: dict[str, Any]) -> Message:
    return Message(
        role=str(m.get("role", "")),
        content=_text(m.get("content")) if m.get("content") is not None else None,
        parts=_parts(m.get("content")),
        name=_str(m.get("name")),
        tool_call_id=_str(m.get("tool_call_id")),
        tool_calls=_tool_calls(m.get("tool_calls")),
    )


def _tools(tools: Any) -> list[Tool]:
    out = []
    for tool in tools if isinstance(tools, list) else ():
        fn = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else {}
        if not fn.get("name"):
            continue
        out.append(Tool(type=str(tool.get("type") or "function"), name=str(fn["name"]),
                        description=_str(fn.get("description")),
                        parameters_json=orjson.dumps(fn.get("parameters") or {}).decode()))
    return out


def _choice(c: dict[str, Any]) -> Choice:
    message = c.get("message") or {}
    return Choice(
        index=c.get("index", 0),
        content=message.get("content"),
        finish_reason=c.get("finish_reason"),
        tool_calls=_tool_calls(message.get("tool_calls")),
        token_ids=c.get("token_ids") or [],
        logprobs=_logprobs(c),
    )


@dataclass
class Exchange:
    """Everything known about one call when it is recorded."""

    record_id: str
    scenario: str
    session_id: str
    release_id: str
    created_at: datetime
    body: dict[str, Any]
    body_hash: str
    request_model: str
    tags: dict[str, str]
    stream: bool
    latency_ms: float
    ttft_ms: float | None
    has_token_ids: bool = True
    harness_id: str | None = None
    # What the model was sent when a harness was applied; the client's own messages are in `body`.
    sent_messages: list[dict[str, Any]] | None = None
    # The last of `prefix_hashes` of the client's messages, computed once for the session lookup.
    prefix_hash: str | None = None


def build_record(ex: Exchange, upstream_response: dict[str, Any], client_json: bytes) -> Record:
    """`client_json`: the response exactly as the client got it (serialized once, sent and stored)."""
    messages = ex.body.get("messages") or []
    sent = ex.sent_messages if ex.sent_messages is not None else messages
    raw_choices = upstream_response.get("choices") or []
    choices = [_choice(c) for c in raw_choices]
    parsed_messages = [_message(m) for m in sent]  # what the model saw, as its prompt token ids do
    usage = upstream_response.get("usage") or {}
    params = {k: v for k, v in ex.body.items() if k != "messages"}
    return Record(
        record_id=ex.record_id,
        scenario=ex.scenario,
        session_id=ex.session_id,
        created_at=ex.created_at,
        request_model=ex.request_model,
        response_model=str(upstream_response.get("model", "")),
        response_id=str(upstream_response.get("id", "")),
        release_id=ex.release_id,
        messages=parsed_messages,
        tools=_tools(ex.body.get("tools")),
        tool_choice=_str(ex.body.get("tool_choice")),
        temperature=ex.body.get("temperature"),
        top_p=ex.body.get("top_p"),
        max_tokens=ex.body.get("max_completion_tokens") or ex.body.get("max_tokens"),
        choice_count=int(ex.body.get("n") or 1),
        params_json=orjson.dumps(params).decode(),
        stream=ex.stream,
        choices=choices,
        finish_reasons=[c.finish_reason or "" for c in choices],
        prompt_token_ids=upstream_response.get("prompt_token_ids") or [],
        has_token_ids=ex.has_token_ids,
        harness_id=ex.harness_id,
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        latency_ms=ex.latency_ms,
        ttft_ms=ex.ttft_ms,
        tags=[Tag(name=k, value=v) for k, v in sorted(ex.tags.items())],
        content_hash=record_content_hash(ex.scenario, parsed_messages, choices),
        body_hash=ex.body_hash,
        # The client's messages: its next request extends those, not the harness's.
        reply_hashes=reply_hashes(messages, [c.get("message") or {} for c in raw_choices], ex.prefix_hash),
        request_json=orjson.dumps(ex.body).decode(),
        response_json=client_json.decode(),
    )
