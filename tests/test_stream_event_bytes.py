"""The dialects' per-token stream events, written from fixed bytes, are the generic events byte for byte."""

from __future__ import annotations

import pytest

from reef.gateway.wire.chunks import Choice, Chunk, Delta
from reef.gateway.wire.dialect import event
from reef.gateway.wire.messages import MessagesRequest, MessagesStream
from reef.gateway.wire.responses import ResponsesRequest, ResponsesStream

pytestmark = pytest.mark.model_free

# Quotes, escapes, control characters, U+2028 and U+0085 (line ends to some readers), non-BMP text.
TEXTS = ["Answer", ' q"uo\\te\n\t', "\u2028x\u0085é😀", "\x00\x1f", ""]


def _chunk(text: str) -> Chunk:
    return Chunk(choices=[Choice(index=0, delta=Delta(content=text))])


def test_responses_text_deltas_match_the_generic_event() -> None:
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", "stream": True})
    out = ResponsesStream(req, "rec_1", "m")
    events = [e for text in TEXTS for e in out.feed(_chunk(text)) if e.startswith(b"event: response.output_text.delta")]
    assert len(events) == len([t for t in TEXTS if t])
    assert out.text is not None
    first_seq = out.seq - len(events)
    for i, (got, text) in enumerate(zip(events, [t for t in TEXTS if t], strict=True)):
        want = event("response.output_text.delta", {
            "type": "response.output_text.delta", "sequence_number": first_seq + i, "item_id": out.text["id"],
            "output_index": out.text["index"], "content_index": 0, "delta": text, "logprobs": []})
        assert got == want


def test_messages_text_deltas_match_the_generic_event() -> None:
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "stream": True,
                                          "messages": [{"role": "user", "content": "hi"}]})
    out = MessagesStream(req, "rec_1", "m")
    events = [e for text in TEXTS for e in out.feed(_chunk(text)) if e.startswith(b"event: content_block_delta")]
    for got, text in zip(events, [t for t in TEXTS if t], strict=True):
        assert got == event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                    "delta": {"type": "text_delta", "text": text}})
