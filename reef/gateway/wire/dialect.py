"""What the agent dialects (the Responses API, Anthropic's Messages API) share on the wire.

Each dialect translates its request into a chat completions body, which the one exchange
(`reef.gateway.exchange`) serves and records as it records any chat call, then renders the result
in its own API: the typed completion as a JSON body, or the parsed chunks as its own SSE events.
Nothing here records or calls the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from reef.gateway.wire.chunks import Chunk


@dataclass(frozen=True)
class ContextOverflow:
    """The engine refused a prompt that does not fit its context (never truncated by Reef)."""

    message: str
    limit: int | None
    prompt_tokens: int | None


# vLLM's wording (vllm/renderers/params.py, vllm/v1/engine/input_processor.py): the limit, then the
# prompt's length, in either of its two phrasings.
_LIMIT = re.compile(r"maximum (?:context|model) length (?:is |of )?(\d+)")
_PROMPT = re.compile(r"prompt (?:contains (?:at least )?|\(length )(\d+)")


def context_overflow(status: int, body: bytes) -> ContextOverflow | None:
    """The engine's context-length refusal, read from its error body; None for any other error."""
    if status != 400:
        return None
    try:
        error = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    detail = error.get("error") if isinstance(error, dict) else None
    message = detail.get("message") if isinstance(detail, dict) else None
    if not isinstance(message, str) or not _LIMIT.search(message):
        return None
    limit, prompt = _LIMIT.search(message), _PROMPT.search(message)
    return ContextOverflow(message, int(limit.group(1)) if limit else None, int(prompt.group(1)) if prompt else None)


def upstream_message(body: bytes) -> str:
    """The message of an upstream error body, whatever shape it has."""
    try:
        error = orjson.loads(body)
        detail = error.get("error") if isinstance(error, dict) else None
        if isinstance(detail, dict) and isinstance(detail.get("message"), str):
            return detail["message"]
        if isinstance(detail, str):
            return detail
    except orjson.JSONDecodeError:
        pass
    return body.decode("utf-8", "replace")[:500] or "the model server failed"


def event(name: str, payload: dict[str, Any]) -> bytes:
    """One named SSE event, as both the Responses API and Anthropic's API write them."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class StreamTranslator(Protocol):
    def feed(self, chunk: Chunk) -> list[bytes]: ...

    def finish(self, record_id: str | None) -> list[bytes]: ...

    def fail(self, error: dict[str, Any]) -> list[bytes]: ...


def text_of(content: Any) -> str:
    """The text of a string or of a list of text-bearing parts (any of the dialects' part types)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(content)
