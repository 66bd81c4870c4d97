"""The gateway's HTTP contract: request and error models, and the OpenAPI document built from them.

The chat body is validated by the same models `/reef/openapi.json` documents. They are strict about
every field Reef itself reads (the model, the messages it records and stitches sessions from, how
the answer is delivered, the sampling parameters stored as columns) and let every other field
through untouched, so OpenAI and vLLM extensions reach the model server as the client sent them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic.json_schema import models_json_schema
from pydantic_core import PydanticCustomError

from reef.gateway.wire.errors import from_validation
from reef.registry.schema import SCENARIO_RE

REF = "#/components/schemas/{model}"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class _Open(BaseModel):
    # Strict types (no "1" for 1, no true for 1) for what Reef reads; unknown keys pass through.
    model_config = ConfigDict(extra="allow", strict=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- content parts ---------------------------------------------------------------------------


class TextPart(_Open):
    type: Literal["text"]
    text: str


class ImageURL(_Open):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Open):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(_Open):
    data: str
    format: str


class AudioPart(_Open):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FilePart(_Open):
    type: Literal["file"]
    file: dict[str, Any]


class RefusalPart(_Open):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


# --- messages --------------------------------------------------------------------------------


class FunctionCall(_Open):
    name: str
    arguments: str


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Open):
    role: Literal["system", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(_Open):
    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: str | list[AssistantPart] | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None
    refusal: str | None = None


class ToolMessage(_Open):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str


class FunctionMessage(_Open):
    role: Literal["function"]
    content: str | None
    name: str


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage, Field(discriminator="role")
]


# --- the request -----------------------------------------------------------------------------


class StreamOptions(_Open):
    include_usage: bool | None = None


class FunctionDefinition(_Open):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction


_INT32 = 2**31 - 1


def _integral(value: Any) -> Any:
    # JSON has one number type: 2.0 is the integer 2 (JSON Schema agrees); 2.5, "2" and true are not.
    return int(value) if isinstance(value, float) and value.is_integer() else value


JSONInt = Annotated[int, BeforeValidator(_integral)]


# Bounds before the validator and inside the annotation: on `JSONInt | None = Field(ge=...)` pydantic
# writes them into the OpenAPI document as "ge"/"le", which JSON Schema ignores, so schemathesis
# took 0 for a valid token count and Reef's 400 failed its acceptance check.
_Choices = Annotated[int, Field(ge=1, le=128), BeforeValidator(_integral)]
_TopLogprobs = Annotated[int, Field(ge=0, le=20), BeforeValidator(_integral)]
_Tokens = Annotated[int, Field(ge=1, le=_INT32), BeforeValidator(_integral)]
# A tool_choice other than null needs tools (OpenAI and vLLM both refuse it otherwise).
_CHOICE_NEEDS_TOOLS: dict[str, Any] = {
    "if": {"required": ["tool_choice"], "properties": {"tool_choice": {"not": {"type": "null"}}}},
    "then": {"required": ["tools"], "properties": {"tools": {"type": "array"}}},
}


class ChatCompletionRequest(_Open):
    """`POST /v1/chat/completions`, as OpenAI defines it; fields not listed pass through to the model server."""

    model_config = ConfigDict(json_schema_extra=_CHOICE_NEEDS_TOOLS)

    model: str | None = Field(default=None, min_length=1, description="default: the served model")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: _Choices | None = None
    logprobs: bool | None = None
    top_logprobs: _TopLogprobs | None = None
    return_token_ids: bool | None = Field(default=None, description="vLLM: the prompt's and each choice's token ids")
    # Bounded so the stored int64 column (and any JSON parser) holds them exactly.
    max_tokens: _Tokens | None = None
    max_completion_tokens: _Tokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None


    @model_validator(mode="after")
    def _tools_for_choice(self) -> ChatCompletionRequest:
        if self.tool_choice is not None and self.tools is None:
            raise PydanticCustomError("tools_missing", "tool_choice needs tools")
        return self


def parse_chat(body: Any) -> ChatCompletionRequest:
    """Validate a decoded chat body; the first problem becomes a 400 naming the field."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc.errors(include_url=False), 400) from exc


# --- responses -------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    # Reef's codes are strings; vLLM's (passed through as they are) are the HTTP status.
    code: str | int | None = None


class ErrorBody(BaseModel):
    """Every error: the OpenAI shape, so SDKs raise their typed errors."""

    error: ErrorDetail


class ChatCompletion(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    object: str
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


_DESCRIPTIONS = {
    400: "malformed request (the message and `param` name the field)",
    401: "missing or wrong API key / admin token",
    403: "not allowed (key not allowed for the scenario, admin disabled, scenario limit)",
    404: "no such record, release, candidate or model",
    409: "conflict (idempotency key reused with another body, head moved, ...)",
    413: "request body over `limits.max_body_bytes`",
    422: "malformed request body (the message and `param` name the field)",
    431: "request headers over `limits.max_header_bytes`",
    502: "the model server failed",
    503: "the model server or the release machinery is unavailable (with `Retry-After` while the engine restarts)",
    507: "the disk holding the write-ahead log is full: nothing of the request was stored (`Retry-After`)",
}
# Any route may answer these: the size limits are checked before routing.
COMMON_ERRORS = (413, 431)


def errors(*statuses: int, model: type[BaseModel] | None = None) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: each error status with the OpenAI-style body (or `model`'s)."""
    return {s: {"model": model or ErrorBody, "description": _DESCRIPTIONS[s]} for s in (*statuses, *COMMON_ERRORS)}


# Marks for install_openapi: which operations need which credential.
ADMIN: dict[str, Any] = {"security": [{"adminToken": []}]}
DATA_PLANE: dict[str, Any] = {"x-reef-data-plane": True}


def _header(name: str, description: str, pattern: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": {"type": "string", "pattern": pattern}}


SCENARIO_HEADER = _header("x-reef-scenario", "the scenario (default `default`)", SCENARIO_RE.pattern)
RECORD_HEADERS = [
    _header("x-reef-agent-record-id", "client-chosen record id; a retry with the same body is replayed", ID_PATTERN),
    _header("x-reef-session", "session id; without it, sessions are stitched from the messages", ID_PATTERN),
]


# What a model call's 200 answer documents: its receipt headers, the links the stateful fuzzing phase
# follows from a call to its record and reports, and one event of a dialect's SSE stream (as OpenAPI
# 3.1 tools parse `text/event-stream`: named events).
RESPONSE_RECEIPT = {
    "x-reef-agent-record-id": {"description": "the record's id (the receipt)", "schema": {"type": "string"}},
    "x-reef-release-id": {"description": "the release (weights and harness) that answered",
                          "schema": {"type": "string"}}}
RESPONSE_LINKS = {
    "GetRecord": {"operationId": "get_record", "parameters": {"record_id": "$response.header.x-reef-agent-record-id"}},
    "Report": {"operationId": "report", "requestBody": {"agent_record_id": "$response.header.x-reef-agent-record-id",
                                                        "score": 1.0}},
}
SSE_EVENT = {"type": "object", "required": ["event", "data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}


def body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its body itself, validated by `model`."""
    _BODIES.add(model)
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}


_BODIES: set[type[BaseModel]] = {ErrorBody, ChatCompletion}


def install_openapi(app: FastAPI, api_keys: bool) -> None:
    """FastAPI's document, plus the schemas of bodies routes validate themselves and the credentials
    routes need (data-plane keys only when `api_keys` are configured: otherwise those routes are open)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, defs = models_json_schema([(m, "validation") for m in sorted(_BODIES, key=lambda m: m.__name__)],
                                         ref_template=REF)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(defs.get("$defs", {}))
            # FastAPI documents its own 422 body for every route with parameters; ours is ErrorBody.
            for operation in (op for path in doc["paths"].values() for op in path.values()):
                if "422" in operation["responses"]:
                    operation["responses"]["422"] = {"description": _DESCRIPTIONS[422], "content": {
                        "application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}}}
                if operation.pop("x-reef-data-plane", False) and api_keys:
                    operation["security"] = [{"apiKey": []}]
            doc["components"]["securitySchemes"] = {
                "adminToken": {"type": "http", "scheme": "bearer", "description": "serve.yaml admin_token"},
                "apiKey": {"type": "http", "scheme": "bearer", "description": "one of serve.yaml api_keys"},
            }
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
