"""Stateful Responses with the real `openai` SDK: a stored response is retrieved by id, survives a
restart, and `previous_response_id` continues it (its input and output before the new input, in
the same session), exactly as if the client had sent the whole conversation; `store: false` and
unknown ids are refused as the OpenAI API refuses them."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.helpers import MODEL_NAME
from tests.helpers.gateway import get_record

INSTRUCTIONS = "You are a coding agent."
ASK = "List the files."
BASH = {"type": "function", "name": "bash", "description": "Execute a bash command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
RESULT = "notes.txt\ntodo.md"
ASKED = {"model": MODEL_NAME, "instructions": INSTRUCTIONS, "tools": [BASH], "temperature": 0}


def test_stored_responses_are_retrieved_and_continued(make_gateway) -> None:
    gateway = make_gateway("stateful").start()
    client = gateway.client(**{"x-reef-scenario": "stateful"})
    raw = client.responses.with_raw_response.create(input=ASK, max_output_tokens=48, metadata={"k": "v"},
                                                    store=True, **ASKED)
    first = raw.parse()
    record_id = raw.headers["x-reef-agent-record-id"]  # the receipt: the stored response is this record
    assert first.store is True and first.id == "resp_" + record_id.removeprefix("rec_")
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "bash"
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()

    # Continued by id, with only the tool's result as new input.
    raw2 = client.responses.with_raw_response.create(
        previous_response_id=first.id, max_output_tokens=32, **ASKED,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": RESULT}])
    second = raw2.parse()
    assert second.previous_response_id == first.id and second.output_text
    rec1, rec2 = get_record(gateway, record_id), get_record(gateway, raw2.headers["x-reef-agent-record-id"])
    assert [m["role"] for m in rec2["messages"]] == ["system", "user", "assistant", "tool"]
    assert rec2["messages"][2]["tool_calls"][0]["name"] == "bash"
    assert rec2["messages"][3] == {**rec2["messages"][3], "tool_call_id": call.call_id, "content": RESULT}
    assert rec2["gen_ai.conversation.id"] == rec1["gen_ai.conversation.id"]

    # The same conversation sent whole, as a stateless client does: the very same prompt tokens.
    whole = client.responses.with_raw_response.create(
        max_output_tokens=32, store=False, **ASKED, extra_headers={"x-reef-scenario": "stateless"},
        input=[{"role": "user", "content": ASK},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}])
    as_whole = get_record(gateway, whole.headers["x-reef-agent-record-id"])
    assert as_whole["prompt_token_ids"] == rec2["prompt_token_ids"] and rec2["prompt_token_ids"]
    assert as_whole["choices"][0]["token_ids"] == rec2["choices"][0]["token_ids"]

    # A third turn, streamed: the chain carries both earlier turns, the instructions once.
    with client.responses.stream(previous_response_id=second.id, input="Thanks.", max_output_tokens=8,
                                 **ASKED) as stream:
        third = stream.get_final_response()
    rec3 = get_record(gateway, "rec_" + third.id.removeprefix("resp_"))
    assert [m["role"] for m in rec3["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert rec3["gen_ai.conversation.id"] == rec1["gen_ai.conversation.id"] and rec3["stream"]
    assert client.responses.retrieve(third.id).output_text == third.output_text

    # Kept durably: a restarted server still has them.
    gateway.stop()
    gateway.start()
    again = gateway.client(**{"x-reef-scenario": "stateful"}).responses.retrieve(second.id)
    assert again.id == second.id and again.output_text == second.output_text


def test_the_agents_sdk_keeps_its_conversation_on_the_server(gateway) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    receipts: list[str] = []

    async def receipt(response: httpx.Response) -> None:
        receipts.append(response.headers["x-reef-agent-record-id"])

    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                                default_headers={"x-reef-scenario": "agents-sdk-stateful"},
                                http_client=httpx.AsyncClient(event_hooks={"response": [receipt]}))

    @function_tool
    def bash(command: str) -> str:
        """Execute a bash command."""
        return RESULT

    agent = Agent(name="coder", instructions=INSTRUCTIONS, tools=[bash],
                  model=OpenAIResponsesModel(model=MODEL_NAME, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=32))
    try:  # each turn sends only its new items, with the previous turn's response id
        asyncio.run(Runner.run(agent, ASK, max_turns=2, auto_previous_response_id=True))
    except Exception as exc:  # the turn cap: the tiny model may keep calling the tool
        assert type(exc).__name__ == "MaxTurnsExceeded", repr(exc)
    first, second = (get_record(gateway, record_id) for record_id in receipts)
    assert json.loads(second["params_json"])["reef.request"]["previous_response_id"] == (
        "resp_" + first["record_id"].removeprefix("rec_"))
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][3]["content"] == RESULT
    assert second["gen_ai.conversation.id"] == first["gen_ai.conversation.id"]


def test_store_false_and_unknown_ids_are_refused_as_openai_does(gateway) -> None:
    client = gateway.client(**{"x-reef-scenario": "stateful"})
    unstored = client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=4, store=False)
    assert unstored.store is False
    for missing in (unstored.id, "resp_unknown", "not-a-response-id"):
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.retrieve(missing)
        assert gone.value.body == {"message": f"No response found with id '{missing}'.",
                                   "type": "invalid_request_error", "param": "response_id",
                                   "code": "response_not_found"}
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model=MODEL_NAME, input="more", max_output_tokens=4, previous_response_id=missing)
        assert bad.value.body == {"message": f"Previous response with id '{missing}' not found.",
                                  "type": "invalid_request_error", "param": "previous_response_id",
                                  "code": "previous_response_not_found"}

    # Scenarios are isolated: a stored response is found only from its own.
    stored = client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=4)
    assert stored.store is True and client.responses.retrieve(stored.id).id == stored.id
    other = gateway.client(**{"x-reef-scenario": "elsewhere"})
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(stored.id)
    with pytest.raises(openai.BadRequestError):
        other.responses.create(model=MODEL_NAME, input="more", max_output_tokens=4, previous_response_id=stored.id)

    # Not recorded, not stored: store: true cannot go with x-reef-capture: false.
    off = gateway.client(**{"x-reef-scenario": "stateful", "x-reef-capture": "false"})
    assert off.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=4).store is False
    with pytest.raises(openai.BadRequestError) as bad:
        off.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=4, store=True)
    assert bad.value.body["param"] == "store"
    retrieve = httpx.get(f"{gateway.url}/reef/openapi.json").json()["paths"]["/v1/responses/{response_id}"]["get"]
    assert retrieve["operationId"] == "retrieve_response"
    assert {p["name"] for p in retrieve["parameters"]} == {"response_id", "x-reef-scenario"}
