"""The upstream stream: SSE framing (only b"\\n" ends a line) and what the accumulator times."""

from __future__ import annotations

import orjson
import pytest

from reef.gateway.transport.upstream import split_lines

pytestmark = pytest.mark.model_free


def test_unicode_line_separators_stay_inside_an_event() -> None:
    event = b"data: " + orjson.dumps({"choices": [{"delta": {"content": "a\u2028b\x85c\u2029d"}}]}) + b"\n\n"
    lines, rest = split_lines(b"", event)
    assert rest == b""
    assert len(lines) == 1
    assert orjson.loads(lines[0][5:])["choices"][0]["delta"]["content"] == "a\u2028b\x85c\u2029d"


def test_events_split_across_reads() -> None:
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    got, pending = [], b""
    for i in range(0, len(stream), 5):
        lines, pending = split_lines(pending, stream[i : i + 5])
        got.extend(lines)
    assert got == [b'data: {"a": 1}', b'data: {"b": 2}', b"data: [DONE]"] and pending == b""


def test_time_to_first_token_counts_a_reply_that_is_only_end_of_turn() -> None:
    """An immediate end-of-turn has no content delta, but it is a generated token all the same."""
    from reef.gateway.wire.chunks import StreamAccumulator

    acc = StreamAccumulator()
    acc.feed({"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    assert acc.first_token_at is None  # the role chunk comes before any token
    end = {"index": 0, "delta": {"content": ""}, "token_ids": [2], "finish_reason": "stop"}
    acc.feed({"id": "c", "choices": [end]})
    assert acc.first_token_at is not None
