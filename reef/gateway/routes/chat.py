"""`POST /v1/chat/completions`: proxy to the model server and record the exchange durably.

The response (or, for streams, the final receipt event) is sent only after the record is fsynced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from reef.core.clock import utcnow
from reef.core.hashing import sha256_json
from reef.experience.schema import Record, RecordRow
from reef.gateway import auth
from reef.gateway.recorder import Exchange, record_row
from reef.gateway.routes.harness import served_body
from reef.gateway.sessions import prefix_hashes
from reef.gateway.state import GatewayState, get_state
from reef.gateway.transport.upstream import UpstreamError
from reef.gateway.wire import headers as h
from reef.gateway.wire.completion import (
    ClientWants,
    StreamAccumulator,
    as_response,
    client_json,
    for_client,
    read_response,
    upstream_request,
)
from reef.gateway.wire.contract import (
    DATA_PLANE,
    RECORD_HEADERS,
    SCENARIO_HEADER,
    ChatCompletionRequest,
    body,
    errors,
    parse_chat,
)
from reef.gateway.wire.dialect import context_overflow
from reef.gateway.wire.errors import ReefError, log
from reef.registry.schema import ADAPTER_PREFIX

router = APIRouter()
_DELIVERY = ("stream", "stream_options")
_RECORD_ID, _RELEASE_ID, _REPLAYED = (name.encode() for name in (h.RECORD_ID, h.RELEASE_ID, h.REPLAYED))
# Partial records of aborted streams are written by tasks nobody awaits; keep them referenced.
_background: set[asyncio.Task[None]] = set()


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


def _json(content: bytes, record_id: str, release_id: str, replayed: bool = False) -> Response:
    headers = [(_RECORD_ID, record_id.encode("latin-1")), (_RELEASE_ID, release_id.encode("latin-1"))]
    if replayed:
        headers.append((_REPLAYED, b"true"))
    return _JsonResponse(content, headers)


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _receipt(record_id: str, completion_id: str, model: str) -> bytes:
    # Shaped as a chunk with no choices (like the usage chunk), so OpenAI SDKs pass it through;
    # the id is at `chunk.model_extra["agent_record_id"]`.
    return _sse({
        "id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model, "choices": [], "agent_record_id": record_id,
    })


def _stream_headers(record_id: str, release_id: str) -> dict[str, str]:
    return {h.RECORD_ID: record_id, h.RELEASE_ID: release_id, "cache-control": "no-cache", "x-accel-buffering": "no"}


async def _replay(record: Record, stream: bool) -> Response:
    """Answer a retry from the stored response, without calling the model again."""
    if not stream:
        return _json(record.response_json.encode(), record.record_id, record.release_id, replayed=True)
    stored = orjson.loads(record.response_json)

    async def events() -> AsyncIterator[bytes]:
        base = {"id": stored.get("id", ""), "object": "chat.completion.chunk",
                "created": stored.get("created", 0), "model": stored.get("model", "")}
        for choice in stored.get("choices") or ():
            delta = {k: v for k, v in (choice.get("message") or {}).items() if v is not None}
            yield _sse({**base, "choices": [{"index": choice.get("index", 0), "delta": delta,
                                             "logprobs": choice.get("logprobs"),
                                             "finish_reason": choice.get("finish_reason")}]})
        if stored.get("usage"):
            yield _sse({**base, "choices": [], "usage": stored["usage"]})
        yield _receipt(record.record_id, base["id"], base["model"])
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**_stream_headers(record.record_id, record.release_id), h.REPLAYED: "true"})


async def _existing(st: GatewayState, record_id: str, scenario: str, body_hash: str) -> Record | None:
    """The stored record a retry refers to, or None for a new id; 409 if the body differs."""
    pending = st.inflight.get(record_id)
    if pending is not None:
        if (pending.scenario, pending.body_hash) != (scenario, body_hash):
            raise ReefError(409, f"record {record_id} is in flight with another request body", param=h.RECORD_ID)
        await st.inflight.wait(record_id, st.config.request_timeout_s)
    known = st.store.record_index(record_id)
    if known is None:
        return None
    if tuple(known) != (scenario, body_hash):
        raise ReefError(409, f"record {record_id} exists with another request body or scenario",
                        param=h.RECORD_ID, code="record_id_conflict")
    record = st.store.get_record(record_id)
    if record is None:  # indexed but unreadable: never silently call the model twice
        raise ReefError(409, f"record {record_id} exists but cannot be read back", param=h.RECORD_ID)
    return record


RESPONSE_RECEIPT = {
    "x-reef-agent-record-id": {"description": "the record's id (the receipt)", "schema": {"type": "string"}},
    "x-reef-release-id": {"description": "the release (weights and harness) that answered",
                          "schema": {"type": "string"}}}
RESPONSE_LINKS = {  # the stateful fuzzing phase follows these from a chat call to its record and reports
    "GetRecord": {"operationId": "get_record", "parameters": {"record_id": "$response.header.x-reef-agent-record-id"}},
    "Report": {"operationId": "report", "requestBody": {"agent_record_id": "$response.header.x-reef-agent-record-id",
                                                        "score": 1.0}},
}


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
    # Documents the route; requests are served by `reef.gateway.routes.fastpath`, ahead of FastAPI.
    return await serve_chat(get_state(request), request)


async def serve_chat(st: GatewayState, request: Request) -> Response:
    started = time.perf_counter()
    scenario = h.scenario_of(request)
    auth.data_key(st.config, request, scenario)
    return await serve_body(st, request, _parse(await request.body()), scenario, started)


async def serve_body(st: GatewayState, request: Request, body: dict[str, Any], scenario: str, started: float,
                     dialect: str | None = None) -> Response:
    """Serve and record one chat completion body, already authorised and validated. The other
    dialects (`reef.gateway.routes.responses`, `.messages`) translate their requests into such a body
    and come through here too: one recording path, so their records are token-exact chat records.
    `dialect`: the client's API when it was not chat completions, kept in the record's `params_json`."""
    created_at = utcnow()
    assert st.admission is not None
    if not h.capture_of(request):
        return await _uncaptured(st, request, body, scenario)
    st.admission.admit(scenario)
    engine_down(st)  # after the client's own mistakes, which are 4xx even while the engine restarts
    # How the answer is delivered is not part of the request's identity: a retry of a broken stream
    # may come back as a plain request, and gets the stored answer either way.
    body_hash = sha256_json([scenario, {k: v for k, v in body.items() if k not in _DELIVERY}])
    stream = bool(body.get("stream"))

    client_id = request.headers.get(h.RECORD_ID)
    session_header = request.headers.get(h.SESSION)
    # An empty header is refused too: it names no session, and the contract says so. Checked before
    # an idempotent replay, so a bad header is a 400 whether or not the call was made before.
    if session_header is not None:
        h.valid_id(session_header, h.SESSION)
    if client_id is not None:
        h.valid_id(client_id, h.RECORD_ID)
        stored = await _existing(st, client_id, scenario, body_hash)
        if stored is not None:
            st.metrics.requests.labels(scenario, "replayed").inc()
            return await _replay(stored, stream)
    record_id = client_id or h.new_id("rec")
    client_model = body.get("model") or st.config.model_name
    prefixes = prefix_hashes(body["messages"])  # for the session lookup and the record's reply hashes
    session_id = session_header or st.sessions.lookup(body["messages"], prefixes) or h.new_id("ses")

    # From picking a route until the engine has the request, a full-weight swap must wait for this
    # request (EngineHold): it then runs entirely on the weights of the release it records.
    await st.hold.enter()
    holding = True
    try:
        pick = st.routes.pick(scenario)
        # Clients keep naming the base model; the route decides what actually serves it. A release's
        # adapter named directly would answer under another release's label: refused.
        upstream_model = pick.model if client_model in (st.config.model_name, pick.model) else client_model
        if upstream_model.startswith(ADAPTER_PREFIX) and upstream_model != pick.model:
            raise ReefError(404, f"model {client_model!r} is a release adapter; ask for {st.config.model_name!r}",
                            param="model", code="model_not_found")
        harness_id, sent = served_body(st, scenario, pick.harness_id, body)
        exchange = Exchange(
            record_id=record_id, scenario=scenario, session_id=session_id, release_id=pick.release_id,
            created_at=created_at, body=body, body_hash=body_hash, request_model=client_model,
            tags=h.tags_of(request), stream=stream, latency_ms=0.0, ttft_ms=None,
            has_token_ids=st.upstream.token_ids, harness_id=harness_id, sent_messages=sent["messages"],
            prefix_hash=prefixes[-1], dialect=dialect,
        )
        if pick.arm is not None:
            st.canaries.assign(record_id, scenario, pick.arm)
        up_body, wants = upstream_request(sent, upstream_model, st.upstream.token_ids,
                                          st.config.limits.default_max_tokens)

        st.inflight.begin(record_id, scenario, body_hash)
        try:
            if stream:
                batches = await st.upstream.stream_chat(up_body)
                # vLLM adds a request to its engine when its stream starts: the first chunk proves it.
                first: list[bytes] = await anext(batches, [])
                st.hold.exit()
                holding = False
                relay = _relay(st, exchange, _prepend(first, batches), wants, started)
                return StreamingResponse(relay, media_type="text/event-stream",
                                         headers=_stream_headers(record_id, pick.release_id))
            raw = await st.upstream.chat(up_body)
            st.hold.exit()
            holding = False
            exchange.latency_ms = (time.perf_counter() - started) * 1000
            response = read_response(raw)
            content = client_json(raw, wants, client_model)  # once: the same bytes are sent and recorded
            await _commit(st, record_row(exchange, response, content))
            st.metrics.chat(scenario).latency.observe(time.perf_counter() - started)
            return _json(content, record_id, pick.release_id)
        except UpstreamError as exc:
            st.inflight.finish(record_id, False)
            st.metrics.requests.labels(scenario, str(exc.status)).inc()
            overflow = context_overflow(exc.status, exc.body)
            if overflow is not None:
                # Refused, never truncated: nothing of it becomes experience; counted and logged.
                kind = dialect or "chat_completions"
                st.context_refused[kind] = st.context_refused.get(kind, 0) + 1
                log.info("refused %s (%s, scenario %s): prompt of %s tokens over the context of %s", record_id,
                         kind, scenario, overflow.prompt_tokens, overflow.limit)
            # Passed through as the engine wrote it; the header says who refused the request.
            return Response(exc.body, status_code=exc.status, media_type="application/json",
                            headers={h.ERROR_SOURCE: "upstream"})
        except BaseException:
            st.inflight.finish(record_id, False)
            raise
    finally:
        if holding:
            st.hold.exit()


_UNCAPTURED = [(h.CAPTURED.encode(), b"false")]


async def _uncaptured(st: GatewayState, request: Request, body: dict[str, Any], scenario: str) -> Response:
    """`x-reef-capture: false`: the call served on the scenario's route and harness, nothing recorded
    (no record, no receipt, no session, no canary assignment); the answer says so in a header."""
    if not st.config.limits.allow_uncaptured:
        raise ReefError(403, f"this server records every call: {h.CAPTURE}: false is not allowed (limits)",
                        param=h.CAPTURE, code="capture_required")
    if request.headers.get(h.RECORD_ID) is not None:
        raise ReefError(400, f"{h.RECORD_ID} names a record, and {h.CAPTURE}: false records nothing",
                        param=h.RECORD_ID)
    engine_down(st)
    client_model = body.get("model") or st.config.model_name
    await st.hold.enter()
    holding = True
    try:
        pick = st.routes.pick(scenario)
        upstream_model = pick.model if client_model in (st.config.model_name, pick.model) else client_model
        if upstream_model.startswith(ADAPTER_PREFIX) and upstream_model != pick.model:
            raise ReefError(404, f"model {client_model!r} is a release adapter; ask for {st.config.model_name!r}",
                            param="model", code="model_not_found")
        _, sent = served_body(st, scenario, pick.harness_id, body)
        up_body, wants = upstream_request(sent, upstream_model, st.upstream.token_ids,
                                          st.config.limits.default_max_tokens)
        release = (_RELEASE_ID, pick.release_id.encode("latin-1"))
        try:
            if body.get("stream"):
                batches = await st.upstream.stream_chat(up_body)
                st.hold.exit()
                holding = False
                return StreamingResponse(_pass(batches, wants, client_model), media_type="text/event-stream",
                                         headers={h.CAPTURED: "false", h.RELEASE_ID: pick.release_id,
                                                  "cache-control": "no-cache"})
            raw = await st.upstream.chat(up_body)
            st.hold.exit()
            holding = False
            read_response(raw)
            return _JsonResponse(client_json(raw, wants, client_model), [release, *_UNCAPTURED])
        except UpstreamError as exc:
            return Response(exc.body, status_code=exc.status, media_type="application/json",
                            headers={h.ERROR_SOURCE: "upstream", h.CAPTURED: "false"})
    finally:
        if holding:
            st.hold.exit()


async def _pass(batches: AsyncIterator[list[bytes]], wants: ClientWants, model: str) -> AsyncIterator[bytes]:
    """An uncaptured stream relayed as the client asked for it; nothing is kept of it."""
    try:
        async for lines in batches:
            out = []
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    out.append(b"data: [DONE]\n\n")
                    continue
                chunk = orjson.loads(data)
                relayed = chunk if "error" in chunk else for_client(chunk, wants, model)
                if relayed is not None:
                    out.append(_sse(relayed))
            if out:
                yield b"".join(out)
    finally:
        await batches.aclose()  # type: ignore[attr-defined]


def engine_down(st: GatewayState) -> None:
    """503 with Retry-After while the managed engine restarts (its heads not applied yet)."""
    if st.engine is not None and not st.engine.ready:
        raise ReefError(503, f"the model engine is restarting ({st.engine.last_exit or 'not ready'}); retry shortly",
                        code="engine_unavailable", headers={"Retry-After": str(st.engine.retry_after_s())})


async def _prepend(first: list[bytes], rest: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes]]:
    try:
        if first:
            yield first
        async for lines in rest:
            yield lines
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


async def _commit(st: GatewayState, record: RecordRow) -> None:
    """Make the record durable, then let retries and reports see it."""
    waited = time.perf_counter()
    try:
        await st.store.append_record(record)
    except BaseException:
        st.inflight.finish(record.record_id, False)
        raise
    st.metrics.durable_wait.observe(time.perf_counter() - waited)
    st.sessions.add(record.reply_hashes, record.session_id)
    st.inflight.finish(record.record_id, True)
    bound = st.metrics.chat(record.scenario)
    bound.records.inc()
    bound.ok.inc()


async def _relay(
    st: GatewayState, ex: Exchange, batches: AsyncIterator[list[bytes]], wants: ClientWants, started: float
) -> AsyncIterator[bytes]:
    acc = StreamAccumulator()
    client_model = ex.request_model
    committing = False
    try:
        done = False
        async for lines in batches:
            out = []
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]" or done:
                    done = True
                    continue
                chunk = orjson.loads(data)
                if "error" in chunk:  # the engine failed mid-stream: pass its error on as it is
                    out.append(_sse(chunk))
                    continue
                acc.feed(chunk)
                relayed = for_client(chunk, wants, client_model)
                if relayed is not None:
                    out.append(_sse(relayed))
            if out:
                yield b"".join(out)
        committing = True
        await _commit(st, _stream_record(ex, acc, wants, started))
        st.metrics.chat(ex.scenario).latency.observe(time.perf_counter() - started)
        yield _receipt(ex.record_id, acc.id, client_model)
        yield b"data: [DONE]\n\n"
    finally:
        if not committing:
            # The client went away (or the engine broke) mid-stream: what was generated is still
            # experience, so record it in the background; the client never got a receipt for it.
            task = asyncio.get_running_loop().create_task(
                _abandon(st, batches, _stream_record(ex, acc, wants, started))
            )
            _background.add(task)
            task.add_done_callback(_background.discard)


def _stream_record(ex: Exchange, acc: StreamAccumulator, wants: ClientWants, started: float) -> RecordRow:
    ex.latency_ms = (time.perf_counter() - started) * 1000
    ex.ttft_ms = (acc.first_token_at - started) * 1000 if acc.first_token_at else None
    full = acc.response()
    client = for_client(full, ClientWants(wants.logprobs, wants.token_ids, True), ex.request_model)
    assert client is not None
    if not wants.usage:
        client.pop("usage", None)
    return record_row(ex, as_response(full), orjson.dumps(client))


async def _abandon(st: GatewayState, batches: AsyncIterator[list[bytes]], record: RecordRow) -> None:
    """Close the upstream stream of an aborted relay and keep what it produced."""
    try:
        await batches.aclose()  # type: ignore[attr-defined]
        await _commit(st, record)
    except Exception:  # already logged by the store; the stream had failed anyway
        st.inflight.finish(record.record_id, False)
