"""`POST /v1/chat/completions`: one exchange (`reef.gateway.exchange`), rendered as chat completions.

The response (or, for streams, the final receipt event) is sent only after the record is fsynced.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway import auth
from reef.gateway.exchange import ChunkStream, Refused, Served, exchange
from reef.gateway.sse import EventStream, Last
from reef.gateway.state import GatewayState, get_state
from reef.gateway.wire import headers as h
from reef.gateway.wire.chunks import OtherChunk, for_chat_client
from reef.gateway.wire.contract import (
    DATA_PLANE,
    RECORD_HEADERS,
    RESPONSE_LINKS,
    RESPONSE_RECEIPT,
    SCENARIO_HEADER,
    ChatCompletionRequest,
    body,
    errors,
    parse_chat,
)
from reef.gateway.wire.errors import ReefError

router = APIRouter()
_RECORD_ID, _RELEASE_ID, _REPLAYED = (name.encode() for name in (h.RECORD_ID, h.RELEASE_ID, h.REPLAYED))
_UNCAPTURED = (h.CAPTURED.encode(), b"false")
_DONE = b"data: [DONE]\n\n"


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ReefError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ReefError(400, "request body must be a JSON object")
    parse_chat(body)  # validated, but the client's own dict goes upstream: unknown fields pass through
    return body


class _JsonResponse(Response):
    """A JSON response whose raw headers are written here, not derived by Starlette's `init_headers`
    from a dict: the same headers, without its work on every chat call."""

    media_type = "application/json"

    def __init__(self, content: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = 200
        self.background = None
        self.body = content
        self.raw_headers = [*headers, (b"content-length", b"%d" % len(content)), (b"content-type", b"application/json")]


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _receipt(record_id: str, completion_id: str, model: str) -> bytes:
    # Shaped as a chunk with no choices (like the usage chunk), so OpenAI SDKs pass it through;
    # the id is at `chunk.model_extra["agent_record_id"]`.
    return _sse({
        "id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model, "choices": [], "agent_record_id": record_id,
    })


@router.post(
    "/v1/chat/completions", operation_id="chat_completions", response_class=Response,
    responses={200: {"description": "the completion (JSON), or its SSE stream ending with the receipt event",
                     "headers": RESPONSE_RECEIPT, "links": RESPONSE_LINKS,
                     "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
                                 "text/event-stream": {"schema": {"type": "string"}}}},
               **errors(400, 401, 403, 404, 409, 502, 503, 507)},
    openapi_extra={**body(ChatCompletionRequest), "parameters": [SCENARIO_HEADER, *RECORD_HEADERS], **DATA_PLANE},
)
async def chat_completions(request: Request) -> Response:
    # Documents the route; requests are served by `reef.gateway.fastpath`, ahead of FastAPI.
    return await serve_chat(get_state(request), request)


async def serve_chat(st: GatewayState, request: Request) -> Response:
    started = time.perf_counter()
    scenario = h.scenario_of(request)
    auth.data_key(st.config, request, scenario)
    try:
        served = await exchange(st, request, _parse(await request.body()), scenario, started)
    except Refused as exc:
        # Passed through as the engine wrote it; the header says who refused the request.
        headers = {h.ERROR_SOURCE: "upstream"} if exc.captured else {h.ERROR_SOURCE: "upstream", h.CAPTURED: "false"}
        return Response(exc.body, status_code=exc.status, media_type="application/json", headers=headers)
    if served.chunks is not None:
        return EventStream(_events(served, served.chunks), _stream_headers(served))
    assert served.completion is not None
    release = (_RELEASE_ID, served.release_id.encode("latin-1"))
    if served.record_id is None:
        return _JsonResponse(served.completion.content, [release, _UNCAPTURED])
    out = [(_RECORD_ID, served.record_id.encode("latin-1")), release]
    if served.replayed:
        out.append((_REPLAYED, b"true"))
    return _JsonResponse(served.completion.content, out)


def _stream_headers(served: Served) -> dict[str, str]:
    if served.record_id is None:
        return {h.CAPTURED: "false", h.RELEASE_ID: served.release_id, "cache-control": "no-cache"}
    out = {h.RECORD_ID: served.record_id, h.RELEASE_ID: served.release_id, "cache-control": "no-cache",
           "x-accel-buffering": "no"}
    if served.replayed:
        out[h.REPLAYED] = "true"
    return out


async def _events(served: Served, chunks: ChunkStream) -> AsyncIterator[bytes]:
    """The chunks as the client asked for them (an engine's error passed on as it is), then, once the
    record is durable, the receipt event and `[DONE]`."""
    wants, model, shaped = served.wants, served.model, chunks.client_shaped
    try:
        async for batch in chunks:
            out = []
            for chunk in batch:
                if shaped and isinstance(chunk, OtherChunk):
                    out.append(_sse(chunk.source))
                    continue
                relayed = for_chat_client(chunk, wants, model)
                if relayed is not None:
                    out.append(relayed)
            if out:
                yield b"".join(out)
        if served.record_id is None:
            yield Last(_DONE)
        else:
            yield Last(_receipt(served.record_id, chunks.completion_id, model) + _DONE)
    finally:
        await chunks.aclose()
