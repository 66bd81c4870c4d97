"""The OpenAI Responses API (the Codex CLI's and the Agents SDK's), JSON and SSE.

    POST /v1/responses                  a response: translated to a chat completions body, served and
                                        recorded by the one exchange, rendered as Responses JSON or
                                        events (`reef.gateway.dialects`; the translation is
                                        `reef.gateway.wire.responses`)
    GET  /v1/responses/{response_id}    a stored response (`reef.gateway.stored_responses`)

`previous_response_id` continues a stored response: its input and output come before the new
input, and the call joins its session. Errors have the OpenAI shape, as the chat route's do.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway import auth, stored_responses
from reef.gateway.dialects import ChatCall, serve_dialect
from reef.gateway.state import GatewayState, get_state
from reef.gateway.wire import headers as h
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
from reef.gateway.wire.errors import ReefError, error_body

router = APIRouter()
PATH = "/v1/responses"


class ResponsesDialect:
    name = "responses"
    parse = staticmethod(wire.parse)
    from_chat = staticmethod(wire.from_chat)

    @staticmethod
    async def to_chat(st: GatewayState, request: Request, req: wire.ResponsesRequest, scenario: str) -> ChatCall:
        if req.store and not h.capture_of(request):
            raise ReefError(400, f"store: true keeps the response as its record, and {h.CAPTURE}: false records "
                            "nothing", param="store", code="invalid_value")
        if req.previous_response_id is None:
            return ChatCall(wire.to_chat(req, st.config.model_name), params=wire.kept(req))
        found = await stored_responses.find(st, req.previous_response_id, scenario)
        if found is None:
            raise wire.previous_not_found(req.previous_response_id)
        previous, kept = found
        return ChatCall(wire.to_chat(req, st.config.model_name, stored_responses.context(previous, kept)),
                        session_id=previous.session_id, params=wire.kept(req))

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


@router.get(
    PATH + "/{response_id}", operation_id="retrieve_response", response_class=Response,
    responses={200: {"description": "the stored response, as `POST /v1/responses` answered it",
                     "content": {"application/json": {"schema": {"type": "object"}}}},
               **errors(400, 401, 403, 404)},
    openapi_extra={"parameters": [SCENARIO_HEADER], **DATA_PLANE},
)
async def retrieve_response(request: Request, response_id: str) -> Response:
    st = get_state(request)
    scenario = h.scenario_of(request)
    auth.data_key(st.config, request, scenario)
    found = await stored_responses.find(st, response_id, scenario)
    if found is None:
        return Response(orjson.dumps(wire.not_found(response_id)), status_code=404, media_type="application/json")
    return Response(orjson.dumps(stored_responses.as_response(*found)), media_type="application/json")
