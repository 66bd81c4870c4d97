"""Learned from like chat: one tool round trip (the model calls `bash`, the tool answers, the model
replies) sent as a chat session, a Responses session and a Messages session, each under a scenario
of its own, reported on its session and trained on by a learner round. Each dialect's round must
train on exactly the training examples the chat session gives: the same token ids, the same labels
(the model's own tokens only), for the session as one trajectory and for each call alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from reef.learn.plan import plan_round
from reef.learn.round import run_round
from reef.recipe import Snapshot
from reef.recipe.tokens import IGNORE, CutStats, sft_examples, trajectory_examples
from reef.scenario.schema import RecipeSpec
from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway, get_record, wait_flushed
from tests.helpers.tools import BASH, READ

pytestmark = [pytest.mark.vllm]

SYSTEM = "You are a coding agent."
ASK = "List the files."
RESULT = "notes.txt\ntodo.md"
MAX_LENGTH = 2048


def _chat(gw: Gateway) -> list[str]:
    client = gw.client(**{"x-reef-scenario": "via-chat"})
    tools = [READ, BASH]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
    first = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=messages, tools=tools,
                                                             max_tokens=48, temperature=0)
    (call,) = first.parse().choices[0].message.tool_calls or []
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    second = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=messages, tools=tools,
                                                              max_tokens=32, temperature=0)
    return [first.headers["x-reef-agent-record-id"], second.headers["x-reef-agent-record-id"]]


def _responses(gw: Gateway) -> list[str]:
    client = gw.client(**{"x-reef-scenario": "via-responses"})
    tools = [{"type": "function", **t["function"]} for t in (READ, BASH)]
    given: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]}]
    first = client.responses.with_raw_response.create(model=MODEL_NAME, instructions=SYSTEM, input=given, tools=tools,
                                                      max_output_tokens=48, temperature=0, store=False)
    (call,) = [item for item in first.parse().output if item.type == "function_call"]
    given += [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    second = client.responses.with_raw_response.create(model=MODEL_NAME, instructions=SYSTEM, input=given,
                                                       tools=tools, max_output_tokens=32, temperature=0, store=False)
    return [first.headers["x-reef-agent-record-id"], second.headers["x-reef-agent-record-id"]]


def _messages(gw: Gateway) -> list[str]:
    client = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0,
                                 default_headers={"x-reef-scenario": "via-messages"})
    tools: Any = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in (READ, BASH)]
    given: list[Any] = [{"role": "user", "content": [{"type": "text", "text": ASK}]}]
    first = client.messages.with_raw_response.create(model=MODEL_NAME, system=SYSTEM, messages=given, tools=tools,
                                                     max_tokens=48, extra_body={"temperature": 0})
    (use,) = [b for b in first.parse().content if b.type == "tool_use"]
    given += [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                 "input": use.input}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]
    second = client.messages.with_raw_response.create(model=MODEL_NAME, system=SYSTEM, messages=given, tools=tools,
                                                      max_tokens=32, extra_body={"temperature": 0})
    return [first.headers["x-reef-agent-record-id"], second.headers["x-reef-agent-record-id"]]


def _round(gw: Gateway, scenario: str, base: Path) -> Snapshot:
    """The learner's round for the scenario (rft on whole sessions, one LoRA step), ungated: the
    snapshot it trained on."""
    spec = RecipeSpec(recipe="rft", params={"trajectories": True, "kind": "lora", "max_steps": 1,
                                            "max_length": MAX_LENGTH})
    result = run_round(plan_round(scenario, spec, base_model=str(base), data_dir=gw.data_dir), evaluate=False,
                       progress=False)
    assert result.status == "trained" and result.metrics is not None, result
    assert result.metrics["train_samples"] == 1  # the session, as one example
    assert result.snapshot is not None
    return Snapshot.open(gw.data_dir / "snapshots" / scenario)


def test_a_responses_and_a_messages_session_train_like_the_chat_session(make_gateway, tiny: Path) -> None:  # noqa: ANN001
    gw: Gateway = make_gateway("dialect-rounds").start()
    sessions = {"via-chat": _chat(gw), "via-responses": _responses(gw), "via-messages": _messages(gw)}
    for scenario, record_ids in sessions.items():
        records = [get_record(gw, r) for r in record_ids]
        (session,) = {r["gen_ai.conversation.id"] for r in records}  # both calls, one session per dialect
        assert records[0]["choices"][0]["tool_calls"][0]["name"] == "bash", (scenario, records[0]["choices"])
        report = httpx.post(f"{gw.url}/reef/report", headers={"x-reef-scenario": scenario},
                            json={"session_id": session, "score": 1.0})
        assert report.status_code == 200 and report.json()["agent_record_ids"] == record_ids, report.text
    wait_flushed(gw)

    trained = {scenario: _round(gw, scenario, tiny) for scenario in sessions}
    cuts = CutStats()
    whole = {s: trajectory_examples(snap.trajectories(), MAX_LENGTH, cuts).remove_columns("session_id").to_list()
             for s, snap in trained.items()}
    per_call = {s: sft_examples(snap.samples(), MAX_LENGTH, cuts).remove_columns("record_id").to_list()
                for s, snap in trained.items()}
    assert cuts.as_metrics() == CutStats().as_metrics(), "nothing may be cut: the comparison is of whole examples"

    (chat,) = whole["via-chat"]
    chat_records = [get_record(gw, r) for r in sessions["via-chat"]]
    # The chat session itself is the reference the recipe's own tests pin: the last call's prompt and
    # completion, the loss on the two completions the engine sampled and nothing else.
    assert chat["input_ids"] == chat_records[1]["prompt_token_ids"] + chat_records[1]["choices"][0]["token_ids"]
    assert sum(label != IGNORE for label in chat["labels"]) == sum(
        len(r["choices"][0]["token_ids"]) for r in chat_records)
    assert len(per_call["via-chat"]) == 2
    for dialect in ("via-responses", "via-messages"):
        assert whole[dialect] == whole["via-chat"], f"{dialect}: the session trains on other tokens than chat's"
        assert per_call[dialect] == per_call["via-chat"], f"{dialect}: a call trains on other tokens than chat's"
