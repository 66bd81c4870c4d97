"""The OpenAI Responses API (`POST /v1/responses`) as a chat completions body and back.

What is translated: `input` (a string, or items: messages with `input_text`/`output_text` parts,
`developer`/`system` roles, `function_call`, `function_call_output`; `reasoning` items are dropped,
the model never wrote them here), `instructions` (the first system message), function `tools`
(other tool types, such as `web_search` or `local_shell`, are dropped: Reef cannot run them),
`tool_choice`, `max_output_tokens`, `temperature`, `top_p`, `parallel_tool_calls`, `text.format`
(as `response_format`), `user`, `store` and `previous_response_id` (a stored response is its record:
its conversation is prepended to the new input). Accepted and not acted on: `reasoning`, `include`,
`prompt_cache_key`, `client_metadata`, `truncation`, `service_tier`, and any other field
(`metadata` is echoed).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.gateway.wire import headers
from reef.gateway.wire.chunks import NO_DELTA, Chunk
from reef.gateway.wire.completion import UpstreamResponse
from reef.gateway.wire.dialect import event, text_of
from reef.gateway.wire.errors import ReefError, from_validation

_TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "refusal"}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_SKIPPED_ITEMS = {"reasoning"}
# vLLM's own request extensions (an SDK's `extra_body`), passed on as they are: the engine uses them.
# `stream_interval` (vLLM 0.32): tokens per streamed event for this request, as the chat route passes
# it on; fewer events cost the engine and the gateway less per token.
ENGINE_EXTRAS = ("ignore_eos", "top_k", "min_p", "min_tokens", "seed", "repetition_penalty", "stream_interval")


class ResponsesRequest(BaseModel):
    """`POST /v1/responses`: what Reef reads; every other field is accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None
    user: str | None = None


def _bad(message: str, param: str) -> ReefError:
    return ReefError(400, message, param=param, code="invalid_value")


def _content(role: str, content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content parts", f"{where}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text", part.get("refusal")), str):
            parts.append({"type": "text", "text": part.get("text", part.get("refusal"))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str) and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise _bad(f"{where}.content[{j}]: a text part (input_text, output_text) or, from the user, an "
                       "input_image with image_url", f"{where}.content[{j}]")
    # Chat templates want system and assistant content as text; the user's parts keep their shape.
    return parts if role == "user" else text_of(parts)


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
        return messages
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise _bad(f"{where}.role must be one of user, assistant, system, developer", f"{where}.role")
            messages.append({"role": role, "content": _content(role, item.get("content"), where)})
        elif kind == "function_call":
            name, arguments, call_id = item.get("name"), item.get("arguments", ""), item.get("call_id")
            if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call_id, str):
                raise _bad(f"{where}: a function_call needs string call_id, name and arguments", where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            # The model's text and its calls are one assistant turn in chat completions.
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str | list):
                raise _bad(f"{where}: a function_call_output needs a string call_id and output", where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text_of(output)})
        elif kind in _SKIPPED_ITEMS:
            continue
        else:
            raise _bad(f"{where}.type {kind!r} is not supported (message, function_call, function_call_output, "
                       "reasoning)", f"{where}.type")
    if not messages:
        raise _bad("input has no message", "input")
    return messages


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            continue
        if not isinstance(tool.get("name"), str):
            raise _bad(f"tools[{i}].name must be a string", f"tools[{i}].name")
        fn = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: str | dict[str, Any]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}", "tool_choice")


def parse(raw: bytes) -> ResponsesRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ReefError(400, f"request body is not valid JSON: {exc}") from exc
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc.errors(include_url=False), 400) from exc


def to_chat(req: ResponsesRequest, default_model: str, context: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`context`: the stored conversation `previous_response_id` continues (`continued`), placed after
    this request's instructions (the previous ones are not carried over) and before its input."""
    messages = _messages(req)
    if context:
        at = 1 if req.instructions else 0
        messages[at:at] = context
    body: dict[str, Any] = {"model": req.model or default_model, "messages": messages}
    tools = _tools(req.tools or [])
    if tools:
        body["tools"] = tools
        if req.tool_choice is not None:
            body["tool_choice"] = _tool_choice(req.tool_choice)
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    for ours, theirs in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature),
                         ("top_p", req.top_p), ("user", req.user)):
        if theirs is not None:
            body[ours] = theirs
    extra = req.model_extra or {}
    body.update({k: extra[k] for k in ENGINE_EXTRAS if k in extra})
    fmt = (req.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": str(fmt.get("name") or "response"), "schema": fmt["schema"], "strict": bool(fmt.get("strict"))}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# --- the answer --------------------------------------------------------------------------------


def response_id(record_id: str | None) -> str:
    # From the record id: a replayed retry answers with the same response id. (None: not recorded.)
    return "resp_" + (record_id or headers.new_id("unrecorded")).removeprefix("rec_")


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    inp, out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": inp + out}


def _shell(req: ResponsesRequest, record_id: str | None, model: str, created: int, status: str) -> dict[str, Any]:
    return {"id": response_id(record_id), "object": "response", "created_at": created, "status": status,
            "model": model, "output": [], "error": None, "incomplete_details": None,
            "instructions": req.instructions, "metadata": _metadata(req), "parallel_tool_calls": req.parallel_tool_calls
            if req.parallel_tool_calls is not None else True, "temperature": req.temperature, "top_p": req.top_p,
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "max_output_tokens": req.max_output_tokens, "text": req.text or {"format": {"type": "text"}},
            "usage": None, "previous_response_id": req.previous_response_id,
            "store": record_id is not None and req.store is not False}


def _metadata(req: ResponsesRequest) -> dict[str, Any]:
    metadata = (req.model_extra or {}).get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    fn = call.get("function") or {}
    return {"type": "function_call", "id": item_id, "call_id": call.get("id") or item_id, "name": fn.get("name", ""),
            "arguments": fn.get("arguments") or "", "status": status}


def _finish(shell: dict[str, Any], finish_reason: str | None, usage: dict[str, Any] | None) -> None:
    if finish_reason == "length":
        shell["status"] = "incomplete"
        shell["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        shell["status"] = "completed"
    shell["usage"] = _usage(usage)


def from_chat(chat: UpstreamResponse, req: ResponsesRequest, record_id: str | None, model: str) -> dict[str, Any]:
    """A chat completion as a Responses API response."""
    shell = _shell(req, record_id, model, int(chat.created or time.time()), "completed")
    choice = chat.choices[0] if chat.choices else None
    message = (choice.message if choice is not None else None) or {}
    base = shell["id"].removeprefix("resp_")
    if message.get("content") or not message.get("tool_calls"):
        shell["output"].append(_message_item(f"msg_{base}", message.get("content") or ""))
    for n, call in enumerate(message.get("tool_calls") or ()):
        shell["output"].append(_call_item(f"fc_{base}_{n}", call))
    _finish(shell, choice.finish_reason if choice is not None else None, chat.usage)
    if record_id is not None:
        shell["agent_record_id"] = record_id
    return shell


_TEXT_DELTA = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'
_TEXT_DELTA_END = b',"logprobs":[]}\n\n'


class ResponsesStream:
    """Chat chunks in, the Responses event sequence out; the receipt rides on `response.completed`."""

    def __init__(self, req: ResponsesRequest, record_id: str | None, model: str) -> None:
        self.shell = _shell(req, record_id, model, int(time.time()), "in_progress")
        self.base = self.shell["id"].removeprefix("resp_")
        self.seq = 0
        self.started = False
        self.items: list[dict[str, Any]] = []  # in output order
        self.text: dict[str, Any] | None = None
        self.delta_head: bytes | None = None  # the text item's delta events' fixed middle
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event(kind, payload)

    def _text_delta(self, text: str) -> bytes:
        """`_event("response.output_text.delta", ...)`, byte for byte, from the text item's fixed
        bytes: one event per token, and a dict built and serialised whole for each was most of it."""
        assert self.text is not None
        head = self.delta_head
        if head is None:  # one text item per response
            head = self.delta_head = (b',"item_id":' + orjson.dumps(self.text["id"])
                                      + b',"output_index":%d,"content_index":0,"delta":' % self.text["index"])
        self.seq += 1
        return b"%s%d%s%s%s" % (_TEXT_DELTA, self.seq - 1, head, orjson.dumps(text), _TEXT_DELTA_END)

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        return [self._event("response.created", response=self.shell),
                self._event("response.in_progress", response=self.shell)]

    def feed(self, chunk: Chunk) -> list[bytes]:
        out = self._start()
        if chunk.usage:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            if choice.position() != 0:
                continue
            delta = choice.delta or NO_DELTA
            if delta.content:
                if self.text is None:
                    self.text = {"kind": "message", "id": f"msg_{self.base}", "index": len(self.items), "text": ""}
                    self.items.append(self.text)
                    out.append(self._event("response.output_item.added", output_index=self.text["index"],
                                           item={**_message_item(self.text["id"], "", "in_progress"), "content": []}))
                    out.append(self._event("response.content_part.added", item_id=self.text["id"],
                                           output_index=self.text["index"], content_index=0,
                                           part={"type": "output_text", "text": "", "annotations": []}))
                self.text["text"] += delta.content
                out.append(self._text_delta(delta.content))
            for position, call in enumerate(delta.tool_calls or ()):
                out += self._call_delta(call.get("index", position), call)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return out

    def _call_delta(self, index: int, call: dict[str, Any]) -> list[bytes]:
        out = []
        fn = call.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            item_id = f"fc_{self.base}_{len(self.calls)}"
            item = {"kind": "call", "id": item_id, "index": len(self.items), "call_id": call.get("id") or item_id,
                    "name": fn.get("name") or "", "arguments": ""}
            self.calls[index] = item
            self.items.append(item)
            out.append(self._event("response.output_item.added", output_index=item["index"],
                                   item=self._call(item, "in_progress", "")))
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                   output_index=item["index"], delta=fn["arguments"]))
        return out

    @staticmethod
    def _call(item: dict[str, Any], status: str, arguments: str | None = None) -> dict[str, Any]:
        return {"type": "function_call", "id": item["id"], "call_id": item["call_id"], "name": item["name"],
                "arguments": item["arguments"] if arguments is None else arguments, "status": status}

    def finish(self, record_id: str | None) -> list[bytes]:
        out = self._start()
        if not self.items:  # an empty reply is still one (empty) message, as the JSON answer has
            self.text = {"kind": "message", "id": f"msg_{self.base}", "index": 0, "text": ""}
            self.items.append(self.text)
            out.append(self._event("response.output_item.added", output_index=0,
                                   item={**_message_item(self.text["id"], "", "in_progress"), "content": []}))
            out.append(self._event("response.content_part.added", item_id=self.text["id"], output_index=0,
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        final = []
        for item in self.items:
            if item["kind"] == "message":
                part = {"type": "output_text", "text": item["text"], "annotations": [], "logprobs": []}
                out.append(self._event("response.output_text.done", item_id=item["id"], output_index=item["index"],
                                       content_index=0, text=item["text"], logprobs=[]))
                out.append(self._event("response.content_part.done", item_id=item["id"], output_index=item["index"],
                                       content_index=0, part=part))
                done = _message_item(item["id"], item["text"])
            else:
                out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                       output_index=item["index"], name=item["name"], arguments=item["arguments"]))
                done = self._call(item, "completed")
            out.append(self._event("response.output_item.done", output_index=item["index"], item=done))
            final.append(done)
        receipt = {"agent_record_id": record_id} if record_id is not None else {}
        response = {**self.shell, "output": final, **receipt}
        _finish(response, self.finish_reason, self.usage)
        # Always `response.completed` (status "incomplete" when cut at max_output_tokens): agents and
        # the SDKs' stream helpers treat any other final event as a failed turn.
        out.append(self._event("response.completed", response=response, **receipt))
        return out

    def fail(self, error: dict[str, Any]) -> list[bytes]:
        out = self._start()
        message = str(error.get("message") or "the model server failed mid-stream")
        out.append(self._event("error", code="upstream_error", message=message, param=None))
        failed = {**self.shell, "status": "failed", "error": {"code": "server_error", "message": message}}
        out.append(self._event("response.failed", response=failed))
        return out


# --- stored responses ---------------------------------------------------------------------------
# A response is stored as its record (the chat record every call makes, durable before it is
# answered), with what of the request the chat body does not hold kept in its `params_json`.

_ECHOED = ("tool_choice", "max_output_tokens", "temperature", "top_p", "parallel_tool_calls", "text",
           "previous_response_id", "user")


def kept(req: ResponsesRequest) -> dict[str, Any]:
    """What the record keeps of the request (`"reef.request"` in `params_json`) to answer it again
    by id and to continue from it: the chat body holds the rest (the instructions' text, the tools)."""
    out: dict[str, Any] = {"store": req.store is not False}
    if req.instructions:
        out["instructions"] = True  # the chat body's first message
    out.update({k: getattr(req, k) for k in _ECHOED if getattr(req, k) is not None})
    if _metadata(req):
        out["metadata"] = _metadata(req)
    return out


def record_ids(response: str) -> list[str]:
    """The record ids a response id may name (`response_id` made it from either)."""
    if not response.startswith("resp_") or len(response) == len("resp_"):
        return []
    rest = response.removeprefix("resp_")
    return ["rec_" + rest, rest]


def continued(chat: dict[str, Any], request: dict[str, Any], reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation a stored response ends: its chat body's messages without its instructions,
    then its reply as one assistant message, as a client that resent the whole input would send it.
    `request`: what its record kept (`kept`); `reply`: its chat message."""
    messages = list(chat.get("messages") or ())
    if request.get("instructions") and messages:
        messages = messages[1:]
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or ""}
    calls = [{"id": c.get("id"), "type": "function", "function": {
        "name": (c.get("function") or {}).get("name", ""), "arguments": (c.get("function") or {}).get("arguments", "")}}
        for c in reply.get("tool_calls") or ()]
    if calls:
        message["tool_calls"] = calls
    return [*messages, message]


def stored_request(chat: dict[str, Any], request: dict[str, Any]) -> ResponsesRequest:
    """The request a stored response answered, as far as its response echoes it."""
    messages = chat.get("messages") or [{}]
    fields = {k: request[k] for k in (*_ECHOED, "store", "metadata") if k in request}
    if request.get("instructions"):
        fields["instructions"] = messages[0].get("content")
    fields["tools"] = [{"type": "function", "name": fn.get("name"), "description": fn.get("description"),
                        "parameters": fn.get("parameters"), "strict": None}
                       for fn in ((t.get("function") or {}) for t in chat.get("tools") or ())] or None
    return ResponsesRequest.model_construct(input="", **fields)


def not_found(response: str) -> dict[str, Any]:
    """The OpenAI API's answer (404) to a response id it does not hold."""
    return {"error": {"message": f"No response found with id '{response}'.", "type": "invalid_request_error",
                      "param": "response_id", "code": "response_not_found"}}


def previous_not_found(response: str) -> ReefError:
    """The OpenAI API's refusal (400) of a `previous_response_id` it does not hold (or did not store)."""
    return ReefError(400, f"Previous response with id '{response}' not found.", param="previous_response_id",
                     code="previous_response_not_found")
