"""The gateway's hot path: responses read without a Python tree, records written without a model.

`record_row` writes a `Record`'s row without building the model, and `client_json` edits the
response in raw JSON without parsing it. Both are held here to the slow, obvious versions: the
row to what `Record.model_dump_json` writes for it (same keys, same values, same JSON types), the
client's copy to `for_client` over the parsed response.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reef.experience import shards
from reef.experience.schema import Record, RecordRow
from reef.gateway.recorder import Exchange, record_row
from reef.gateway.sessions import prefix_hashes
from reef.gateway.wire.completion import ClientWants, client_json, for_client, read_response
from reef.gateway.wire.errors import ReefError

pytestmark = pytest.mark.model_free

SAMPLES = Path(__file__).parent / "fixtures" / "vllm_samples"

text = st.text(max_size=12)
# What orjson decodes a request into: it reads larger integers as floats.
int64 = st.integers(-(2**63), 2**63 - 1)
ids = st.text(alphabet="abcdef0123456789", min_size=1, max_size=8)
arguments = st.one_of(text, st.dictionaries(st.sampled_from("abc"), int64 | text, max_size=2))
tool_call = st.fixed_dictionaries(
    {"id": ids, "type": st.just("function"), "function": st.fixed_dictionaries({"name": ids, "arguments": arguments})})
content = st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2))
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": content}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | text},
                          optional={"tool_calls": st.lists(tool_call, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": text, "tool_call_id": ids}),
)
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": ids}, optional={"description": text, "parameters": st.just({"type": "object"})})})
body = st.fixed_dictionaries(
    {"model": st.just("reef-tiny"), "messages": st.lists(message, min_size=1, max_size=4)},
    optional={
        # JSON has one number type: the contract takes 1 for 1.0 and 2.0 for 2.
        "temperature": st.integers(0, 2) | st.floats(0, 2), "top_p": st.floats(0.01, 1),
        "max_tokens": st.integers(1, 99) | st.integers(1, 99).map(float), "n": st.integers(1, 3),
        "tools": st.lists(tool, min_size=1, max_size=2), "seed": int64, "stop": st.lists(text, max_size=2),
        "logprobs": st.booleans(), "return_token_ids": st.booleans(),
    },
)
token = st.fixed_dictionaries({"token": text, "logprob": st.floats(-30, 0), "bytes": st.lists(st.integers(0, 255)),
                               "top_logprobs": st.just([])})
choice = st.fixed_dictionaries(
    {"index": st.integers(0, 3), "message": st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.none() | text},
        optional={"tool_calls": st.lists(tool_call, max_size=2), "refusal": st.none()}),
     "logprobs": st.none() | st.fixed_dictionaries({"content": st.lists(token, max_size=5)}),
     "finish_reason": st.none() | st.sampled_from(["stop", "length", "tool_calls"])},
    optional={"token_ids": st.lists(st.integers(0, 50_000), max_size=5), "stop_reason": st.none() | int64},
)
response = st.fixed_dictionaries(
    {"id": ids, "object": st.just("chat.completion"), "created": st.integers(0, 2**31), "model": ids,
     "choices": st.lists(choice, min_size=1, max_size=3)},
    optional={"usage": st.fixed_dictionaries({"prompt_tokens": st.integers(0, 999),
                                              "completion_tokens": st.integers(0, 999)}),
              "prompt_token_ids": st.lists(st.integers(0, 50_000), max_size=5),
              "system_fingerprint": text, "kv_transfer_params": st.none()},
)
created = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))


def _exchange(chat: dict[str, Any], when: datetime, tags: dict[str, str], harness: bool) -> Exchange:
    sent = [{"role": "system", "content": "rules"}, *chat["messages"]] if harness else None
    return Exchange(record_id="rec_1", scenario="s", session_id="ses_1", release_id="s@r1", created_at=when,
                    body=chat, body_hash="h" * 64, request_model="reef-tiny", tags=tags, stream=False,
                    latency_ms=12.5, ttft_ms=None, harness_id="hh" if harness else None, sent_messages=sent,
                    prefix_hash=prefix_hashes(chat["messages"])[-1])


def _canonical(row: bytes) -> bytes:
    return orjson.dumps(orjson.loads(row), option=orjson.OPT_SORT_KEYS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat=body, upstream=response, when=created, tags=st.dictionaries(ids, text, max_size=2),
       harness=st.booleans(), wants=st.tuples(st.booleans(), st.booleans()))
def test_the_row_is_what_the_model_writes(chat: dict[str, Any], upstream: dict[str, Any], when: datetime,
                                          tags: dict[str, str], harness: bool, wants: tuple[bool, bool]) -> None:
    raw = orjson.dumps(upstream)
    client_wants = ClientWants(*wants, usage=True)
    sent = client_json(raw, client_wants, "reef-tiny")
    # The raw edit and the parsed one agree on what the client sees.
    assert orjson.loads(sent) == for_client(orjson.loads(raw), client_wants, "reef-tiny")

    row = record_row(_exchange(chat, when, tags, harness), read_response(raw), sent)
    record = Record.model_validate_json(row.row)
    # Byte for byte, up to key order and float spelling: the same keys, values and JSON types.
    assert _canonical(row.row) == _canonical(record.model_dump_json(by_alias=True).encode())
    assert (row.record_id, row.scenario, row.session_id, row.created_at, row.body_hash, row.reply_hashes) == (
        record.record_id, record.scenario, record.session_id, record.created_at, record.body_hash,
        record.reply_hashes)
    assert [c.logprobs for c in record.choices] == [
        [t["logprob"] for t in (c["logprobs"] or {}).get("content") or ()] for c in upstream["choices"]]
    assert record.response_json == sent.decode()


def test_rows_take_arrows_fast_path(caplog: pytest.LogCaptureFixture) -> None:
    """The shard writer parses rows with arrow's JSON reader; a row it rejected would fall back to
    validating every row in Python (with a warning)."""
    rows = []
    for sample in ("nonstream.json", "nonstream_n2.json", "nonstream_length.json"):
        raw = (SAMPLES / sample).read_bytes()
        chat = {"model": "reef-tiny", "messages": [{"role": "user", "content": "What is 3 + 4?"}],
                "temperature": 1, "max_tokens": 8.0}
        ex = _exchange(chat, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), {"run": "a"}, harness=False)
        rows.append(record_row(ex, read_response(raw), client_json(raw, ClientWants(False, False, True), "m")).row)
    with caplog.at_level(logging.WARNING, logger="reef.experience.shards"):
        table = shards.rows_to_arrow("records", rows)
    assert not caplog.records
    assert table.to_pylist() == [Record.model_validate_json(r).model_dump(by_alias=True) for r in rows]


def test_a_vllm_response_keeps_its_token_ids_and_logprobs() -> None:
    raw = (SAMPLES / "nonstream.json").read_bytes()
    parsed = orjson.loads(raw)
    chat = {"model": "reef-tiny", "messages": [{"role": "user", "content": "What is 3 + 4?"}]}
    client = client_json(raw, ClientWants(False, False, True), "reef-tiny")
    record = record_row(_exchange(chat, datetime.now(UTC), {}, False), read_response(raw), client).record()
    choice = parsed["choices"][0]
    assert record.choices[0].token_ids == choice["token_ids"]
    assert record.choices[0].logprobs == [t["logprob"] for t in choice["logprobs"]["content"]]
    assert record.prompt_token_ids == parsed["prompt_token_ids"]
    assert (record.input_tokens, record.output_tokens) == (parsed["usage"]["prompt_tokens"],
                                                           parsed["usage"]["completion_tokens"])
    seen = orjson.loads(client)
    # What the client did not ask for is gone; everything else vLLM sent is there, the model renamed.
    assert seen["choices"][0]["logprobs"] is None and "token_ids" not in seen["choices"][0]
    assert "prompt_token_ids" not in seen and seen["model"] == "reef-tiny"
    assert seen["system_fingerprint"] == parsed["system_fingerprint"]
    assert seen["choices"][0]["stop_reason"] == choice["stop_reason"]


@pytest.mark.parametrize("raw", [
    b"not json", b"[]", b'{"choices": {"0": {}}}', b'{"choices": [{"logprobs": {"content": [{"logprob": "x"}]}}]}',
    b'{"choices": [{"token_ids": [1.5]}]}',
])
def test_a_response_that_is_no_chat_completion_is_a_502(raw: bytes) -> None:
    with pytest.raises(ReefError) as caught:
        read_response(raw)
    assert (caught.value.status, caught.value.code) == (502, "bad_upstream_response")


def test_every_record_field_must_be_given() -> None:
    """A field added to `Record` but not to the row builder fails loudly, never a silently missing column."""
    raw = (SAMPLES / "nonstream.json").read_bytes()
    chat = {"model": "reef-tiny", "messages": [{"role": "user", "content": "hi"}]}
    fields = record_row(_exchange(chat, datetime.now(UTC), {}, False), read_response(raw), b"{}").record().model_dump()
    assert RecordRow.of(fields).record().model_dump() == fields
    del fields["harness_id"]
    with pytest.raises(KeyError):
        RecordRow.of(fields)
