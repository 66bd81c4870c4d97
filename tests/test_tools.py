"""Tool calling end to end: the embedded model writes a call, vLLM's hermes parser (on by default in
the managed engine) turns it into `tool_calls`, the gateway records the offered tools, the call
(streamed deltas assembled) and the tool result as columns, readable in polars and datasets."""

from __future__ import annotations

import json

import datasets
import polars as pl

from reef.config import ServeConfig
from reef.engine.supervisor import EngineSupervisor
from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway, get_record, wait_flushed
from tests.helpers.tools import BASH, READ

ASK = [{"role": "system", "content": "You are a coding agent."},
       {"role": "user", "content": [{"type": "text", "text": "List the files."}]}]


def test_engine_starts_with_a_tool_parser_by_default() -> None:
    cmd = EngineSupervisor(ServeConfig(), log_path=None).command()  # type: ignore[arg-type]
    assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in cmd
    off = EngineSupervisor(ServeConfig.model_validate({"engine": {"tool_parser": None, "chat_template": "t.jinja"}}),
                           log_path=None).command()  # type: ignore[arg-type]
    assert "--tool-call-parser" not in off and "--enable-auto-tool-choice" not in off
    assert off[off.index("--chat-template") + 1] == "t.jinja"


def test_tool_call_generated_parsed_recorded_and_answered(gateway: Gateway) -> None:
    client = gateway.client(**{"x-reef-scenario": "tools"})
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=ASK, tools=[READ, BASH], max_tokens=48, temperature=0)
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}

    # Streamed: the same call arrives as deltas; the client and the record both assemble it whole.
    with client.chat.completions.with_streaming_response.create(
        model=MODEL_NAME, messages=ASK, tools=[READ, BASH], max_tokens=48, temperature=0, stream=True,
    ) as response:
        stream_id = response.headers["x-reef-agent-record-id"]
        chunks = list(response.parse())
    parts: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for ch in chunk.choices:
            for delta in ch.delta.tool_calls or ():
                slot = parts.setdefault(delta.index, {"name": "", "arguments": ""})
                slot["name"] += (delta.function and delta.function.name) or ""
                slot["arguments"] += (delta.function and delta.function.arguments) or ""
    assert [(p["name"], json.loads(p["arguments"])) for p in parts.values()] == [("bash", {"command": "ls"})]

    plain = get_record(gateway, raw.headers["x-reef-agent-record-id"])
    streamed = get_record(gateway, stream_id)
    for rec in (plain, streamed):
        assert [t["name"] for t in rec["tools"]] == ["read", "bash"]
        assert json.loads(rec["tools"][1]["parameters_json"]) == BASH["function"]["parameters"]
        assert rec["tools"][1]["description"] == "Execute a bash command."
        (stored,) = rec["choices"][0]["tool_calls"]
        assert stored["name"] == "bash" and json.loads(stored["arguments"]) == {"command": "ls"}
        assert stored["id"] and stored["type"] == "function"
        assert rec["choices"][0]["finish_reason"] == "tool_calls"
        assert rec["messages"][1]["parts"] == [{"type": "text", "text": "List the files."}]
        assert rec["messages"][1]["content"] == "List the files."
        assert len(rec["choices"][0]["token_ids"]) == len(rec["choices"][0]["logprobs"]) > 0
    assert streamed["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    assert streamed["stream"] and not plain["stream"]

    # The tool result goes back; the model answers from it, in the same (stitched) session.
    turn2 = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": "notes.txt\ntodo.md"}]
    raw2 = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=turn2, tools=[READ, BASH], max_tokens=32, temperature=0)
    answer = raw2.parse().choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls and answer.message.content
    rec2 = get_record(gateway, raw2.headers["x-reef-agent-record-id"])
    assert rec2["gen_ai.conversation.id"] == plain["gen_ai.conversation.id"]
    assert rec2["messages"][2]["tool_calls"][0]["name"] == "bash"
    assert rec2["messages"][3]["role"] == "tool"
    assert rec2["messages"][3]["tool_call_id"] == call.id and rec2["messages"][3]["content"] == "notes.txt\ntodo.md"

    # Columns, not JSON strings: polars reaches into them directly, and datasets reads the same shards.
    wait_flushed(gateway)
    shards = f"{gateway.data_dir}/experience/tools/records/*.parquet"
    frame = (pl.scan_parquet(shards)
             .select("record_id", pl.col("tools").list.eval(pl.element().struct.field("name")).alias("tool_names"),
                     pl.col("choices").list.first().struct.field("tool_calls").alias("calls"))
             .collect())
    by_id = {row["record_id"]: row for row in frame.iter_rows(named=True)}
    assert by_id[stream_id]["tool_names"] == ["read", "bash"]
    assert by_id[stream_id]["calls"][0]["name"] == "bash"
    assert by_id[rec2["record_id"]]["calls"] == []
    ds = datasets.load_dataset("parquet", data_files=shards, split="train")
    assert {"tools", "tool_choice"} <= set(ds.column_names)
    tool_turns = [m for row in ds for m in row["messages"] if m["role"] == "tool"]
    assert tool_turns and tool_turns[0]["tool_call_id"] == call.id
