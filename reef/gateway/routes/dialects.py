"""Serving a call in another API dialect through the chat route's one serving and recording path.

A dialect's request is translated to a chat completions body and served by
`reef.gateway.routes.chat.serve_body`, which records it exactly as it records a chat call (the
engine's token ids and logprobs, the session, the receipt, idempotent retries, the harness and the
canary route all apply unchanged). Its answer is translated back: JSON, or the relay's SSE chunks
as the dialect's events. Every failure is answered in the dialect's own error shape, so its SDK
raises its typed error; a prompt larger than the model's context gets the dialect's context-length
error and is counted in `GET /reef/status` (`context_refused`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from reef.experience.wal import WalError
from reef.gateway import auth
from reef.gateway.routes.chat import serve_body
from reef.gateway.state import GatewayState
from reef.gateway.wire import headers as h
from reef.gateway.wire.contract import parse_chat
from reef.gateway.wire.dialect import (
    ContextOverflow,
    StreamTranslator,
    context_overflow,
    translate_stream,
    upstream_message,
)
from reef.gateway.wire.errors import ReefError, log, store_error_response

# One event of a dialect's stream, as OpenAPI 3.1 tools parse `text/event-stream` (named events).
SSE_EVENT = {"type": "object", "required": ["event", "data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
_KEPT = (h.RECORD_ID, h.RELEASE_ID, h.REPLAYED, h.ERROR_SOURCE, h.CAPTURED, "retry-after")


class Dialect(Protocol):
    name: str

    def parse(self, raw: bytes) -> Any: ...

    def to_chat(self, req: Any, default_model: str) -> dict[str, Any]: ...

    def from_chat(self, chat: dict[str, Any], req: Any, record_id: str | None) -> dict[str, Any]: ...

    def stream(self, req: Any, record_id: str | None, model: str) -> StreamTranslator: ...

    def error(self, status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]: ...

    def context_error(self, overflow: ContextOverflow) -> dict[str, Any]: ...


def _kept(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k in _KEPT}


def _error(d: Dialect, status: int, message: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(d.error(status, message, param, code)), status_code=status,
                    media_type="application/json", headers=headers)


async def serve_dialect(st: GatewayState, request: Request, d: Dialect) -> Response:
    started = time.perf_counter()
    try:
        scenario = h.scenario_of(request)
        auth.data_key(st.config, request, scenario)
        req = d.parse(await request.body())
        chat = d.to_chat(req, st.config.model_name)
        parse_chat(chat)  # a translation the chat contract refuses is the client's 400, never a 5xx
        served = await serve_body(st, request, chat, scenario, started, dialect=d.name)
        return _translate(d, req, served, str(chat.get("model")))
    except ReefError as exc:
        return _error(d, exc.status, exc.message, exc.param, exc.code, exc.headers)
    except WalError as exc:
        stored = store_error_response(exc)
        detail = orjson.loads(stored.body)["error"]
        return _error(d, stored.status_code, detail["message"], code=detail["code"], headers=_kept(stored))
    except ClientDisconnect:
        return Response(status_code=499)  # nobody is there to read it
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(d, 500, "internal error in the Reef gateway; see the server log")


def _translate(d: Dialect, req: Any, served: Response, model: str) -> Response:
    headers = _kept(served)
    if isinstance(served, StreamingResponse):
        record_id = served.headers.get(h.RECORD_ID)  # none: not recorded (x-reef-capture: false)
        body: AsyncIterator[bytes] = served.body_iterator  # type: ignore[assignment]
        return StreamingResponse(translate_stream(body, d.stream(req, record_id, model)),
                                 media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})
    raw = bytes(served.body)
    if served.status_code == 200:
        return Response(orjson.dumps(d.from_chat(orjson.loads(raw), req, served.headers.get(h.RECORD_ID))),
                        media_type="application/json", headers=headers)
    overflow = context_overflow(served.status_code, raw)  # counted by serve_body
    if overflow is not None:
        return Response(orjson.dumps(d.context_error(overflow)), status_code=400, media_type="application/json",
                        headers=headers)
    return _error(d, served.status_code, upstream_message(raw), headers=headers)
