"""Serving a call in another API dialect (the Responses API, Anthropic's Messages API).

A dialect's request is translated to a chat completions body and served by the one exchange
(`reef.gateway.exchange`), which records it exactly as it records a chat call (the engine's token
ids and logprobs, the session, the receipt, idempotent retries, the harness and the canary route
all apply unchanged). Its result is rendered in the dialect: the typed completion as its JSON, or
the parsed chunks as its SSE events. Every failure is answered in the dialect's own error shape,
so its SDK raises its typed error; a prompt larger than the model's context gets the dialect's
context-length error and is counted in `GET /reef/status` (`context_refused`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from reef.experience.wal import WalError
from reef.gateway import auth
from reef.gateway.exchange import ChunkStream, Refused, Served, exchange
from reef.gateway.sse import EventStream, Last
from reef.gateway.state import GatewayState
from reef.gateway.wire import headers as h
from reef.gateway.wire.chunks import OtherChunk
from reef.gateway.wire.completion import UpstreamResponse
from reef.gateway.wire.contract import parse_chat
from reef.gateway.wire.dialect import ContextOverflow, StreamTranslator, upstream_message
from reef.gateway.wire.errors import ReefError, log, store_error_response


@dataclass(frozen=True, slots=True)
class ChatCall:
    """A dialect's request as the exchange takes it."""

    body: dict[str, Any]  # the chat completions body
    session_id: str | None = None  # the session it continues, when the dialect names one
    params: dict[str, Any] | None = None  # what of the request the record keeps beside the chat body


class Dialect(Protocol):
    name: str

    def parse(self, raw: bytes) -> Any: ...

    async def to_chat(self, st: GatewayState, request: Request, req: Any, scenario: str) -> ChatCall: ...

    def from_chat(self, chat: UpstreamResponse, req: Any, record_id: str | None,
                  model: str) -> dict[str, Any]: ...

    def stream(self, req: Any, record_id: str | None, model: str) -> StreamTranslator: ...

    def error(self, status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]: ...

    def context_error(self, overflow: ContextOverflow) -> dict[str, Any]: ...


def error(d: Dialect, status: int, message: str, param: str | None = None, code: str | None = None,
          headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(d.error(status, message, param, code)), status_code=status,
                    media_type="application/json", headers=headers)


def _headers(served: Served) -> dict[str, str]:
    out = {h.RELEASE_ID: served.release_id}
    if served.record_id is None:
        out[h.CAPTURED] = "false"
    else:
        out[h.RECORD_ID] = served.record_id
    if served.replayed:
        out[h.REPLAYED] = "true"
    return out


async def serve_dialect(st: GatewayState, request: Request, d: Dialect) -> Response:
    started = time.perf_counter()
    try:
        scenario = h.scenario_of(request)
        auth.data_key(st.config, request, scenario)
        req = d.parse(await request.body())
        call = await d.to_chat(st, request, req, scenario)
        parse_chat(call.body)  # a translation the chat contract refuses is the client's 400, never a 5xx
        served = await exchange(st, request, call.body, scenario, started, dialect=d.name,
                                session_id=call.session_id, params=call.params)
        return render(d, req, served)
    except Refused as exc:
        headers = {h.ERROR_SOURCE: "upstream"} if exc.captured else {h.ERROR_SOURCE: "upstream", h.CAPTURED: "false"}
        if exc.overflow is not None:  # counted by the exchange
            return Response(orjson.dumps(d.context_error(exc.overflow)), status_code=400,
                            media_type="application/json", headers=headers)
        return error(d, exc.status, upstream_message(exc.body), headers=headers)
    except ReefError as exc:
        return error(d, exc.status, exc.message, exc.param, exc.code, exc.headers)
    except WalError as exc:
        stored = store_error_response(exc)
        detail = orjson.loads(stored.body)["error"]
        kept = {k: v for k, v in stored.headers.items() if k == "retry-after"}
        return error(d, stored.status_code, detail["message"], code=detail["code"], headers=kept)
    except ClientDisconnect:
        return Response(status_code=499)  # nobody is there to read it
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error(d, 500, "internal error in the Reef gateway; see the server log")


def render(d: Dialect, req: Any, served: Served) -> Response:
    """The exchange's result in the dialect: its JSON body, or its SSE events."""
    headers = _headers(served)
    if served.chunks is not None:
        return EventStream(_events(d.stream(req, served.record_id, served.model), served.chunks, served.record_id),
                           {**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})
    assert served.completion is not None
    body = d.from_chat(served.completion.response, req, served.record_id, served.model)
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


async def _events(out: StreamTranslator, chunks: ChunkStream, record_id: str | None) -> AsyncIterator[bytes]:
    """The chunks as the dialect's events; the last, with the receipt, once the record is durable.

    Closing this closes the exchange's stream, so a client that goes away mid-stream still leaves
    its record behind. An uncaptured call (`x-reef-capture: false`) has no receipt."""
    failed = False
    try:
        async for batch in chunks:
            events: list[bytes] = []
            for chunk in batch:
                if isinstance(chunk, OtherChunk) and chunk.failed:  # the engine failed mid-stream
                    failed = True
                    detail = chunk.source["error"]
                    events += out.fail(detail if isinstance(detail, dict) else {"message": str(chunk.source)})
                else:
                    events += out.feed(chunk)
            if events:
                yield b"".join(events)
        if record_id is not None or not failed:
            yield Last(b"".join(out.finish(record_id)))
    finally:
        await chunks.aclose()
