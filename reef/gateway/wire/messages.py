"""Anthropic's Messages API (`POST /v1/messages`, Claude Code's) as a chat completions body and back.

What is translated: `system` (a string or text blocks; `cache_control` ignored), `messages` with
text, image, `tool_use` and `tool_result` blocks (`thinking` blocks are dropped; a `role: "system"`
message, which Claude Code sends, becomes a system message), `tools` with `input_schema` (Anthropic's
server tools such as `web_search_*` are dropped: Reef cannot run them), `tool_choice`
(auto/any/tool/none, `disable_parallel_tool_use`), `max_tokens`, `stop_sequences`, `temperature`,
`top_p`, `top_k`. Accepted and not acted on: `metadata`, `thinking`, `service_tier`, `container`,
any other field, and the `anthropic-version`/`anthropic-beta` headers.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.gateway.wire import headers
from reef.gateway.wire.chunks import NO_DELTA, Chunk
from reef.gateway.wire.completion import UpstreamResponse
from reef.gateway.wire.dialect import ContextOverflow, event, text_of
from reef.gateway.wire.errors import ReefError, from_validation
from reef.gateway.wire.responses import ENGINE_EXTRAS

PATH_PREFIX = "/v1/messages"  # the message calls and count_tokens
_STOP = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                422: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error"}
_SKIPPED_BLOCKS = {"thinking", "redacted_thinking"}


class MessagesRequest(BaseModel):
    """`POST /v1/messages`: what Reef reads; every other field is accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    stream: bool | None = None


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Every error of the Messages API routes: Anthropic's shape."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class CountTokensRequest(BaseModel):
    """`POST /v1/messages/count_tokens`: a Messages request without `max_tokens`."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape: its SDKs raise their typed error (BadRequestError, ...) from it."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def context_error(overflow: ContextOverflow) -> dict[str, Any]:
    # Claude Code recognises Anthropic's own wording, "prompt is too long: N tokens > M maximum".
    prompt = overflow.prompt_tokens if overflow.prompt_tokens is not None else "?"
    limit = overflow.limit if overflow.limit is not None else "?"
    return error_body(400, f"prompt is too long: {prompt} tokens > {limit} maximum (messages: the served "
                      f"model's context is {limit} tokens, and Reef never truncates; {overflow.message})")


def _bad(message: str) -> ReefError:
    return ReefError(400, message, code="invalid_value")


def parse(raw: bytes, model: type[BaseModel] = MessagesRequest) -> Any:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ReefError(400, f"request body is not valid JSON: {exc}") from exc
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc.errors(include_url=False), 400) from exc


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _bad(f"{where}.content must be a string or a list of content blocks")
    return content


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source: dict[str, Any] = block["source"] if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _bad(f"{where}.source must be a base64 or url image source")
    return {"type": "image_url", "image_url": {"url": url}}


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results first (chat wants them right after the calls), then its text."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            result = block.get("content")
            text = text_of(_blocks(result, at)) if result is not None else ""
            if block.get("is_error"):
                text = f"Error: {text}"
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in _SKIPPED_BLOCKS:
            continue
        else:
            raise _bad(f"{at}: a user block is text, image or tool_result (with tool_use_id)")
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use" and isinstance(block.get("id"), str) and isinstance(block.get("name"), str):
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": orjson.dumps(block.get("input") or {}).decode()}})
        elif kind in _SKIPPED_BLOCKS:
            continue
        else:
            raise _bad(f"{where}.content[{j}]: an assistant block is text or tool_use (with id and name)")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    return message


def messages_of(req: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": text_of(_blocks(req.system, "system"))})
    for i, message in enumerate(req.messages):
        where, role = f"messages[{i}]", message.get("role")
        blocks = _blocks(message.get("content"), where)
        if role == "user":
            out += _user(blocks, where)
        elif role == "assistant":
            out.append(_assistant(blocks, where))
        elif role == "system":
            out.append({"role": "system", "content": text_of(blocks)})
        else:
            raise _bad(f"{where}.role must be user, assistant or system")
    if not out:
        raise _bad("messages: at least one message is needed")
    return out


def tools_of(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools or ()):
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web search, code execution, ...): nothing here runs it
        if not isinstance(tool.get("name"), str):
            raise _bad(f"tools[{i}].name must be a string")
        schema = tool.get("input_schema") if isinstance(tool.get("input_schema"), dict) else {"type": "object"}
        fn: dict[str, Any] = {"name": tool["name"], "parameters": schema}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def to_chat(req: MessagesRequest, default_model: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": req.model, "messages": messages_of(req), "max_tokens": req.max_tokens}
    tools = tools_of(req.tools)
    choice = req.tool_choice or {}
    if tools and choice.get("type") != "none":
        body["tools"] = tools
        kind = choice.get("type", "auto")
        if kind == "any":
            body["tool_choice"] = "required"
        elif kind == "tool" and isinstance(choice.get("name"), str):
            body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif kind != "auto":
            raise _bad("tool_choice.type must be auto, any, tool (with name) or none")
        if choice.get("disable_parallel_tool_use") is True:
            body["parallel_tool_calls"] = False
    for ours, theirs in (("stop", req.stop_sequences), ("temperature", req.temperature), ("top_p", req.top_p),
                         ("top_k", req.top_k)):
        if theirs is not None:
            body[ours] = theirs
    extra = req.model_extra or {}
    body.update({k: extra[k] for k in ENGINE_EXTRAS if k in extra and k != "top_k"})
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# --- the answer --------------------------------------------------------------------------------


def message_id(record_id: str | None) -> str:
    # From the record id: a replayed retry answers with the same message id. (None: not recorded.)
    return "msg_" + (record_id or headers.new_id("unrecorded")).removeprefix("rec_")


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}  # the model wrote no JSON object; the record keeps exactly what it wrote
    return value if isinstance(value, dict) else {}


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    return {"input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def from_chat(chat: UpstreamResponse, req: MessagesRequest, record_id: str | None, model: str) -> dict[str, Any]:
    """A chat completion as an Anthropic message."""
    choice = chat.choices[0] if chat.choices else None
    message = (choice.message if choice is not None else None) or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or f"toolu_{len(content)}", "name": fn.get("name", ""),
                        "input": _input(fn.get("arguments") or "")})
    finish_reason = choice.finish_reason if choice is not None else None
    return {"id": message_id(record_id), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": _STOP.get(finish_reason or "stop", "end_turn"),
            "stop_sequence": None, "usage": _usage(chat.usage),
            **({"agent_record_id": record_id} if record_id is not None else {})}


_TEXT_DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT_DELTA_MID = b',"delta":{"type":"text_delta","text":'


class MessagesStream:
    """Chat chunks in, Anthropic's event sequence out; the receipt rides on `message_stop`.

    Anthropic's content blocks come one after another: a block is closed when the next opens."""

    def __init__(self, req: MessagesRequest, record_id: str | None, model: str) -> None:
        self.id, self.model = message_id(record_id), model
        self.started = False
        self.blocks = 0  # blocks opened so far; the open one is the last
        self.open: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat index)
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(None)}
        return [event("message_start", {"type": "message_start", "message": message})]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def _open(self, key: tuple[str, int], block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.open = key
        self.blocks += 1
        return out + [event("content_block_start", {"type": "content_block_start", "index": self.blocks - 1,
                                                    "content_block": block})]

    def feed(self, chunk: Chunk) -> list[bytes]:
        out = self._start()
        if chunk.usage:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            if choice.position() != 0:
                continue
            delta = choice.delta or NO_DELTA
            if delta.content:
                if self.open != ("text", 0):
                    out += self._open(("text", 0), {"type": "text", "text": ""})
                # `event("content_block_delta", {...})` byte for byte, without a dict per token.
                out.append(b"%s%d%s%s}}\n\n" % (_TEXT_DELTA, self.blocks - 1, _TEXT_DELTA_MID,
                                                 orjson.dumps(delta.content)))
            for position, call in enumerate(delta.tool_calls or ()):
                key, fn = ("tool", call.get("index", position)), call.get("function") or {}
                if self.open != key:
                    block: dict[str, Any] = {"type": "tool_use", "id": call.get("id") or f"toolu_{self.blocks}",
                             "name": fn.get("name") or "", "input": {}}
                    out += self._open(key, block)
                if fn.get("arguments"):
                    out.append(event("content_block_delta", {
                        "type": "content_block_delta", "index": self.blocks - 1,
                        "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}}))
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return out

    def finish(self, record_id: str | None) -> list[bytes]:
        out = self._start() + self._close()
        stop = _STOP.get(self.finish_reason or "stop", "end_turn")
        usage = _usage(self.usage)
        out.append(event("message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": stop, "stop_sequence": None},
                                           "usage": {"input_tokens": usage["input_tokens"],
                                                     "output_tokens": usage["output_tokens"]}}))
        receipt = {"agent_record_id": record_id} if record_id is not None else {}
        out.append(event("message_stop", {"type": "message_stop", **receipt}))
        return out

    def fail(self, error: dict[str, Any]) -> list[bytes]:
        message = str(error.get("message") or "the model server failed mid-stream")
        return self._start() + [event("error", {"type": "error", "error": {"type": "api_error", "message": message}})]
