"""The chat completion on the wire: the body sent upstream, the response read back, what the client sees.

The gateway always asks the model server for token ids and logprobs (recipes need the exact
behaviour policy), and removes them from what the client sees unless the client asked.

A JSON response is read in C and never built as a Python tree: typed, for the few fields a record
keeps (msgspec skips each token's text, bytes and top logprobs, most of a response with logprobs),
and as raw JSON values, so the client's copy keeps every field the server sent without any of it
being parsed. Parsing the whole response with orjson and dropping the tree cost the loaded gateway
more than building its record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from reef.gateway.wire.errors import ReefError


@dataclass(frozen=True)
class ClientWants:
    """Which of the fields the gateway adds for itself the client asked for too."""

    logprobs: bool
    token_ids: bool
    usage: bool


def upstream_request(body: dict[str, Any], model: str, token_ids: bool = True,
                     default_max_tokens: int | None = None) -> tuple[dict[str, Any], ClientWants]:
    """The body sent upstream; `token_ids`: the server takes vLLM's `return_token_ids` (a strict
    OpenAI-compatible provider refuses unknown fields, so it only gets what the client sent).
    `default_max_tokens` bounds a chat that names no length: vLLM would otherwise generate up to its
    context length, for each of `n` choices, and one such request can hold a CPU engine for minutes."""
    up = dict(body)
    up["model"] = model
    if default_max_tokens is not None and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        up["max_tokens"] = default_max_tokens
    up["logprobs"] = True
    if token_ids:
        up["return_token_ids"] = True
    if body.get("stream"):
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        up["stream_options"] = options
    return up, client_wants(body)


def client_wants(body: dict[str, Any]) -> ClientWants:
    usage = not body.get("stream") or bool((body.get("stream_options") or {}).get("include_usage"))
    return ClientWants(bool(body.get("logprobs")), bool(body.get("return_token_ids")), usage)


# --- what a record keeps of a response -------------------------------------------------------


class _TokenLogprob(msgspec.Struct, gc=False):
    logprob: float


class _Logprobs(msgspec.Struct):
    content: list[_TokenLogprob] | None = None


class UpstreamChoice(msgspec.Struct):
    index: int = 0
    message: dict[str, Any] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None

    def logprob_values(self) -> list[float]:
        content = self.logprobs.content if self.logprobs is not None else None
        return [t.logprob for t in content] if content else []


class UpstreamResponse(msgspec.Struct):
    """A chat completion as a record reads it; every other field is skipped unparsed."""

    id: str | None = None
    model: str | None = None
    created: int | float | None = None  # any number: not every OpenAI-compatible server writes an int
    choices: list[UpstreamChoice] = msgspec.field(default_factory=list)
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None


_RESPONSE = msgspec.json.Decoder(UpstreamResponse)


def _unreadable(exc: msgspec.MsgspecError) -> ReefError:
    return ReefError(502, f"the model server's reply is not a chat completion Reef can record ({exc})",
                     code="bad_upstream_response")


def read_response(raw: bytes) -> UpstreamResponse:
    try:
        return _RESPONSE.decode(raw)
    except msgspec.MsgspecError as exc:
        raise _unreadable(exc) from exc


# --- what the client sees --------------------------------------------------------------------

_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_OBJECTS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_NULL = msgspec.Raw(b"null")
_ENCODER = msgspec.json.Encoder()


def client_json(raw: bytes, wants: ClientWants, model: str) -> bytes:
    """The JSON response as the client should see it: `raw` with the model renamed and what the
    client did not ask for taken out, every other value passed through as the server wrote it.
    Call after `read_response`, which has checked the shape."""
    try:
        out: dict[str, Any] = _RAW_OBJECT.decode(raw)
        if "model" in out:
            out["model"] = model
        if not wants.token_ids:
            out.pop("prompt_token_ids", None)
        if "choices" in out and not (wants.logprobs and wants.token_ids):
            choices = _RAW_OBJECTS.decode(out["choices"])
            for choice in choices:
                if not wants.logprobs:
                    choice["logprobs"] = _NULL
                if not wants.token_ids:
                    choice.pop("token_ids", None)
            out["choices"] = choices
        return _ENCODER.encode(out)
    except msgspec.MsgspecError as exc:
        raise _unreadable(exc) from exc


def for_client(payload: dict[str, Any], wants: ClientWants, model: str) -> dict[str, Any] | None:
    """A parsed stream chunk (or a response rebuilt from one) as the client should see it; None drops
    a usage-only chunk.

    `payload` is left as it is: only the top level and the choices, which this changes, are copied;
    nested values are shared, never modified.
    """
    out = dict(payload)
    if out.get("usage") is not None and not wants.usage:
        if not out.get("choices"):
            return None
        out["usage"] = None
    if "model" in out:
        out["model"] = model
    if not wants.token_ids:
        out.pop("prompt_token_ids", None)
    if out.get("choices"):
        choices = []
        for choice in out["choices"]:
            choice = dict(choice)
            if not wants.logprobs:
                choice["logprobs"] = None
            if not wants.token_ids:
                choice.pop("token_ids", None)
            choices.append(choice)
        out["choices"] = choices
    return out
