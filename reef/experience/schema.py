"""The one definition of what Reef records: pydantic models for records and reports, and the
`datasets.Features` their parquet shards are written with.

Column names follow the OpenTelemetry GenAI semantic conventions where one exists
(`gen_ai.conversation.id`, `gen_ai.usage.input_tokens`, ...); the pydantic models use plain Python
names with those as aliases, so `model_dump(by_alias=True)` gives exactly the stored row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import datasets
import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.core.clock import utcnow  # noqa: F401 - re-exported: reef/traffic/offline.py imports it from here
from reef.core.hashing import sha256_json

# --- pydantic models -------------------------------------------------------------------------


class ToolCall(BaseModel):
    """A function call an assistant turn made (a streamed one assembled from its deltas)."""

    id: str | None = None
    type: str = "function"
    name: str = ""
    # The arguments exactly as the model wrote them (JSON text, possibly invalid: that is experience too).
    arguments: str = ""


class ContentPart(BaseModel):
    """One part of a multi-part message content (`[{"type": "text", "text": ...}, ...]`)."""

    type: str
    text: str | None = None


class Message(BaseModel):
    """One chat message as the client sent it: `content` is its text (text parts joined), `parts`
    its content parts when it sent a list; the exact request is in `Record.request_json`. A `tool`
    message is a tool result, answering the call `tool_call_id`."""

    role: str
    content: str | None = None
    parts: list[ContentPart] = Field(default_factory=list)
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class Choice(BaseModel):
    """One sampled completion with the exact token ids and logprobs vLLM produced."""

    index: int
    content: str | None = None
    finish_reason: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)


class Tool(BaseModel):
    """A tool the request offered the model; JSON schemas vary too much for one column type, so the
    parameters stay JSON text."""

    type: str = "function"
    name: str
    description: str | None = None
    parameters_json: str = "{}"


class Tag(BaseModel):
    name: str
    value: str


class Record(BaseModel):
    """One chat completion call, as served."""

    model_config = ConfigDict(populate_by_name=True)

    record_id: str
    scenario: str
    session_id: str = Field(alias="gen_ai.conversation.id")
    created_at: datetime
    operation: str = Field(default="chat", alias="gen_ai.operation.name")
    request_model: str = Field(alias="gen_ai.request.model")
    response_model: str = Field(alias="gen_ai.response.model")
    response_id: str = Field(default="", alias="gen_ai.response.id")
    release_id: str
    messages: list[Message]
    tools: list[Tool] = Field(default_factory=list)
    # "auto", "none", "required", or a named function as JSON; None when the request set none.
    tool_choice: str | None = None
    # Sampling parameters: the common ones as columns, all of them (minus messages) as JSON.
    temperature: float | None = Field(default=None, alias="gen_ai.request.temperature")
    top_p: float | None = Field(default=None, alias="gen_ai.request.top_p")
    max_tokens: int | None = Field(default=None, alias="gen_ai.request.max_tokens")
    choice_count: int = Field(default=1, alias="gen_ai.request.choice.count")
    params_json: str = "{}"
    stream: bool = False
    choices: list[Choice]
    finish_reasons: list[str] = Field(default_factory=list, alias="gen_ai.response.finish_reasons")
    prompt_token_ids: list[int] = Field(default_factory=list)
    # False when the model server cannot return token ids (an OpenAI-compatible provider that is
    # not vLLM): such records hold text only, and recipes that train on recorded ids skip them.
    has_token_ids: bool = True

    @field_validator("has_token_ids", mode="before")
    @classmethod
    def _before_the_column(cls, value: Any) -> Any:
        return True if value is None else value  # shards from before it: always vLLM, always ids
    # The harness content id the gateway applied (null: none; shards from before the column read null).
    harness_id: str | None = None
    # The upstream replica that served the call (`upstream.urls`, its URL without credentials); null
    # with one engine, and in shards from before the column.
    replica: str | None = None
    input_tokens: int = Field(default=0, alias="gen_ai.usage.input_tokens")
    output_tokens: int = Field(default=0, alias="gen_ai.usage.output_tokens")
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    tags: list[Tag] = Field(default_factory=list)
    # sha256 of (scenario, prompt, completions): equal hashes are exact duplicates.
    content_hash: str
    # sha256 of the request body: an idempotent retry must repeat it exactly.
    body_hash: str
    # Rolling hashes of (messages + each choice's reply): a later request that extends one of
    # them continues this record's session (see reef.gateway.sessions).
    reply_hashes: list[str] = Field(default_factory=list)
    # The exact request body and the response the client got (for idempotent replay).
    request_json: str
    response_json: str


class Report(BaseModel):
    """A reward for one or more records, from the application."""

    report_id: str
    scenario: str
    record_ids: list[str]
    # Set when the report credited a whole session: record_ids are its turns when it arrived.
    session_id: str | None = None
    score: float
    feedback: str | None = None
    # The reply the application wanted instead (a user's fix of the model's draft): a hindsight
    # target that recipes taking corrections (rft) train on when the score is too low to imitate.
    # Text, or an assistant message (a corrected tool call) as JSON: see `correction_message`.
    correction: str | None = None
    metadata_json: str = "{}"
    created_at: datetime
    # sha256 of the report's content: same report_id with another content is a conflict.
    content_hash: str


def correction_message(correction: str | None) -> dict[str, Any] | None:
    """The assistant message a stored correction holds, or None when it is plain text. A message
    is stored as its JSON object with `"role": "assistant"` (what `POST /reef/report` writes for a
    `correction` given as a message); any other text is a reply's text."""
    if not correction or not correction.startswith("{"):
        return None
    try:
        value = orjson.loads(correction)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and value.get("role") == "assistant" else None


# --- datasets.Features: the on-disk schema of the parquet shards -----------------------------

_TOOL_CALL = {
    "id": datasets.Value("string"),
    "type": datasets.Value("string"),
    "name": datasets.Value("string"),
    "arguments": datasets.Value("string"),
}
_MESSAGE = {
    "role": datasets.Value("string"),
    "content": datasets.Value("string"),
    "parts": datasets.List({"type": datasets.Value("string"), "text": datasets.Value("string")}),
    "name": datasets.Value("string"),
    "tool_call_id": datasets.Value("string"),
    "tool_calls": datasets.List(_TOOL_CALL),
}
_CHOICE = {
    "index": datasets.Value("int32"),
    "content": datasets.Value("string"),
    "finish_reason": datasets.Value("string"),
    "tool_calls": datasets.List(_TOOL_CALL),
    "token_ids": datasets.List(datasets.Value("int32")),
    "logprobs": datasets.List(datasets.Value("float32")),
}
_TIMESTAMP = datasets.Value("timestamp[us, tz=UTC]")

RECORD_FEATURES = datasets.Features(
    {
        "record_id": datasets.Value("string"),
        "scenario": datasets.Value("string"),
        "gen_ai.conversation.id": datasets.Value("string"),
        "created_at": _TIMESTAMP,
        "gen_ai.operation.name": datasets.Value("string"),
        "gen_ai.request.model": datasets.Value("string"),
        "gen_ai.response.model": datasets.Value("string"),
        "gen_ai.response.id": datasets.Value("string"),
        "release_id": datasets.Value("string"),
        "messages": datasets.List(_MESSAGE),
        "tools": datasets.List(
            {
                "type": datasets.Value("string"),
                "name": datasets.Value("string"),
                "description": datasets.Value("string"),
                "parameters_json": datasets.Value("string"),
            }
        ),
        "tool_choice": datasets.Value("string"),
        "gen_ai.request.temperature": datasets.Value("float64"),
        "gen_ai.request.top_p": datasets.Value("float64"),
        "gen_ai.request.max_tokens": datasets.Value("int64"),
        "gen_ai.request.choice.count": datasets.Value("int32"),
        "params_json": datasets.Value("string"),
        "stream": datasets.Value("bool"),
        "choices": datasets.List(_CHOICE),
        "gen_ai.response.finish_reasons": datasets.List(datasets.Value("string")),
        "prompt_token_ids": datasets.List(datasets.Value("int32")),
        "has_token_ids": datasets.Value("bool"),
        "harness_id": datasets.Value("string"),
        "replica": datasets.Value("string"),
        "gen_ai.usage.input_tokens": datasets.Value("int64"),
        "gen_ai.usage.output_tokens": datasets.Value("int64"),
        "latency_ms": datasets.Value("float64"),
        "ttft_ms": datasets.Value("float64"),
        "tags": datasets.List({"name": datasets.Value("string"), "value": datasets.Value("string")}),
        "content_hash": datasets.Value("string"),
        "body_hash": datasets.Value("string"),
        "reply_hashes": datasets.List(datasets.Value("string")),
        "request_json": datasets.Value("string"),
        "response_json": datasets.Value("string"),
    }
)

REPORT_FEATURES = datasets.Features(
    {
        "report_id": datasets.Value("string"),
        "scenario": datasets.Value("string"),
        "record_ids": datasets.List(datasets.Value("string")),
        "session_id": datasets.Value("string"),
        "score": datasets.Value("float64"),
        "feedback": datasets.Value("string"),
        "correction": datasets.Value("string"),
        "metadata_json": datasets.Value("string"),
        "created_at": _TIMESTAMP,
        "content_hash": datasets.Value("string"),
    }
)

TABLES: dict[str, tuple[type[BaseModel], datasets.Features]] = {
    "records": (Record, RECORD_FEATURES),
    "reports": (Report, REPORT_FEATURES),
}


# --- hashing helpers shared by the gateway and the readers -----------------------------------


def content_hash(scenario: str, messages: list[dict[str, Any]], choices: list[dict[str, Any]]) -> str:
    """sha256 of (scenario, prompt, completions), over messages and choices as their rows hold them."""
    return sha256_json(
        [
            scenario,
            [[m["role"], m["content"], _calls(m["tool_calls"])] for m in messages],
            [[c["content"], _calls(c["tool_calls"])] for c in choices],
        ]
    )


def record_content_hash(scenario: str, messages: list[Message], choices: list[Choice]) -> str:
    return content_hash(scenario, [m.model_dump() for m in messages], [c.model_dump() for c in choices])


def _calls(calls: list[dict[str, Any]]) -> list[list[str]] | None:
    # None without calls: records without tool calls keep the hashes they always had.
    return [[c["name"], c["arguments"]] for c in calls] or None


# --- a record as the gateway appends it --------------------------------------------------------

# Record field -> its column, in the model's order.
_RECORD_COLUMNS = {name: f.alias or name for name, f in Record.model_fields.items()}


@dataclass(frozen=True, slots=True)
class RecordRow:
    """A record already serialized: its row, and the fields the gateway and the store index it by.

    The gateway's hot path builds rows without building a `Record` (validating and serializing a
    model cost a fifth of the loaded gateway's CPU per call): `of()` takes every field of `Record`,
    each already of the type the model would give it, nested models as plain dicts, and writes the
    row `Record.model_dump_json(by_alias=True)` would. tests/test_record_row.py holds the two equal;
    a field added to `Record` and not given here is a KeyError, never a silently missing column.
    """

    record_id: str
    scenario: str
    session_id: str
    created_at: datetime
    body_hash: str
    reply_hashes: list[str]
    row: bytes

    @classmethod
    def of(cls, fields: dict[str, Any]) -> RecordRow:
        row = orjson.dumps({column: fields[name] for name, column in _RECORD_COLUMNS.items()},
                           option=orjson.OPT_UTC_Z)
        return cls(fields["record_id"], fields["scenario"], fields["session_id"], fields["created_at"],
                   fields["body_hash"], fields["reply_hashes"], row)

    def record(self) -> Record:
        return Record.model_validate_json(self.row)
