"""`POST /reef/report`: an application's reward for one or more records.

A report may name a streaming record whose receipt has not been sent yet (the id is in the
response header from the first byte). Such a report waits, up to `report_wait_s`, until that
record is durable, then is stored; if the record never becomes durable it gets 404. Nothing the
gateway acknowledged with 200 is lost: the report is fsynced before the answer.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reef.config import ApiKey
from reef.core.clock import utcnow
from reef.core.hashing import sha256_json
from reef.core.pg import StateUnavailableError
from reef.experience.report_keys import KnownReport, ReportKeyBusyError
from reef.experience.schema import Report
from reef.gateway import auth
from reef.gateway.state import get_state
from reef.gateway.wire import headers as h
from reef.gateway.wire.contract import DATA_PLANE, SCENARIO_HEADER, errors
from reef.gateway.wire.errors import ReefError

router = APIRouter()


# What _names_records checks, in the document too: a record id, a non-empty list of them, or a session.
_NAMES_A_RECORD: dict[str, Any] = {"anyOf": [
    {"required": ["agent_record_id"], "properties": {"agent_record_id": {"type": "string"}}},
    {"required": ["references"], "properties": {"references": {"type": "array", "minItems": 1}}},
    {"required": ["session_id"], "properties": {"session_id": {"type": "string"}}},
]}


class CorrectionFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = Field(default_factory=dict, description="JSON text or an object")


class CorrectionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    type: Literal["function"] = "function"
    function: CorrectionFunction


class CorrectionMessage(BaseModel):
    """The assistant turn that was wanted, as a chat message: how a tool call is corrected (the
    model's chat template renders it, so the client never writes `<tool_call>` markup)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[CorrectionCall] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _says_something(self) -> CorrectionMessage:
        if not self.content and not self.tool_calls:
            raise ValueError("a correction message needs content or tool_calls")
        return self


class ReportIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_NAMES_A_RECORD)

    agent_record_id: str | None = Field(default=None, min_length=1)
    references: list[Annotated[str, Field(min_length=1)]] | None = None
    session_id: str | None = Field(default=None, min_length=1, description="credit every turn of this session")
    score: float = Field(allow_inf_nan=False)
    feedback: str | None = None
    correction: str | CorrectionMessage | None = Field(default=None, description=(
        "the reply that was wanted instead: a hindsight target recipes such as rft train on; text, or an "
        "assistant message with tool_calls to correct a tool call"))
    metadata: dict[str, Any] = Field(default_factory=dict)
    report_id: str | None = None

    @field_validator("score", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        # pydantic would accept "0.5" or true; a reward must be an actual finite number.
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError("score must be a finite number")
        return value

    @field_validator("correction", mode="before")
    @classmethod
    def _text_or_message(cls, value: Any) -> Any:
        # Checked here, not by the union, so an error names `correction` itself (not a union branch).
        if value is None or isinstance(value, CorrectionMessage):
            return value
        if isinstance(value, str):
            if not value:
                raise ValueError("correction must not be empty")
            return value
        if not isinstance(value, dict):
            raise ValueError("correction must be text or an assistant message")
        try:
            return CorrectionMessage.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"correction as a message: {where + ': ' if where else ''}{first['msg']}") from None

    @model_validator(mode="after")
    def _encodable(self) -> ReportIn:
        # A lone surrogate ("\ud800") is valid JSON text but no UTF-8: it could be neither hashed
        # (the report's idempotency key) nor stored.
        try:
            orjson.dumps(self.model_dump())
        except TypeError as exc:
            raise ValueError(f"text in the report is not valid UTF-8 ({exc})") from None
        return self

    @model_validator(mode="after")
    def _names_records(self) -> ReportIn:
        if not self.record_ids() and not self.session_id:
            raise ValueError("name a record or a session: agent_record_id, references or session_id")
        return self

    def stored_correction(self) -> str | None:
        """The correction as the Report column holds it: text as given, a message as its JSON."""
        if isinstance(self.correction, CorrectionMessage):
            return orjson.dumps(self.correction.model_dump(exclude_none=True)).decode()
        return self.correction

    def record_ids(self) -> list[str]:
        ids = ([self.agent_record_id] if self.agent_record_id else []) + list(self.references or [])
        return list(dict.fromkeys(ids))


class ReportReceipt(BaseModel):
    report_id: str
    agent_record_ids: list[str]
    duplicate: bool


async def _known(found: Awaitable[KnownReport | None]) -> KnownReport | None:
    try:
        return await found
    except StateUnavailableError as exc:
        raise ReefError(503, str(exc), code="state_unavailable") from exc


def _retried(report_id: str, known: KnownReport, scenario: str, content_hash: str) -> ReportReceipt:
    """The answer to a report id seen before: the first answer again, or 409 for other content."""
    if (known.scenario, known.content_hash) != (scenario, content_hash):
        raise ReefError(409, f"report {report_id} exists with other content", param="report_id",
                        code="report_id_conflict")
    return ReportReceipt(report_id=report_id, agent_record_ids=known.record_ids, duplicate=True)


def _key(request: Request) -> ApiKey | None:
    # A dependency, so a missing key is refused (401) before the body is judged (422).
    return auth.data_key(get_state(request).config, request, h.scenario_of(request))


@router.post("/reef/report", operation_id="report", dependencies=[Depends(_key)],
             responses=errors(400, 401, 403, 404, 409, 422, 503, 507),
             openapi_extra={"parameters": [SCENARIO_HEADER], **DATA_PLANE})
async def report(body: ReportIn, request: Request) -> ReportReceipt:
    st = get_state(request)
    scenario = h.scenario_of(request)
    named = body.record_ids()
    # What the client asked, not what a session held at the time: a retry of a session report is
    # the same report even after the session grew.
    content = [scenario, named, body.score, body.feedback, body.metadata]
    if body.session_id:
        content.append(body.session_id)
    if body.correction is not None:  # appended only when given: older reports keep their hashes
        content.append({"correction": body.correction if isinstance(body.correction, str)
                        else body.correction.model_dump(exclude_none=True)})
    content_hash = sha256_json(content)
    report_id = h.valid_id(body.report_id, "report_id") if body.report_id else h.new_id("rep")
    keys = st.report_keys
    assert keys is not None  # set by create_app
    # A retry is judged before its records are looked up: sent to another gateway (state.url), it
    # is answered as the first one was, though that gateway's store does not hold the records.
    if body.report_id and (known := await _known(keys.find(report_id))) is not None:
        return _retried(report_id, known, scenario, content_hash)
    record_ids = list(named)
    if body.session_id:
        h.valid_id(body.session_id, "session_id")
        turns = await asyncio.to_thread(st.store.session_records, scenario, body.session_id)
        if not turns:
            raise ReefError(404, f"no session {body.session_id} in scenario {scenario!r}", param="session_id",
                            code="session_not_found")
        record_ids = list(dict.fromkeys([*record_ids, *turns]))
    for record_id in named:
        if st.inflight.get(record_id) is not None:
            await st.inflight.wait(record_id, st.config.report_wait_s)
        # With store.partition: also a record another gateway on this data dir recorded and flushed.
        where = await st.store.locate_record(record_id)
        # A record of another scenario is reported as unknown: scenarios do not see each other.
        if where is None or where[0] != scenario:
            raise ReefError(404, f"no record {record_id} in scenario {scenario!r}", param="agent_record_id",
                            code="record_not_found")
    try:
        async with keys.claim(report_id, scenario, content_hash, record_ids, st.config.report_wait_s) as taken:
            if taken is not None:  # a concurrent retry stored it first
                return _retried(report_id, taken, scenario, content_hash)
            await st.store.append_report(Report(
                report_id=report_id, scenario=scenario, record_ids=record_ids, session_id=body.session_id,
                score=body.score, feedback=body.feedback, correction=body.stored_correction(),
                metadata_json=orjson.dumps(body.metadata).decode(),
                created_at=utcnow(), content_hash=content_hash,
            ))
    except (ReportKeyBusyError, StateUnavailableError) as exc:
        raise ReefError(503, str(exc), code="state_unavailable") from exc
    st.metrics.reports.labels(scenario).inc()
    ready = st.canaries.observe(record_ids, body.score)
    if ready and st.publisher is not None:
        st.publisher.canary.schedule(ready)  # decided in the background, never inside this request
    return ReportReceipt(report_id=report_id, agent_record_ids=record_ids, duplicate=False)
