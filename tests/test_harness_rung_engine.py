"""The ladder's harness rung through the session's real vLLM: live traffic with two rewarded replies
of the four the scenario's rft waits for; the learner runs a harness round first, says why in its
status, writes the rewarded replies as few-shot examples, gates the candidate on the engine (same
weights, each arm's harness), and tries that head no more, leaving the records to rft. Model-free
parts: tests/test_harness_rung.py."""

from __future__ import annotations

import json
import os
import re

import httpx
import pytest
import yaml

from reef.registry.harness import SHOTS_FILE, Harness, inject
from tests.helpers import MODEL_NAME, TINY, wait_for
from tests.helpers.gateway import Gateway
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm]


def test_the_learner_shows_the_first_rewarded_replies_as_few_shot_examples(make_gateway) -> None:  # noqa: ANN001
    gw: Gateway = make_gateway("harness-rung", extra_args=["--model", str(TINY)])
    gw.workdir.mkdir(parents=True, exist_ok=True)
    (gw.workdir / "eval.jsonl").write_text("".join(json.dumps(demo.as_row(t)) + "\n" for t in demo.eval_tasks()[:8]))
    (gw.workdir / "adds.py").write_text(
        "import re\n\ndef reward(task, reply):\n    m = re.search(r'Answer:\\s*(-?\\d+)', reply)\n"
        "    return 1.0 if m and int(m.group(1)) == task['answer'] else 0.0\n")
    (gw.workdir / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "store": {"flush_interval_s": 0.2},
        "learner": {"enabled": True, "interval_s": 0.5, "min_records": 4, "min_rewarded": 4, "explore": False},
        "release": {"gate": {"samples": 1}},
        "recipes": {"r": {"recipe": "rft", "params": {"kind": "lora", "min_score": 1.0}}},
        "scenarios": {"adds": {"policy": "auto", "recipe": "r", "reward": "adds:reward",
                               "harness": {"inject": "system_prepend"},
                               "eval": {"path": "eval.jsonl", "max_new_tokens": 12}}},
    }))
    gw.start()
    client = gw.client(**{"x-reef-scenario": "adds"})
    asked = []
    for n, t in enumerate(demo.eval_tasks()[8:12]):  # the verifier's say, as an application reports it
        raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=t.messages, max_tokens=8)
        asked.append((t.messages[-1]["content"], raw.parse().choices[0].message.content or ""))
        report = {"agent_record_id": raw.headers["x-reef-agent-record-id"], "score": 1.0 if n < 2 else 0.0}
        assert httpx.post(f"{gw.url}/reef/report", json=report, headers={"x-reef-scenario": "adds"}).status_code == 200

    def learner() -> dict:
        return httpx.get(f"{gw.url}/reef/status", timeout=30).json()["learner"]["scenarios"]["adds"]

    seen: list[str | None] = []
    wait_for(lambda: seen.append(learner()["harness"]) or seen[-1] is not None, timeout=60)
    assert seen[-1] == "harness: 2 rewarded replies as few-shot examples"
    wait_for(lambda: (learner()["harness_rung"] or {}).get("rounds", 0) >= 1 and not learner()["running"],
             timeout=120)
    mine = learner()
    assert mine["harness"] is None and mine["harness_rung"]["tried"] == ["adds@r0"], mine
    assert mine["harness_rung"]["last"]["status"] == "trained", mine
    # The records it showed are not consumed: rft still counts them, and waits for two more.
    assert mine["waiting"] == "waiting: 2 of 4 rewarded, 2 of 4 records", mine

    rnd = [json.loads(line) for line in (gw.data_dir / "learner" / "rounds.jsonl").read_text().splitlines()][-1]
    candidate = rnd["candidate"]
    assert candidate["kind"] == "harness" and candidate["lineage"]["recipe"].endswith("HarnessEvolve")
    (mutation,) = candidate["mutations"]
    assert (mutation["op"], mutation["path"]) == ("create", SHOTS_FILE)
    assert mutation["reason"] == "2 rewarded replies as few-shot examples"
    shots = [json.loads(line) for line in mutation["content"].splitlines()]
    assert sorted((s["user"], s["assistant"]) for s in shots) == sorted(asked[:2])  # the rewarded two, as served
    gate = rnd["gate"]
    assert gate["backend"] == "engine" and gate["decision"] in ("select", "reject"), gate

    releases = httpx.get(f"{gw.url}/reef/scenarios/adds/releases", timeout=30).json()["releases"]
    if gate["decision"] == "select":  # policy auto: the examples serve, on the same weights
        assert rnd["release"] == releases[-1]["release_id"] and releases[-1]["harness_id"] == rnd["candidate_id"]
        assert releases[-1]["content_id"] == releases[0]["content_id"]
    else:
        assert rnd["release"] is None and len(releases) == 1


def test_a_tool_call_shot_is_sent_as_the_engine_takes_it(vllm_url: str) -> None:
    # A rewarded call's shot is an assistant turn with tool_calls and no tool result after it:
    # vLLM's OpenAI server takes it, and the chat template writes it as the model writes a call.
    shot = {"user": "Weather in Oslo?", "assistant": "",
            "tool_calls": [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]}
    harness = Harness("", {SHOTS_FILE: json.dumps(shot) + "\n"})
    messages = inject([{"role": "user", "content": "Weather in Lima?"}], harness, "system_prepend")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    body = {"model": MODEL_NAME, "messages": messages, "tools": tools, "max_tokens": 4, "temperature": 0}
    got = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=60)
    assert got.status_code == 200, got.text
    tokenized = httpx.post(f"{vllm_url}/tokenize", json={k: body[k] for k in ("model", "messages", "tools")},
                           timeout=60)
    assert tokenized.status_code == 200, tokenized.text
    text = httpx.post(f"{vllm_url}/detokenize", json={"model": MODEL_NAME, "tokens": tokenized.json()["tokens"]},
                      timeout=60).json()["prompt"]
    written = re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.DOTALL)
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in [" ".join(w.split()) for w in written], text
