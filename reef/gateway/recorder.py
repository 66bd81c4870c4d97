"""Turning one chat completion exchange into a record's row (`reef.experience.schema.Record`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from reef.experience.schema import RecordRow, content_hash
from reef.gateway.sessions import _text, reply_hashes
from reef.gateway.wire.completion import UpstreamChoice, UpstreamResponse


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` as `ToolCall` rows; arguments stay the JSON text the model wrote (a client
    that resends them parsed gets them serialised)."""
    out = []
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, dict):
            continue
        fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        out.append({"id": _str(call.get("id")), "type": str(call.get("type") or "function"),
                    "name": str(fn.get("name") or ""), "arguments": _str(fn.get("arguments")) or ""})
    return out


def _parts(content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return []
    return [{"type": str(p.get("type", "")), "text": _str(p.get("text"))} for p in content if isinstance(p, dict)]


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A `Message` row."""
    content = m.get("content")
    return {
        "role": str(m.get("role", "")),
        "content": _text(content) if content is not None else None,
        "parts": _parts(content),
        "name": _str(m.get("name")),
        "tool_call_id": _str(m.get("tool_call_id")),
        "tool_calls": _tool_calls(m.get("tool_calls")),
    }


def _tools(tools: Any) -> list[dict[str, Any]]:
    """`Tool` rows."""
    out = []
    for tool in tools if isinstance(tools, list) else ():
        fn: dict[str, Any] = (tool["function"] if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
                              else {})
        if not fn.get("name"):
            continue
        out.append({"type": str(tool.get("type") or "function"), "name": str(fn["name"]),
                    "description": _str(fn.get("description")),
                    "parameters_json": orjson.dumps(fn.get("parameters") or {}).decode()})
    return out


def _choice(c: UpstreamChoice) -> dict[str, Any]:
    """A `Choice` row."""
    message = c.message or {}
    content = message.get("content")
    return {
        "index": c.index,
        "content": _str(content),
        "finish_reason": c.finish_reason,
        "tool_calls": _tool_calls(message.get("tool_calls")),
        "token_ids": c.token_ids or [],
        "logprobs": c.logprob_values(),
    }


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _number(value: Any, kind: type[int] | type[float]) -> int | float | None:
    return None if value is None else kind(value)


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
    # The API the client spoke ("responses", "messages") when not chat completions: the record holds
    # the request translated to a chat body, and this says what it was translated from.
    dialect: str | None = None
    # What of the dialect's request the chat body does not hold (kept as `"reef.request"` in `params_json`).
    params: dict[str, Any] | None = None
    # The upstream replica that answered (several `upstream.urls`); None: the one engine.
    replica: str | None = None


def record_row(ex: Exchange, response: UpstreamResponse, client_json: bytes) -> RecordRow:
    """`client_json`: the response exactly as the client got it (serialized once, sent and stored)."""
    body = ex.body
    messages = body.get("messages") or []
    sent = ex.sent_messages if ex.sent_messages is not None else messages
    choices = [_choice(c) for c in response.choices]
    sent_rows = [_message(m) for m in sent]  # what the model saw, as its prompt token ids do
    usage = response.usage or {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    params = {k: v for k, v in body.items() if k != "messages"}
    if ex.dialect is not None:
        params["reef.dialect"] = ex.dialect
    if ex.params:
        params["reef.request"] = ex.params
    return RecordRow.of({
        "record_id": ex.record_id,
        "scenario": ex.scenario,
        "session_id": ex.session_id,
        "created_at": ex.created_at,
        "operation": "chat",
        "request_model": ex.request_model,
        "response_model": response.model or "",
        "response_id": response.id or "",
        "release_id": ex.release_id,
        "messages": sent_rows,
        "tools": _tools(body.get("tools")),
        "tool_choice": _str(body.get("tool_choice")),
        # Each value of the type its column has: the contract takes 1 for 1.0 and 2.0 for 2.
        "temperature": _number(body.get("temperature"), float),
        "top_p": _number(body.get("top_p"), float),
        "max_tokens": _number(max_tokens, int),
        "choice_count": int(body.get("n") or 1),
        "params_json": orjson.dumps(params).decode(),
        "stream": ex.stream,
        "choices": choices,
        "finish_reasons": [c["finish_reason"] or "" for c in choices],
        "prompt_token_ids": response.prompt_token_ids or [],
        "has_token_ids": ex.has_token_ids,
        "harness_id": ex.harness_id,
        "replica": ex.replica,
        "input_tokens": _count(usage.get("prompt_tokens")),
        "output_tokens": _count(usage.get("completion_tokens")),
        "latency_ms": ex.latency_ms,
        "ttft_ms": ex.ttft_ms,
        "tags": [{"name": k, "value": v} for k, v in sorted(ex.tags.items())],
        "content_hash": content_hash(ex.scenario, sent_rows, choices),
        "body_hash": ex.body_hash,
        # The client's messages: its next request extends those, not the harness's.
        "reply_hashes": reply_hashes(messages, [c.message or {} for c in response.choices], ex.prefix_hash),
        "request_json": orjson.dumps(body).decode(),
        "response_json": client_json.decode(),
    })
