"""`POST /reef/records`: import demonstrations, replies a person (or a stronger model) wrote, as
records with their reward, so a scenario whose base model never earns one has something to learn
from (rft keeps the rewarded records; online_rl skips them, having no behaviour logprobs).

A demonstration becomes the same `Record` a served call gives: the prompt token ids are the
engine's own rendering of the messages (vLLM's `/tokenize`), the completion ids are what the
chat template appends for the reply, and the record carries the tag `reef.source=demonstration`.
Each one is stored with its report, fsynced, before the answer.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.core.clock import utcnow
from reef.core.hashing import sha256_json
from reef.experience.schema import Report
from reef.gateway import auth
from reef.gateway.recorder import Exchange, record_row
from reef.gateway.state import GatewayState, get_state
from reef.gateway.wire import headers as h
from reef.gateway.wire.completion import UpstreamChoice, UpstreamResponse
from reef.gateway.wire.contract import ADMIN, SCENARIO_HEADER, errors
from reef.gateway.wire.errors import ReefError

router = APIRouter()
SOURCE_TAG = "reef.source"


class Message(BaseModel):
    # tool_calls, tool_call_id, name... pass through to the chat template as a chat request's would.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class Demonstration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(min_length=1, description="the prompt, as a chat request sends it")
    completion: str = Field(min_length=1, description="the reply the model should have given")
    tools: list[dict[str, Any]] | None = None
    score: float = Field(default=1.0, allow_inf_nan=False, description="the reward reported for it")

    @field_validator("score", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        # pydantic would take "1" or true; a reward must be an actual number.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("score must be a finite number")
        return value


class ImportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    demonstrations: list[Demonstration] = Field(min_length=1, max_length=256)


class ImportReceipt(BaseModel):
    agent_record_ids: list[str]
    report_ids: list[str]


def _json(raw: bytes) -> dict[str, Any]:
    try:
        got = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return got if isinstance(got, dict) else {}


async def _tokenize(st: GatewayState, body: dict[str, Any], what: str) -> list[int]:
    status, raw = await st.upstream.post("/tokenize", {"model": st.config.model_name, **body})
    if 400 <= status < 500:  # the engine could not render these messages (roles, content it rejects)
        error = _json(raw).get("error")
        message = error.get("message") if isinstance(error, dict) else None
        raise ReefError(400, f"{what}: the engine cannot render these messages ({message or f'HTTP {status}'})",
                        param="demonstrations")
    tokens = _json(raw).get("tokens") if status == 200 else None
    if not isinstance(tokens, list):
        raise ReefError(503, f"the engine has no usable /tokenize (HTTP {status}): demonstrations need the "
                        "engine's own token ids", code="tokenize_unavailable")
    return [int(t) for t in tokens]


async def _token_ids(st: GatewayState, demo: Demonstration, what: str) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) exactly as the engine renders this chat."""
    tools = {"tools": demo.tools} if demo.tools else {}
    messages = [m.model_dump(exclude_none=True) for m in demo.messages]
    prompt = await _tokenize(st, {"messages": messages, "add_generation_prompt": True, **tools}, what)
    reply = {"role": "assistant", "content": demo.completion}
    whole = await _tokenize(st, {"messages": [*messages, reply], "add_generation_prompt": False, **tools},
                            what)
    if whole[:len(prompt)] != prompt or len(whole) == len(prompt):
        raise ReefError(400, f"{what}: the chat template does not render the reply as a continuation of the "
                        "prompt, so its token ids cannot be told apart", param="demonstrations")
    return prompt, whole[len(prompt):]


@router.post("/reef/records", operation_id="import_demonstrations", status_code=201,
             responses=errors(400, 401, 403, 422, 503, 507),
             openapi_extra={"parameters": [SCENARIO_HEADER], **ADMIN})
async def import_demonstrations(body: ImportIn, request: Request) -> ImportReceipt:
    st = get_state(request)
    auth.admin(st.config, request)  # what trains the next release is an operator's call
    scenario = h.scenario_of(request)
    try:  # what JSON parsing let through but cannot be sent on: lone surrogates, integers past 64 bits
        orjson.dumps(body.model_dump())
    except orjson.JSONEncodeError as exc:
        raise ReefError(400, f"demonstrations: not representable as JSON for the engine ({exc})",
                        param="demonstrations") from exc
    release_id = st.routes.pick(scenario).release_id
    tags = {**h.tags_of(request), SOURCE_TAG: "demonstration"}
    # Tokenize every one first: a bad demonstration refuses the whole import, nothing half-written.
    ids = [await _token_ids(st, demo, f"demonstrations[{i}]") for i, demo in enumerate(body.demonstrations)]
    records, reports = [], []
    for demo, (prompt_ids, completion_ids) in zip(body.demonstrations, ids, strict=True):
        record_id, created = h.new_id("rec"), utcnow()
        chat: dict[str, Any] = {"model": st.config.model_name,
                                "messages": [m.model_dump(exclude_none=True) for m in demo.messages]}
        if demo.tools:
            chat["tools"] = demo.tools
        exchange = Exchange(record_id=record_id, scenario=scenario, session_id=h.new_id("ses"), release_id=release_id,
                            created_at=created, body=chat, body_hash=sha256_json(chat), request_model="demonstration",
                            tags=tags, stream=False, latency_ms=0.0, ttft_ms=None)
        message = {"role": "assistant", "content": demo.completion}
        response = UpstreamResponse(
            id=f"demo-{record_id}", model="demonstration", prompt_token_ids=prompt_ids,
            choices=[UpstreamChoice(message=message, finish_reason="stop", token_ids=completion_ids)],
            usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids)})
        records.append(record_row(exchange, response, orjson.dumps({"choices": [{"message": message}]})))
        content = [scenario, [record_id], demo.score, None, {"source": "demonstration"}]
        reports.append(Report(report_id=h.new_id("rep"), scenario=scenario, record_ids=[record_id], session_id=None,
                              score=demo.score, feedback=None, metadata_json='{"source": "demonstration"}',
                              created_at=created, content_hash=sha256_json(content)))
    # Records before reports: a report never names a record that is not yet durable.
    await st.store.append_records(records)
    for record in records:
        st.sessions.add(record.scenario, record.reply_hashes, record.session_id)
    await st.store.append_reports(reports)
    return ImportReceipt(agent_record_ids=[r.record_id for r in records], report_ids=[r.report_id for r in reports])
