"""A report's `correction` (the reply the application wanted instead) is a hindsight target: stored
with the report, folded into the experience, kept by rft's snapshot even below `min_score`, counted
as signal by the learner, and trained on as the correction's tokens closed by the end-of-turn token.
This is what lets a real model that almost never earns a binary reward start learning from live
traffic (`make demo`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import openai
import polars as pl
import pytest
from transformers import AutoTokenizer

from reef.experience import load
from reef.experience.schema import correction_message
from reef.learn.pending import signal
from reef.recipe import Snapshot, load_recipe
from reef.recipe.snapshot import select
from reef.recipe.tokens import correction_ids, with_corrections
from reef.scenario import EvalSpec, Scenario, reference_turn, same_calls
from reef.traffic.offline import record_offline_traffic
from tests.helpers import MODEL_NAME, wait_for
from tests.helpers.gateway import Gateway

os.environ.setdefault("OMP_NUM_THREADS", "1")
S = "labels"
HEADERS = {"x-reef-scenario": S}


def _chat(gw: Gateway, text: str) -> str:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", default_headers=HEADERS)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=1.0)
    return raw.headers["x-reef-agent-record-id"]


@pytest.mark.model_free
@pytest.mark.any_model
def test_a_correction_is_stored_selected_and_becomes_the_target(gateway: Gateway, serving_model: Path) -> None:
    fixed, plain, good = (_chat(gateway, f"Review: {t}. Positive or negative?") for t in ("Broke", "Meh", "Great"))
    report = {"agent_record_id": fixed, "score": 0.0, "feedback": "wrong label", "correction": "Label: negative",
              "report_id": "rep-fix"}
    first = httpx.post(f"{gateway.url}/reef/report", json=report, headers=HEADERS)
    assert first.status_code == 200, first.text
    again = httpx.post(f"{gateway.url}/reef/report", json=report, headers=HEADERS)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    other = httpx.post(f"{gateway.url}/reef/report", json={**report, "correction": "Label: positive"}, headers=HEADERS)
    assert other.status_code == 409 and other.json()["error"]["param"] == "report_id"
    empty = httpx.post(f"{gateway.url}/reef/report", json={**report, "report_id": "rep-empty", "correction": ""},
                       headers=HEADERS)
    assert empty.status_code == 422 and empty.json()["error"]["param"] == "correction"
    for record_id, score in ((plain, 0.0), (good, 1.0)):
        assert httpx.post(f"{gateway.url}/reef/report", json={"agent_record_id": record_id, "score": score},
                          headers=HEADERS).status_code == 200

    wait_for(lambda: httpx.get(f"{gateway.url}/reef/status").json()["scenarios"][S]["unflushed_reports"] == 0)
    frame = load(S, gateway.data_dir).collect()
    corrections = dict(zip(frame["record_id"], frame["correction"], strict=True))
    assert corrections == {fixed: "Label: negative", plain: None, good: None}

    rft = load_recipe("rft", {"scenario": S, "min_score": 1.0})
    chosen, counts = select(frame, rft.experience(), set())
    assert set(chosen["record_id"]) == {fixed, good} and counts["below_min_score"] == 1
    without = load_recipe("rft", {"scenario": S, "min_score": 1.0, "corrections": False})
    assert select(frame, without.experience(), set())[0]["record_id"].to_list() == [good]
    assert signal(frame, rft, set()) == {"eligible": 2, "rewarded": 2, "unrewarded": 1}

    snap = Snapshot.create(S, gateway.data_dir, rft.experience(), root=gateway.data_dir / "snaps",
                           ledger_root=gateway.data_dir / "ledger")
    tokenizer = AutoTokenizer.from_pretrained(serving_model)
    samples, n = with_corrections(snap.samples(), tokenizer, 1.0)
    assert n == 1 and samples.height == 2
    target = samples.filter(samples["record_id"] == fixed).row(0, named=True)
    assert target["completion_ids"] == tokenizer("Label: negative", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id]
    served = frame.filter(frame["record_id"] == fixed).row(0, named=True)
    assert target["prompt_ids"] == served["prompt_token_ids"], "the prompt stays the one served"
    kept = samples.filter(samples["record_id"] == good).row(0, named=True)
    rewarded = frame.filter(frame["record_id"] == good).row(0, named=True)
    assert kept["completion_ids"] == rewarded["choices"][0]["token_ids"], "a rewarded reply is trained as served"


def test_rft_trains_on_corrections_when_nothing_is_rewarded(tiny: Path, tmp_path: Path) -> None:
    """A scenario whose reward the model never earns: offline traffic, every reply scored 0 and
    corrected with the task's `reference`; rft still makes a candidate, from the corrections alone."""
    rows = [{"task_id": f"t{i}", "messages": [{"role": "user", "content": f"Say the code {i}."}],
             "reference": f"Code: {i}"} for i in range(6)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "never.py").write_text("def reward(task, reply):\n    return 0.0\n")
    scenario = Scenario(name="codes", reward="never:reward", tasks=Path("tasks.jsonl"),
                        eval=EvalSpec(path=Path("tasks.jsonl"), max_new_tokens=8), base_dir=tmp_path)
    data = tmp_path / "data"
    record_offline_traffic(tiny, data, scenario, prompts=6, samples=1, seed=0)
    frame = load("codes", data).collect()
    assert frame["score"].to_list() == [0.0] * 6 and frame["correction"].null_count() == 0

    rft = load_recipe("rft", {"scenario": "codes", "base_model": str(tiny), "max_steps": 2,
                              "per_device_batch_size": 4, "min_score": 1.0})
    snap = Snapshot.create("codes", data, rft.experience(), root=tmp_path / "snaps", ledger_root=tmp_path / "l")
    assert len(snap.record_ids) == 6
    cand = rft.run(snap, out_root=tmp_path / "cands", progress=False)
    assert cand.metrics["corrections"] == 6 and cand.metrics["train_samples"] == 6
    assert len(cand.training_log) >= 2 and all(step.get("loss", 1.0) > 0 for step in cand.training_log[:-1])


@pytest.mark.model_free
@pytest.mark.any_model
def test_a_tool_call_is_corrected_with_an_assistant_message(gateway: Gateway, serving_model: Path) -> None:
    """A correction given as an assistant message (the tool call that was wanted) is stored as its
    JSON and trained on as the chat template renders that turn: the `<tool_call>` markup the
    engine's hermes parser reads, closed by the end-of-turn token."""
    record = _chat(gateway, 'How much is "lamp"?')
    wanted = {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "price", "arguments": '{"item": "lamp"}'}}]}
    bad = httpx.post(f"{gateway.url}/reef/report", headers=HEADERS, json={
        "agent_record_id": record, "score": 0.0, "correction": {"role": "assistant", "content": None}})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "correction", bad.text
    bad = httpx.post(f"{gateway.url}/reef/report", headers=HEADERS, json={
        "agent_record_id": record, "score": 0.0, "correction": {"role": "user", "content": "hi"}})
    assert bad.status_code == 422, bad.text
    ok = httpx.post(f"{gateway.url}/reef/report", headers=HEADERS,
                    json={"agent_record_id": record, "score": 0.0, "correction": wanted})
    assert ok.status_code == 200, ok.text

    wait_for(lambda: httpx.get(f"{gateway.url}/reef/status").json()["scenarios"][S]["unflushed_reports"] == 0)
    frame = load(S, gateway.data_dir).collect().filter(pl.col("record_id") == record)
    stored = frame["correction"].item()
    assert correction_message(stored) == wanted
    tokenizer = AutoTokenizer.from_pretrained(serving_model)
    samples, n = with_corrections(frame.select(
        "record_id", "score", "correction", prompt_ids="prompt_token_ids",
        completion_ids=pl.lit([0], pl.List(pl.Int64))), tokenizer, 1.0)
    assert n == 1
    text = tokenizer.decode(samples["completion_ids"].item())
    end = "</tool_call>" + tokenizer.eos_token
    assert text.startswith("<tool_call>") and text.endswith(end), text
    assert json.loads(text[len("<tool_call>"):-len(end)]) == {"name": "price", "arguments": {"item": "lamp"}}
    assert correction_ids(tokenizer, "Answer: 4") == tokenizer("Answer: 4", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id], "a text correction is tokenized as before"


@pytest.mark.model_free
def test_an_agent_turn_is_checked_against_the_reference_turns() -> None:
    call = {"type": "function", "function": {"name": "price", "arguments": '{"item": "lamp"}'}}
    task = {"reference": [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "assistant", "content": "Answer: 42", "note": "not part of a turn"}]}
    assert reference_turn(task, 0) == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert reference_turn(task, 1) == {"role": "assistant", "content": "Answer: 42"}
    assert reference_turn(task, 2) is None and reference_turn(task, -1) is None
    assert reference_turn({"reference": "Answer: 42"}, 0) is None and reference_turn({}, 0) is None
    same = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "price", "arguments": '{ "item":"lamp" }'}}]}
    other = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "price", "arguments": '{"item": "mug"}'}}]}
    prose = {"role": "assistant", "content": "It costs about 10."}
    assert same_calls(same, reference_turn(task, 0))
    assert not same_calls(other, reference_turn(task, 0)) and not same_calls(prose, reference_turn(task, 0))
