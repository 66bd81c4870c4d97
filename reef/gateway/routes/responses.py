"""`POST /v1/responses`: the OpenAI Responses API (the Codex CLI's and the Agents SDK's), JSON and SSE.

Translated to a chat completions body, served and recorded by the one exchange and rendered as
Responses JSON or events (`reef.gateway.dialects`); the translation is `reef.gateway.wire.responses`.
Errors have the OpenAI shape, as the chat route's do.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway.dialects import ChatCall, serve_dialect
from reef.gateway.state import GatewayState, get_state
from reef.gateway.wire import responses as wire
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
from reef.gateway.wire.errors import error_body

router = APIRouter()
PATH = "/v1/responses"


class ResponsesDialect:
    name = "responses"
    parse = staticmethod(wire.parse)
    from_chat = staticmethod(wire.from_chat)

    @staticmethod
    async def to_chat(st: GatewayState, request: Request, req: wire.ResponsesRequest, scenario: str) -> ChatCall:
        return ChatCall(wire.to_chat(req, st.config.model_name))

    @staticmethod
    def stream(req: Any, record_id: str | None, model: str) -> StreamTranslator:
        return wire.ResponsesStream(req, record_id, model)

    @staticmethod
    def error(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
        return error_body(status, message, param, code)

    @staticmethod
    def context_error(overflow: ContextOverflow) -> dict[str, Any]:
        return error_body(400, overflow.message, "input", "context_length_exceeded")


DIALECT = ResponsesDialect()


@router.post(
    PATH, operation_id="create_response", response_class=Response,
    responses={200: {"description": "the response (JSON), or its SSE event stream ending with "
                                    "`response.completed`, which carries the receipt (`agent_record_id`)",
                     "headers": RESPONSE_RECEIPT, "links": RESPONSE_LINKS,
                     "content": {"application/json": {"schema": {"type": "object"}},
                                 "text/event-stream": {"schema": SSE_EVENT}}},
               **errors(400, 401, 403, 404, 409, 502, 503, 507)},
    openapi_extra={**body(wire.ResponsesRequest), "parameters": [SCENARIO_HEADER, *RECORD_HEADERS], **DATA_PLANE},
)
async def create_response(request: Request) -> Response:
    # Documents the route; requests are served by `reef.gateway.fastpath`, ahead of FastAPI.
    return await serve_dialect(get_state(request), request, DIALECT)
