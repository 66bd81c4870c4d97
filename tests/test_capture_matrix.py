"""Every dialect's record is learnable: chat completions, Responses and Messages, streamed or not,
with a tool call or without, each record carries the prompt's and the completion's token ids and
the behaviour logprobs, one per completion token (a trace that came back empty, as a peer's
Anthropic traces once did, would give no training signal and nobody would notice)."""

from __future__ import annotations

import json
from collections.abc import Callable

import anthropic
import httpx
import pytest

from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway, get_record

SCENARIO = {"x-reef-scenario": "capture"}
ASK = "List the files."  # the tiny model calls `bash` with `ls` for this, given the tool
BASH = {"name": "bash", "description": "Execute a bash command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def _chat(gw: Gateway, stream: bool, tool: bool) -> str:
    client = gw.client(**SCENARIO)
    ask = {"model": MODEL_NAME, "temperature": 0, "max_tokens": 32,
           "messages": [{"role": "user", "content": ASK if tool else "hi"}],
           **({"tools": [{"type": "function", "function": BASH}]} if tool else {})}
    if not stream:
        return client.chat.completions.with_raw_response.create(**ask).headers["x-reef-agent-record-id"]
    with client.chat.completions.with_streaming_response.create(stream=True, **ask) as resp:
        chunks = list(resp.parse())
    return chunks[-1].model_extra["agent_record_id"]  # the receipt event, after the record is durable


def _responses(gw: Gateway, stream: bool, tool: bool) -> str:
    client = gw.client(**SCENARIO)
    ask = {"model": MODEL_NAME, "temperature": 0, "max_output_tokens": 32, "input": ASK if tool else "hi",
           **({"tools": [{"type": "function", **BASH}]} if tool else {})}
    if not stream:
        return client.responses.with_raw_response.create(**ask).headers["x-reef-agent-record-id"]
    events = list(client.responses.create(stream=True, **ask))
    assert events[-1].type == "response.completed"
    return events[-1].model_extra["agent_record_id"]


def _messages(gw: Gateway, stream: bool, tool: bool) -> str:
    client = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, default_headers=SCENARIO)
    ask = {"model": MODEL_NAME, "max_tokens": 32, "extra_body": {"temperature": 0},
           "messages": [{"role": "user", "content": ASK if tool else "hi"}],
           **({"tools": [{"name": BASH["name"], "description": BASH["description"],
                          "input_schema": BASH["parameters"]}]} if tool else {})}
    if not stream:
        return client.messages.with_raw_response.create(**ask).headers["x-reef-agent-record-id"]
    with client.messages.stream(**ask) as events:
        events.get_final_message()
        return events.response.headers["x-reef-agent-record-id"]


DIALECTS: dict[str, Callable[[Gateway, bool, bool], str]] = {
    "chat_completions": _chat, "responses": _responses, "messages": _messages}


@pytest.mark.parametrize("tool", [False, True], ids=["no_tool", "tool_call"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_every_record_carries_tokens_and_behaviour_logprobs(gateway: Gateway, dialect: str, stream: bool,
                                                            tool: bool) -> None:
    record = get_record(gateway, DIALECTS[dialect](gateway, stream, tool))
    assert record["stream"] is stream and record["has_token_ids"] is True
    assert json.loads(record["params_json"]).get("reef.dialect", "chat_completions") == dialect
    prompt, (choice,) = record["prompt_token_ids"], record["choices"]
    assert prompt and len(prompt) == record["gen_ai.usage.input_tokens"]
    assert choice["token_ids"] and len(choice["token_ids"]) == record["gen_ai.usage.output_tokens"]
    assert len(choice["logprobs"]) == len(choice["token_ids"])
    assert all(lp <= 0.0 for lp in choice["logprobs"])
    if tool:
        assert choice["finish_reason"] == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in choice["tool_calls"]] == [("bash", {"command": "ls"})]
    else:
        assert not choice["tool_calls"] and record["tools"] == []


_STREAMED = {  # path, a streamed body of 24 tokens, and the marker of an event that carries text
    "chat_completions": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24},
                         b'"content":"'),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 24}, b'"response.output_text.delta"'),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24},
                 b'"text_delta"'),
}


def _stream(gw: Gateway, dialect: str, interval: int | None) -> tuple[str, int]:
    """A 24-token stream; its record id and how many of its events carried text."""
    path, body, marker = _STREAMED[dialect]
    extra = {} if interval is None else {"stream_interval": interval}
    ask = {"model": MODEL_NAME, "temperature": 0, "ignore_eos": True, "stream": True, **body, **extra}
    with httpx.stream("POST", gw.url + path, json=ask, headers=SCENARIO, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        events = sum(1 for line in resp.iter_lines() if line.startswith("data:") and marker in line.encode())
        return resp.headers["x-reef-agent-record-id"], events


@pytest.mark.parametrize("dialect", sorted(_STREAMED))
def test_several_tokens_per_event_are_recorded_as_one_token_events_are(gateway: Gateway, dialect: str) -> None:
    """vLLM's `stream_interval` (per request here; `engine.stream_interval` for every call) sends
    several tokens in one event: the client gets fewer events, and the record is the same one."""
    one_id, one_events = _stream(gateway, dialect, None)
    four_id, four_events = _stream(gateway, dialect, 4)
    one, four = (get_record(gateway, r)["choices"][0] for r in (one_id, four_id))
    assert len(one["token_ids"]) == 24 and four["token_ids"] == one["token_ids"]
    assert len(four["logprobs"]) == 24 and four["logprobs"] == pytest.approx(one["logprobs"], abs=1e-3)
    assert four_events < one_events, (four_events, one_events)
