"""The Responses API and Anthropic's Messages API against the real engine, with the real SDKs.

Each dialect is translated to a chat completions body and served through the chat route's one
recording path: the records must be the chat records the same prompt gives (the engine's own token
ids), tool calls and results must round-trip, the session must be stitched across the dialect's
turns, and errors must come back in the dialect's own shape (so its SDK raises its typed error).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway
from tests.helpers.gateway import get_record as _record

INSTRUCTIONS = "You are a coding agent."
ASK = "List the files."
# The tools of tests/test_tools.py, which the embedded model calls (`bash` with `ls`) for ASK.
READ = {"name": "read", "description": "Read the contents of a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
BASH = {"name": "bash", "description": "Execute a bash command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
                       "required": ["command"]}}
RESPONSES_TOOLS = [{"type": "function", **t} for t in (READ, BASH)]
ANTHROPIC_TOOLS = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                   for t in (READ, BASH)]
RESULT = "notes.txt\ntodo.md"


def _openai(gw: Gateway, scenario: str) -> openai.OpenAI:
    return gw.client(**{"x-reef-scenario": scenario})


def _anthropic(gw: Gateway, scenario: str, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=api_key, max_retries=0,
                               default_headers={"x-reef-scenario": scenario})


def _engine_tokens(vllm_url: str, record: dict) -> tuple[list[int], list[int]]:
    """The engine's own prompt and completion token ids for the record's chat body, asked directly."""
    body = {**json.loads(record["request_json"]), "model": MODEL_NAME, "return_token_ids": True, "stream": False}
    body.pop("stream_options", None)
    resp = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    return out["prompt_token_ids"], out["choices"][0]["token_ids"]


def _same_as_engine(vllm_url: str, record: dict) -> None:
    prompt, completion = _engine_tokens(vllm_url, record)
    assert record["prompt_token_ids"] == prompt
    assert record["choices"][0]["token_ids"] == completion
    assert len(record["choices"][0]["logprobs"]) == len(completion) > 0


def test_responses_json_and_stream_with_a_tool_round_trip(gateway: Gateway, vllm_url: str) -> None:
    client = _openai(gateway, "responses")
    first_input = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]}]
    raw = client.responses.with_raw_response.create(
        model=MODEL_NAME, instructions=INSTRUCTIONS, input=first_input, tools=RESPONSES_TOOLS, temperature=0,
        max_output_tokens=48, store=False, reasoning={"effort": "low"}, include=["reasoning.encrypted_content"],
        prompt_cache_key="k", metadata={"a": "b"}, parallel_tool_calls=False)
    response = raw.parse()
    record_id = raw.headers["x-reef-agent-record-id"]
    assert response.status == "completed" and response.id == "resp_" + record_id.removeprefix("rec_")
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "bash" and json.loads(call.arguments) == {"command": "ls"}
    assert response.model_extra["agent_record_id"] == record_id
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0

    # Streamed with the SDK's helper: the Responses event sequence, the same call, the receipt last.
    with client.responses.stream(model=MODEL_NAME, instructions=INSTRUCTIONS, input=first_input,
                                 tools=RESPONSES_TOOLS, temperature=0, max_output_tokens=48, store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds
    # The receipt on the final event, as the raw stream has it (the SDK's helper rebuilds that event).
    raw_events = list(client.responses.create(model=MODEL_NAME, instructions=INSTRUCTIONS, input=first_input,
                                              tools=RESPONSES_TOOLS, temperature=0, max_output_tokens=48,
                                              store=False, stream=True))
    assert raw_events[-1].type == "response.completed"
    streamed_id = raw_events[-1].model_extra["agent_record_id"]
    assert raw_events[-1].response.model_extra["agent_record_id"] == streamed_id
    assert final.id.startswith("resp_") and final.id != raw_events[-1].response.id  # two calls, two records
    (streamed_call,) = [item for item in final.output if item.type == "function_call"]
    assert (streamed_call.name, json.loads(streamed_call.arguments)) == ("bash", {"command": "ls"})

    plain, streamed = _record(gateway, record_id), _record(gateway, streamed_id)
    for rec in (plain, streamed):
        assert json.loads(rec["params_json"])["reef.dialect"] == "responses"
        assert [m["role"] for m in rec["messages"]] == ["system", "user"]
        assert rec["messages"][1]["parts"] == [{"type": "text", "text": ASK}]
        assert [t["name"] for t in rec["tools"]] == ["read", "bash"]
        assert rec["choices"][0]["tool_calls"][0]["name"] == "bash"
        assert rec["choices"][0]["finish_reason"] == "tool_calls"
    assert streamed["stream"] and not plain["stream"]
    assert streamed["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    _same_as_engine(vllm_url, plain)

    # The tool's result goes back as a function_call_output; the model answers in the same session.
    second_input = [*first_input, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                   "arguments": call.arguments},
                    {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    raw2 = client.responses.with_raw_response.create(
        model=MODEL_NAME, instructions=INSTRUCTIONS, input=second_input, tools=RESPONSES_TOOLS, temperature=0,
        max_output_tokens=32, store=False)
    answer = raw2.parse()
    assert answer.output_text and not [i for i in answer.output if i.type == "function_call"]
    rec2 = _record(gateway, raw2.headers["x-reef-agent-record-id"])
    assert [m["role"] for m in rec2["messages"]] == ["system", "user", "assistant", "tool"]
    assert rec2["messages"][2]["tool_calls"][0]["name"] == "bash"
    assert rec2["messages"][3]["tool_call_id"] == call.call_id and rec2["messages"][3]["content"] == RESULT
    assert rec2["gen_ai.conversation.id"] == plain["gen_ai.conversation.id"]
    _same_as_engine(vllm_url, rec2)

    # The same conversation through chat completions: the record a recipe reads is the same record.
    chat = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, temperature=0, max_tokens=48,
        tools=[{"type": "function", "function": t} for t in (READ, BASH)],
        messages=[{"role": "system", "content": INSTRUCTIONS},
                  {"role": "user", "content": [{"type": "text", "text": ASK}]}],
        extra_headers={"x-reef-scenario": "responses-as-chat"})
    as_chat = _record(gateway, chat.headers["x-reef-agent-record-id"])
    for column in ("prompt_token_ids", "messages", "tools", "tool_choice", "gen_ai.request.max_tokens",
                   "gen_ai.request.temperature"):
        assert as_chat[column] == plain[column], column
    assert as_chat["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    # bf16 logprobs vary a little between two engine calls (batching); the tokens may not.
    assert as_chat["choices"][0]["logprobs"] == pytest.approx(plain["choices"][0]["logprobs"], abs=0.05)

    # A report on the session credits the whole exchange.
    resp = httpx.post(f"{gateway.url}/reef/report", headers={"x-reef-scenario": "responses"},
                      json={"session_id": plain["gen_ai.conversation.id"], "score": 1.0})
    assert resp.status_code == 200, resp.text
    assert {record_id, rec2["record_id"]} <= set(resp.json()["agent_record_ids"])

    # A retry with the receipt is answered from the record, in the dialect, without a new call.
    again = client.responses.with_raw_response.create(
        model=MODEL_NAME, instructions=INSTRUCTIONS, input=first_input, tools=RESPONSES_TOOLS, temperature=0,
        max_output_tokens=48, store=False, reasoning={"effort": "low"}, include=["reasoning.encrypted_content"],
        prompt_cache_key="k", metadata={"a": "b"}, parallel_tool_calls=False,
        extra_headers={"x-reef-agent-record-id": record_id})
    assert again.headers.get("x-reef-replayed") == "true"
    assert again.parse().output[-1].arguments == call.arguments


def test_responses_errors_are_openai_errors(gateway: Gateway) -> None:
    client = _openai(gateway, "responses")
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL_NAME, input="hi", previous_response_id="resp_x")
    assert bad.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL_NAME, input=[{"type": "web_search_call", "id": "x"}])
    assert bad.value.body["param"] == "input[0].type"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL_NAME, input="hi", temperature=5)
    assert bad.value.body["param"] == "temperature"
    # A prompt over the model's context: the typed context error, the tokens counted, nothing truncated.
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL_NAME, input="word " * 6000, max_output_tokens=8)
    assert bad.value.body["code"] == "context_length_exceeded" and bad.value.body["param"] == "input"
    assert "maximum context length" in bad.value.body["message"]
    refused = httpx.get(f"{gateway.url}/reef/status").json()["context_refused"]
    assert refused.get("responses", 0) >= 1


def test_messages_json_and_stream_with_a_tool_round_trip(make_gateway, vllm_url: str) -> None:
    # A gateway of its own: the sessions index is the server's, and the Responses test above sent
    # the same conversation, whose session this one's second turn would continue.
    gateway = make_gateway("messages").start()
    client = _anthropic(gateway, "messages")
    system = [{"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}}]
    first = [{"role": "user", "content": [{"type": "text", "text": ASK}]}]
    raw = client.messages.with_raw_response.create(
        model=MODEL_NAME, system=system, messages=first, tools=ANTHROPIC_TOOLS, max_tokens=48,
        extra_body={"temperature": 0}, metadata={"user_id": "u"},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    message = raw.parse()
    record_id = raw.headers["x-reef-agent-record-id"]
    assert message.stop_reason == "tool_use" and message.id == "msg_" + record_id.removeprefix("rec_")
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "bash" and use.input == {"command": "ls"}
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0

    with client.messages.stream(model=MODEL_NAME, system=system, messages=first, tools=ANTHROPIC_TOOLS,
                                max_tokens=48, extra_body={"temperature": 0}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    streamed_id = stream.response.headers["x-reef-agent-record-id"]
    (streamed_use,) = [b for b in final.content if b.type == "tool_use"]
    assert (streamed_use.name, streamed_use.input) == ("bash", {"command": "ls"}) and final.stop_reason == "tool_use"

    plain, streamed = _record(gateway, record_id), _record(gateway, streamed_id)
    for rec in (plain, streamed):
        assert json.loads(rec["params_json"])["reef.dialect"] == "messages"
        assert [m["role"] for m in rec["messages"]] == ["system", "user"]
        assert rec["choices"][0]["tool_calls"][0]["name"] == "bash"
    assert streamed["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    _same_as_engine(vllm_url, plain)

    # tool_result back, inside a user turn (as Claude Code sends it, with a system message too).
    second = [*first, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                         "input": use.input}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]
    raw2 = client.messages.with_raw_response.create(
        model=MODEL_NAME, system=system, messages=second, tools=ANTHROPIC_TOOLS, max_tokens=32,
        extra_body={"temperature": 0})
    answer = raw2.parse()
    assert answer.content and answer.content[0].type == "text" and answer.stop_reason in ("end_turn", "max_tokens")
    rec2 = _record(gateway, raw2.headers["x-reef-agent-record-id"])
    assert [m["role"] for m in rec2["messages"]] == ["system", "user", "assistant", "tool"]
    assert rec2["messages"][3]["tool_call_id"] == use.id and rec2["messages"][3]["content"] == RESULT
    assert rec2["gen_ai.conversation.id"] == plain["gen_ai.conversation.id"]
    _same_as_engine(vllm_url, rec2)

    # count_tokens: the engine's own count of the prompt the call above had.
    counted = client.messages.count_tokens(model=MODEL_NAME, system=system, messages=first, tools=ANTHROPIC_TOOLS)
    assert counted.input_tokens == len(plain["prompt_token_ids"])


def test_messages_errors_are_anthropic_errors(gateway: Gateway, make_gateway) -> None:
    client = _anthropic(gateway, "messages")
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=[{"role": "tool", "content": "x"}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].role" in bad.value.body["error"]["message"]
    resp = httpx.post(f"{gateway.url}/v1/messages?beta=true", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=[{"role": "user", "content": "word " * 6000}])
    assert bad.value.body["error"]["message"].startswith("prompt is too long: ")
    assert httpx.get(f"{gateway.url}/reef/status").json()["context_refused"].get("messages", 0) >= 1

    # api_keys: Anthropic's x-api-key works as a bearer token does; a wrong one is Anthropic's 401.
    keyed = make_gateway("keyed", env={"REEF_API_KEYS": json.dumps([{"key": "sk-test-key-1"}])}).start()
    ok = _anthropic(keyed, "messages", api_key="sk-test-key-1").messages.create(
        model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert ok.type == "message"
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _anthropic(keyed, "messages", api_key="wrong").messages.create(
            model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["error"]["type"] == "authentication_error"


def test_capture_off_serves_every_dialect_and_records_nothing(gateway: Gateway, make_gateway) -> None:
    off = {"x-reef-capture": "false", "x-reef-scenario": "uncaptured"}
    chat = gateway.client(**off).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.headers["x-reef-captured"] == "false" and "x-reef-agent-record-id" not in chat.headers
    assert chat.parse().choices[0].message.content is not None
    with gateway.client(**off).responses.with_streaming_response.create(
            model=MODEL_NAME, input="hi", max_output_tokens=4, stream=True) as resp:
        assert resp.headers["x-reef-captured"] == "false" and "x-reef-agent-record-id" not in resp.headers
        events = list(resp.parse())
    assert events[-1].type == "response.completed" and not (events[-1].model_extra or {}).get("agent_record_id")
    message = _anthropic(gateway, "uncaptured").messages.with_raw_response.create(
        model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": "hi"}], extra_headers=off)
    assert message.headers["x-reef-captured"] == "false" and message.parse().type == "message"
    assert httpx.get(f"{gateway.url}/reef/status").json()["scenarios"]["uncaptured"]["records"] == 0

    # `limits.allow_uncaptured: false` refuses it, in each dialect's shape; a receipt cannot go with it.
    strict = make_gateway("strict", env={"REEF_LIMITS__ALLOW_UNCAPTURED": "false"}).start()
    with pytest.raises(openai.PermissionDeniedError) as denied:
        strict.client(**off).responses.create(model=MODEL_NAME, input="hi", max_output_tokens=4)
    assert denied.value.body["param"] == "x-reef-capture"
    with pytest.raises(anthropic.PermissionDeniedError):
        _anthropic(strict, "uncaptured").messages.create(
            model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": "hi"}], extra_headers=off)
    with pytest.raises(openai.BadRequestError):
        gateway.client(**off, **{"x-reef-agent-record-id": "r1"}).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def test_openapi_documents_the_dialect_routes(gateway: Gateway) -> None:
    doc = httpx.get(f"{gateway.url}/reef/openapi.json").json()
    bodies = {"/v1/responses": "ResponsesRequest", "/v1/messages": "MessagesRequest",
              "/v1/messages/count_tokens": "CountTokensRequest"}
    for path, model in bodies.items():
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + model)
        error = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
        assert error.endswith("/AnthropicError" if path.startswith("/v1/messages") else "/ErrorBody")
    assert doc["components"]["schemas"]["ResponsesRequest"]["additionalProperties"] is True
