"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API (Claude Code's).

A message call is translated to a chat completions body, served and recorded by the one exchange
and rendered as Anthropic JSON or events (`reef.gateway.dialects`); the translation is
`reef.gateway.wire.messages`. Every error has Anthropic's shape (`{"type": "error", "error": ...}`).
Claude Code calls `/v1/messages?beta=true`: the query is not part of the path, and is ignored.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway import auth
from reef.gateway.dialects import ChatCall, serve_dialect
from reef.gateway.state import GatewayState, get_state
from reef.gateway.wire import headers as h
from reef.gateway.wire import messages as wire
from reef.gateway.wire.contract import (
    DATA_PLANE,
    RECORD_HEADERS,
    RESPONSE_LINKS,
    RESPONSE_RECEIPT,
    SCENARIO_HEADER,
    SSE_EVENT,
    body,
    errors,
)
from reef.gateway.wire.dialect import ContextOverflow, StreamTranslator
from reef.gateway.wire.errors import ReefError

router = APIRouter()
PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"


class MessagesDialect:
    name = "messages"
    parse = staticmethod(wire.parse)
    from_chat = staticmethod(wire.from_chat)

    @staticmethod
    async def to_chat(st: GatewayState, request: Request, req: wire.MessagesRequest, scenario: str) -> ChatCall:
        return ChatCall(wire.to_chat(req, st.config.model_name))

    @staticmethod
    def stream(req: Any, record_id: str | None, model: str) -> StreamTranslator:
        return wire.MessagesStream(req, record_id, model)

    @staticmethod
    def error(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
        # Anthropic's errors carry no field: the message names it (Reef's messages always do).
        return wire.error_body(status, message)

    @staticmethod
    def context_error(overflow: ContextOverflow) -> dict[str, Any]:
        return wire.context_error(overflow)


DIALECT = MessagesDialect()
_ANTHROPIC_HEADERS = [
    {"name": "anthropic-version", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "accepted, not acted on"},
    {"name": "anthropic-beta", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "accepted, not acted on"},
]


@router.post(
    PATH, operation_id="create_message", response_class=Response,
    responses={200: {"description": "the message (JSON), or its SSE event stream ending with `message_stop`, "
                                    "which carries the receipt (`agent_record_id`)",
                     "headers": RESPONSE_RECEIPT, "links": RESPONSE_LINKS,
                     "content": {"application/json": {"schema": {"type": "object"}},
                                 "text/event-stream": {"schema": SSE_EVENT}}},
               **errors(400, 401, 403, 404, 409, 502, 503, 507, model=wire.AnthropicError)},
    openapi_extra={**body(wire.MessagesRequest),
                   "parameters": [SCENARIO_HEADER, *RECORD_HEADERS, *_ANTHROPIC_HEADERS], **DATA_PLANE},
)
async def create_message(request: Request) -> Response:
    # Documents the route; requests are served by `reef.gateway.fastpath`, ahead of FastAPI.
    return await serve_dialect(get_state(request), request, DIALECT)


def _estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    # About four characters a token: what a server that cannot tokenize can offer (said in a header).
    return max(1, len(orjson.dumps([messages, tools])) // 4)


@router.post(
    COUNT_PATH, operation_id="count_message_tokens", response_class=Response,
    responses={200: {"description": "`{\"input_tokens\": N}`, counted by the model server's tokenizer and "
                                    "chat template (`x-reef-token-count: estimate` when it has no /tokenize)",
                     "content": {"application/json": {"schema": {"type": "object"}}}},
               **errors(400, 401, 403, 503, model=wire.AnthropicError)},
    openapi_extra={**body(wire.CountTokensRequest), "parameters": [SCENARIO_HEADER, *_ANTHROPIC_HEADERS],
                   **DATA_PLANE},
)
async def count_tokens(request: Request) -> Response:
    st = get_state(request)
    try:
        auth.data_key(st.config, request, h.scenario_of(request))
        req = wire.parse(await request.body(), wire.CountTokensRequest)
        messages, tools = wire.messages_of(req), wire.tools_of(req.tools)
        tokenize: dict[str, Any] = {"model": st.config.model_name, "messages": messages, "add_generation_prompt": True}
        if tools:
            tokenize["tools"] = tools
        status, raw = await st.upstream.post("/tokenize", tokenize)
        counted = orjson.loads(raw).get("count") if status == 200 else None
        if isinstance(counted, int):
            return Response(orjson.dumps({"input_tokens": counted}), media_type="application/json")
        return Response(orjson.dumps({"input_tokens": _estimate(messages, tools)}), media_type="application/json",
                        headers={"x-reef-token-count": "estimate"})
    except ReefError as exc:
        return Response(orjson.dumps(wire.error_body(exc.status, exc.message)), status_code=exc.status,
                        media_type="application/json", headers=exc.headers)
