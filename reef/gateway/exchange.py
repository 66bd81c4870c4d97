"""One model exchange: admit the call, pick the release, send it to the engine, record it.

Every model call comes here as a chat completions body (the chat route's as the client sent it;
the Responses and Messages APIs' translated by `reef.gateway.dialects`) and gets back a `Served`:
the completion, read once and typed, or an async iterator of its parsed chunks, with the record id
and the release that answered. Each route renders that in its own API, JSON or SSE; nothing the
gateway produced is parsed again. (As vLLM's `OpenAIServing*` classes return a response or a
generator, and a small router per feature renders it.) One path records every dialect, so their
records are token-exact chat records.

A JSON result is returned only once its record is durable; a stream's iterator ends only once its
record is: a route sends its receipt after that, never before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request

from reef.core.clock import utcnow
from reef.core.hashing import sha256_json
from reef.experience.schema import Record, RecordRow
from reef.gateway.harness import served_body
from reef.gateway.recorder import Exchange, record_row
from reef.gateway.sessions import prefix_hashes
from reef.gateway.state import GatewayState
from reef.gateway.transport.replicas import affinity_key
from reef.gateway.transport.upstream import UpstreamError
from reef.gateway.wire import headers as h
from reef.gateway.wire.chunks import Chunk, OtherChunk, StreamAccumulator, decode, of_dict
from reef.gateway.wire.completion import (
    ClientWants,
    UpstreamResponse,
    client_json,
    client_wants,
    for_client,
    read_response,
    upstream_request,
)
from reef.gateway.wire.dialect import ContextOverflow, context_overflow
from reef.gateway.wire.errors import ReefError, log
from reef.registry.schema import ADAPTER_PREFIX
from reef.serving.routing import Pick

_DELIVERY = ("stream", "stream_options")
# Partial records of aborted streams are written by tasks nobody awaits; keep them referenced.
_background: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole completion: typed for the dialects, and as the chat client gets it (the record's copy)."""

    response: UpstreamResponse
    content: bytes


class ChunkStream:
    """A streamed completion: its chunks (`reef.gateway.wire.chunks`), those of one network read
    together. A `failed` chunk is the engine failing mid-stream. Once iteration ends, the record is durable; closed
    before that (the client went away), what was generated is still recorded, in the background.
    `client_shaped`: the chunks are already as the chat client saw them (a replay from the store)."""

    __slots__ = ("_acc", "_batches", "_id", "client_shaped")

    def __init__(self, batches: AsyncIterator[list[Chunk]], acc: StreamAccumulator | None = None,
                 completion_id: str = "", client_shaped: bool = False) -> None:
        self._batches, self._acc, self._id, self.client_shaped = batches, acc, completion_id, client_shaped

    @property
    def completion_id(self) -> str:
        return self._acc.id if self._acc is not None else self._id

    def __aiter__(self) -> AsyncIterator[list[Chunk]]:
        return self._batches

    async def aclose(self) -> None:
        await self._batches.aclose()  # type: ignore[attr-defined]


@dataclass(slots=True)
class Served:
    """What an exchange gives its route: `completion` or `chunks` (the request's `stream`; a replay of
    a JSON call asked again as a stream comes as chunks too)."""

    record_id: str | None  # None: not recorded (`x-reef-capture: false`)
    release_id: str
    model: str  # the model the client named: every answer names it
    wants: ClientWants
    completion: Completion | None = None
    chunks: ChunkStream | None = None
    replayed: bool = False


class Refused(Exception):
    """The engine answered with an error: its status and body as it wrote them; nothing is recorded.
    `overflow`: it was a prompt longer than the context (never truncated)."""

    def __init__(self, status: int, body: bytes, overflow: ContextOverflow | None, captured: bool) -> None:
        super().__init__(f"upstream answered {status}")
        self.status, self.body, self.overflow, self.captured = status, body, overflow, captured


def engine_down(st: GatewayState) -> None:
    """503 with Retry-After while the managed engine restarts (its heads not applied yet)."""
    if st.engine is not None and not st.engine.ready:
        raise ReefError(503, f"the model engine is restarting ({st.engine.last_exit or 'not ready'}); retry shortly",
                        code="engine_unavailable", headers={"Retry-After": str(st.engine.retry_after_s())})


def _route(st: GatewayState, scenario: str, client_model: str) -> tuple[Pick, str]:
    """The route the call takes, and the model name sent upstream."""
    pick = st.routes.pick(scenario)
    # Clients keep naming the base model; the route decides what actually serves it. A release's
    # adapter named directly would answer under another release's label: refused.
    upstream_model = pick.model if client_model in (st.config.model_name, pick.model) else client_model
    if upstream_model.startswith(ADAPTER_PREFIX) and upstream_model != pick.model:
        raise ReefError(404, f"model {client_model!r} is a release adapter; ask for {st.config.model_name!r}",
                        param="model", code="model_not_found")
    return pick, upstream_model


async def exchange(st: GatewayState, request: Request, body: dict[str, Any], scenario: str, started: float, *,
                   dialect: str | None = None, session_id: str | None = None,
                   params: dict[str, Any] | None = None) -> Served:
    """Serve and record one chat completion body, already authorised and validated.

    `dialect`: the client's API when it was not chat completions, and `params` what of its request
    the chat body does not hold, both kept in the record's `params_json`; `session_id`: the session
    the call continues when the client named no session (a Responses `previous_response_id`'s)."""
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
            return _replay(stored, body, stream)
    record_id = client_id or h.new_id("rec")
    client_model = body.get("model") or st.config.model_name
    prefixes = prefix_hashes(body["messages"])  # for the session lookup and the record's reply hashes
    session_id = (session_header or session_id or st.sessions.lookup(scenario, body["messages"], prefixes)
                  or h.new_id("ses"))

    ex = Exchange(
        record_id=record_id, scenario=scenario, session_id=session_id, release_id="", created_at=created_at,
        body=body, body_hash=body_hash, request_model=client_model, tags=h.tags_of(request), stream=stream,
        latency_ms=0.0, ttft_ms=None, has_token_ids=st.upstream.token_ids, prefix_hash=prefixes[-1],
        dialect=dialect, params=params,
    )
    # The session the client named, else the conversation's opening: its turns share an engine's prefix cache.
    key = affinity_key(session_header, body["messages"], prefixes) if st.upstream.several else None
    return await _send(st, ex, started, key)


async def _send(st: GatewayState, ex: Exchange, started: float, key: str | None) -> Served:
    """Send the call on the route it picks, and record it (a stream: once it has ended)."""
    # From picking a route until the engine has the request, a full-weight swap must wait for this
    # request (EngineHold): it then runs entirely on the weights of the release it records.
    await st.hold.enter()
    holding = True
    try:
        pick, upstream_model = _route(st, ex.scenario, ex.request_model)
        ex.release_id = pick.release_id
        ex.harness_id, sent = served_body(st, ex.scenario, pick.harness_id, ex.body)
        ex.sent_messages = sent["messages"]
        if pick.arm is not None:
            st.canaries.assign(ex.record_id, ex.scenario, pick.arm)
        up_body, wants = upstream_request(sent, upstream_model, st.upstream.token_ids,
                                          st.config.limits.default_max_tokens)
        served = Served(ex.record_id, pick.release_id, ex.request_model, wants)

        st.inflight.begin(ex.record_id, ex.scenario, ex.body_hash)
        try:
            if ex.stream:
                ex.replica, batches = await st.upstream.stream_chat(up_body, key)
                # vLLM adds a request to its engine when its stream starts: the first chunk proves it.
                first: list[bytes] = await anext(batches, [])
                st.hold.exit()
                holding = False
                acc = StreamAccumulator()
                served.chunks = ChunkStream(_recorded(st, ex, first, batches, wants, started, acc), acc)
                return served
            ex.replica, raw = await st.upstream.chat(up_body, key)
            st.hold.exit()
            holding = False
            ex.latency_ms = (time.perf_counter() - started) * 1000
            response = read_response(raw)
            content = client_json(raw, wants, ex.request_model)  # once: the same bytes are sent and recorded
            await commit(st, record_row(ex, response, content))
            st.metrics.chat(ex.scenario).latency.observe(time.perf_counter() - started)
            served.completion = Completion(response, content)
            return served
        except UpstreamError as exc:
            st.inflight.finish(ex.record_id, False)
            raise _refused(st, ex, exc) from None
        except BaseException:
            st.inflight.finish(ex.record_id, False)
            raise
    finally:
        if holding:
            st.hold.exit()


def _refused(st: GatewayState, ex: Exchange, exc: UpstreamError) -> Refused:
    st.metrics.requests.labels(ex.scenario, str(exc.status)).inc()
    overflow = context_overflow(exc.status, exc.body)
    if overflow is not None:
        # Refused, never truncated: nothing of it becomes experience; counted and logged.
        kind = ex.dialect or "chat_completions"
        st.context_refused[kind] = st.context_refused.get(kind, 0) + 1
        log.info("refused %s (%s, scenario %s): prompt of %s tokens over the context of %s", ex.record_id, kind,
                 ex.scenario, overflow.prompt_tokens, overflow.limit)
    return Refused(exc.status, exc.body, overflow, captured=True)


async def _uncaptured(st: GatewayState, request: Request, body: dict[str, Any], scenario: str) -> Served:
    """`x-reef-capture: false`: the call served on the scenario's route and harness, nothing recorded
    (no record, no receipt, no session, no canary assignment)."""
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
        pick, upstream_model = _route(st, scenario, client_model)
        _, sent = served_body(st, scenario, pick.harness_id, body)
        up_body, wants = upstream_request(sent, upstream_model, st.upstream.token_ids,
                                          st.config.limits.default_max_tokens)
        served = Served(None, pick.release_id, client_model, wants)
        key = (affinity_key(request.headers.get(h.SESSION), body["messages"], prefix_hashes(body["messages"]))
               if st.upstream.several else None)
        try:
            if body.get("stream"):
                _, batches = await st.upstream.stream_chat(up_body, key)
                st.hold.exit()
                holding = False
                served.chunks = ChunkStream(_passed(batches, wants.logprobs))
                return served
            _, raw = await st.upstream.chat(up_body, key)
            st.hold.exit()
            holding = False
            served.completion = Completion(read_response(raw), client_json(raw, wants, client_model))
            return served
        except UpstreamError as exc:
            raise Refused(exc.status, exc.body, context_overflow(exc.status, exc.body), captured=False) from None
    finally:
        if holding:
            st.hold.exit()


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


def _replay(record: Record, body: dict[str, Any], stream: bool) -> Served:
    """A retry answered from the stored response, without calling the model again."""
    raw = record.response_json.encode()
    served = Served(record.record_id, record.release_id, body.get("model") or record.request_model,
                    client_wants(body), replayed=True)
    if not stream:
        served.completion = Completion(read_response(raw), raw)
        return served
    stored = orjson.loads(raw)
    base = {"id": stored.get("id", ""), "object": "chat.completion.chunk",
            "created": stored.get("created", 0), "model": stored.get("model", "")}
    chunks: list[Chunk] = []
    for choice in stored.get("choices") or ():
        delta = {k: v for k, v in (choice.get("message") or {}).items() if v is not None}
        chunks.append(of_dict({**base, "choices": [{"index": choice.get("index", 0), "delta": delta,
                                                    "logprobs": choice.get("logprobs"),
                                                    "finish_reason": choice.get("finish_reason")}]}))
    if stored.get("usage"):
        chunks.append(of_dict({**base, "choices": [], "usage": stored["usage"]}))
    served.chunks = ChunkStream(_once(chunks), completion_id=base["id"], client_shaped=True)
    return served


async def _once(chunks: list[Chunk]) -> AsyncIterator[list[Chunk]]:
    yield chunks


async def commit(st: GatewayState, record: RecordRow) -> None:
    """Make the record durable, then let retries and reports see it."""
    waited = time.perf_counter()
    try:
        await st.store.append_record(record)
    except BaseException:
        st.inflight.finish(record.record_id, False)
        raise
    st.metrics.durable_wait.observe(time.perf_counter() - waited)
    st.sessions.add(record.scenario, record.reply_hashes, record.session_id)
    st.inflight.finish(record.record_id, True)
    bound = st.metrics.chat(record.scenario)
    bound.records.inc()
    bound.ok.inc()


def _chunks(lines: list[bytes], whole: bool, acc: StreamAccumulator | None = None) -> tuple[list[Chunk], bool]:
    """The `data:` events of one read, and whether the stream's `[DONE]` was among them. `whole`:
    every event parsed whole (the client asked for the logprobs: `reef.gateway.wire.chunks`).
    `acc`: the record, each event fed to it as it is parsed (one pass, once per event of a stream)."""
    out: list[Chunk] = []
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return out, True
        chunk = decode(data, whole)
        # An engine's mid-stream error is passed on, not recorded.
        if acc is not None and (type(chunk) is not OtherChunk or not chunk.failed):
            acc.feed(chunk)
        out.append(chunk)
    return out, False


async def _recorded(st: GatewayState, ex: Exchange, first: list[bytes], batches: AsyncIterator[list[bytes]],
                    wants: ClientWants, started: float, acc: StreamAccumulator) -> AsyncIterator[list[Chunk]]:
    """`first`: the lines of the stream's first read (read before the engine hold was let go)."""
    committing = False
    try:
        whole = wants.logprobs
        chunks, done = _chunks(first, whole, acc)
        if chunks:
            yield chunks
        async for lines in batches:
            if done:
                continue  # read to its end, so that its connection is kept
            chunks, done = _chunks(lines, whole, acc)
            if chunks:
                yield chunks
        committing = True
        await commit(st, _stream_record(ex, acc, wants, started))
        st.metrics.chat(ex.scenario).latency.observe(time.perf_counter() - started)
    finally:
        if not committing:
            # The client went away (or the engine broke) mid-stream: what was generated is still
            # experience, so record it in the background; the client never got a receipt for it.
            task = asyncio.get_running_loop().create_task(
                _abandon(st, batches, _stream_record(ex, acc, wants, started))
            )
            _background.add(task)
            task.add_done_callback(_background.discard)


async def _passed(batches: AsyncIterator[list[bytes]], whole: bool) -> AsyncIterator[list[Chunk]]:
    """An uncaptured stream's chunks; nothing is kept of them."""
    try:
        done = False
        async for lines in batches:
            if done:
                continue  # read to its end, so that its connection is kept
            chunks, done = _chunks(lines, whole)
            if chunks:
                yield chunks
    finally:
        await batches.aclose()  # type: ignore[attr-defined]


def _stream_record(ex: Exchange, acc: StreamAccumulator, wants: ClientWants, started: float) -> RecordRow:
    ex.latency_ms = (time.perf_counter() - started) * 1000
    ex.ttft_ms = (acc.first_token_at - started) * 1000 if acc.first_token_at else None
    full = acc.response(logprobs=wants.logprobs)
    client = for_client(full, ClientWants(wants.logprobs, wants.token_ids, True), ex.request_model)
    assert client is not None
    if not wants.usage:
        client.pop("usage", None)
    return record_row(ex, acc.upstream_response(), orjson.dumps(client))


async def _abandon(st: GatewayState, batches: AsyncIterator[list[bytes]], record: RecordRow) -> None:
    """Close the upstream stream of an aborted relay and keep what it produced."""
    try:
        await batches.aclose()  # type: ignore[attr-defined]
        await commit(st, record)
    except Exception:  # already logged by the store; the stream had failed anyway
        st.inflight.finish(record.record_id, False)
