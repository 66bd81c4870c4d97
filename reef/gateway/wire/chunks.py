"""A streamed chat completion chunk on the wire: read once, typed, for the record, the dialects and the chat client.

Each `data:` event of an upstream stream is decoded in C (msgspec) into a `Chunk`: only the fields
vLLM writes, each token's logprob as its value alone (its text, bytes and top logprobs are skipped,
most of an event). The accumulator, the dialects' translators and the chat client's copy all read
that one struct; the chat client's event is encoded straight from it, with what the client did
not ask for taken out. Parsing each event into Python dicts (its logprobs' detail too), walking
them and serialising the client's copy again was a fifth of the loaded gateway's CPU per stream.

An event with any other field (another server's extension, an engine's mid-stream `error`), or a
field of another type, is an `OtherChunk`: parsed as a whole, read the same way, and passed to the
chat client field for field as the server wrote it, less what the client did not ask for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from reef.gateway.wire.completion import ClientWants, UpstreamChoice, UpstreamResponse, for_client


class TokenLogprob(msgspec.Struct, gc=False):
    logprob: float


class Logprobs(msgspec.Struct, gc=False):
    content: list[TokenLogprob] | None = None


# Every field defaults to UNSET, which the encoder leaves out: a chunk is re-encoded with exactly
# the fields it came with, in vLLM's order.
class Delta(msgspec.Struct, forbid_unknown_fields=True):
    role: str | UnsetType = UNSET
    content: str | None | UnsetType = UNSET
    reasoning_content: str | None | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | None | UnsetType = UNSET


NO_DELTA = Delta()  # a choice without one reads as an empty delta (never changed)


class Choice(msgspec.Struct, forbid_unknown_fields=True):
    index: int | UnsetType = UNSET
    delta: Delta | UnsetType = UNSET
    logprobs: Logprobs | None | UnsetType = UNSET
    finish_reason: str | None | UnsetType = UNSET
    stop_reason: int | str | None | UnsetType = UNSET
    token_ids: list[int] | None | UnsetType = UNSET

    def position(self) -> int:
        return self.index if isinstance(self.index, int) else 0

    def logprob_values(self) -> list[float]:
        content = self.logprobs.content if isinstance(self.logprobs, Logprobs) else None
        return [t.logprob for t in content] if content else []


class Chunk(msgspec.Struct, forbid_unknown_fields=True):
    id: str | UnsetType = UNSET
    object: str | UnsetType = UNSET
    created: int | UnsetType = UNSET
    model: str | UnsetType = UNSET
    choices: list[Choice] | UnsetType = UNSET
    usage: dict[str, Any] | None | UnsetType = UNSET
    prompt_token_ids: list[int] | None | UnsetType = UNSET
    prompt_text: str | None | UnsetType = UNSET
    system_fingerprint: str | None | UnsetType = UNSET

    @property
    def failed(self) -> bool:
        """An engine's mid-stream failure (an event with an `error`), passed on, never recorded."""
        return False


class OtherChunk(Chunk):
    """A chunk with fields `Chunk` does not type (or one whose logprobs the client asked for in
    full): its fields read as a `Chunk` reads them, and `source`, the whole event as parsed, for the
    chat client."""

    source: dict[str, Any] = {}

    @property
    def failed(self) -> bool:
        return "error" in self.source


_DECODER = msgspec.json.Decoder(Chunk)
_ENCODER = msgspec.json.Encoder()


def decode(data: bytes, whole: bool = False) -> Chunk:
    """One event's JSON (after `data:`); invalid JSON raises orjson's error, as the parse always has.
    `whole`: keep every field as the server wrote it (the client asked for the logprobs)."""
    if whole:
        return of_dict(orjson.loads(data))
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError:
        return of_dict(orjson.loads(data))
    except msgspec.DecodeError:
        orjson.loads(data)  # raises JSONDecodeError
        raise


def _get(d: dict[str, Any], key: str) -> Any:
    return d.get(key, UNSET)


def _logprobs(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    content = value.get("content")
    return Logprobs([TokenLogprob(float(t["logprob"])) for t in content] if content else content)


def of_dict(d: dict[str, Any]) -> OtherChunk:
    """A chunk already parsed (an unusual event, or a replay shaped from a stored response)."""
    choices = d.get("choices", UNSET)
    if isinstance(choices, list):
        choices = [Choice(_get(c, "index"), Delta(**{k: v for k, v in c["delta"].items() if k in _DELTA})
                          if isinstance(c.get("delta"), dict) else UNSET,
                          _logprobs(c.get("logprobs", UNSET)), _get(c, "finish_reason"), _get(c, "stop_reason"),
                          _get(c, "token_ids"))
                   for c in choices if isinstance(c, dict)]
    return OtherChunk(id=_get(d, "id"), model=_get(d, "model"), created=_get(d, "created"), choices=choices,
                      usage=_get(d, "usage"), prompt_token_ids=_get(d, "prompt_token_ids"), source=d)


_DELTA = frozenset(Delta.__struct_fields__)


def for_chat_client(chunk: Chunk, wants: ClientWants, model: str) -> bytes | None:
    """The chunk's SSE event as the chat client should see it (as `for_client` makes it of the parsed
    event); None drops a usage-only chunk. A typed chunk is changed: feed the record first."""
    if isinstance(chunk, OtherChunk):
        relayed = chunk.source if chunk.failed else for_client(chunk.source, wants, model)
        return None if relayed is None else b"data: " + orjson.dumps(relayed) + b"\n\n"
    if chunk.usage is not UNSET and chunk.usage is not None and not wants.usage:
        if not chunk.choices:
            return None
        chunk.usage = None
    if chunk.model is not UNSET:
        chunk.model = model
    if not wants.token_ids:
        chunk.prompt_token_ids = UNSET
    for choice in chunk.choices or ():
        choice.logprobs = None
        if not wants.token_ids:
            choice.token_ids = UNSET
    return b"data: " + _ENCODER.encode(chunk) + b"\n\n"


# --- the record's copy -----------------------------------------------------------------------


@dataclass
class _ChoiceAcc:
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


class StreamAccumulator:
    """Rebuilds the complete response from streamed chunks, token ids and logprobs included."""

    def __init__(self) -> None:
        self.choices: dict[int, _ChoiceAcc] = {}
        self.prompt_token_ids: list[int] = []
        self.usage: dict[str, Any] | None = None
        self.id = ""
        self.model = ""
        self.created = int(time.time())
        self.first_token_at: float | None = None

    def feed(self, chunk: Chunk | dict[str, Any]) -> None:
        # Once per event of every stream: locals and falsy checks (UNSET is falsy), no method calls.
        if isinstance(chunk, dict):
            chunk = of_dict(chunk)
        if chunk.id is not UNSET:
            self.id = chunk.id
        if chunk.model is not UNSET:
            self.model = chunk.model
        if chunk.created is not UNSET:
            self.created = chunk.created
        if chunk.prompt_token_ids:
            self.prompt_token_ids = chunk.prompt_token_ids
        if chunk.usage:
            self.usage = chunk.usage
        choices = chunk.choices
        if not choices:
            return
        for choice in choices:
            index = choice.index if isinstance(choice.index, int) else 0
            acc = self.choices.get(index)
            if acc is None:  # not setdefault: that would build an accumulator for every chunk
                acc = self.choices[index] = _ChoiceAcc()
            delta = choice.delta
            if delta:
                content, calls = delta.content, delta.tool_calls
            else:
                content = calls = None
            token_ids, finish = choice.token_ids, choice.finish_reason
            # The first generated token, whatever it is: a reply that is only end-of-turn (or only a
            # tool call) has a time to first token too.
            if self.first_token_at is None and (content or calls or token_ids or finish):
                self.first_token_at = time.perf_counter()
            if content:
                acc.content.append(content)
            if calls:
                for call in calls:
                    slot = acc.tool_calls.setdefault(
                        call.get("index", 0),
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                    slot["id"] = call.get("id") or slot["id"]
                    fn = call.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
            if token_ids:
                acc.token_ids.extend(token_ids)
            logprobs = choice.logprobs
            if logprobs and isinstance(logprobs, Logprobs) and logprobs.content:
                acc.logprobs.extend([t.logprob for t in logprobs.content])
            if finish:
                acc.finish_reason = finish

    def _message(self, acc: _ChoiceAcc) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(acc.content)}
        if acc.tool_calls:
            message["tool_calls"] = [acc.tool_calls[i] for i in sorted(acc.tool_calls)]
        return message

    def response(self, logprobs: bool = True) -> dict[str, Any]:
        """The non-streaming response the same exchange would have produced; without `logprobs`,
        each choice's `logprobs` is None (for a client that did not ask for them)."""
        choices = []
        for index in sorted(self.choices):
            acc = self.choices[index]
            choices.append({
                "index": index,
                "message": self._message(acc),
                "logprobs": {"content": [{"logprob": lp} for lp in acc.logprobs]} if logprobs else None,
                "finish_reason": acc.finish_reason,
                "token_ids": acc.token_ids,
            })
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage,
            "prompt_token_ids": self.prompt_token_ids,
        }

    def upstream_response(self) -> UpstreamResponse:
        """The response as a record reads it (what `read_response` makes of a JSON one)."""
        choices: list[UpstreamChoice] = []
        for index in sorted(self.choices):
            acc = self.choices[index]
            choices.append(_StreamedChoice(index, self._message(acc), None, acc.finish_reason, acc.token_ids,
                                           values=acc.logprobs))
        return UpstreamResponse(self.id, self.model, self.created, choices, self.usage, self.prompt_token_ids)


class _StreamedChoice(UpstreamChoice):
    """A choice rebuilt from a stream: its logprobs as the values the accumulator collected."""

    values: list[float] = []

    def logprob_values(self) -> list[float]:
        return self.values
