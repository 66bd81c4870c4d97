"""Sessions as trajectories: the masked sequence built from recorded ids (unit), and a real 3-turn
tool session through the gateway, reported as a session and trained on with the masked loss."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import polars as pl

from reef.experience.load import SESSION_COL
from reef.recipe import Snapshot, load_recipe
from reef.recipe.tokens import IGNORE, CutStats, trajectory_examples
from reef.recipe.trajectory import trajectories
from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway, wait_flushed
from tests.helpers.tools import BASH, READ

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _turn(session: str, k: int, prompt: list[int], *completions: list[int]) -> dict:
    return {SESSION_COL: session, "record_id": f"rec_{session}_{k}", "created_at": T0 + timedelta(seconds=k),
            "prompt_token_ids": prompt, "choices": [{"token_ids": c} for c in completions],
            "score": 1.0, "weight": 1.0, "group": "scenario"}


def test_mask_covers_exactly_the_models_tokens() -> None:
    # Turn 2's prompt = turn 1's prompt + its completion (end token re-rendered as 9) + a tool result;
    # turn 3's prompt continues turn 2 the same way. 1xx: the model's tokens; 5x: tool/user/template.
    p1, c1 = [1, 2, 3], [101, 102, 9]
    p2 = [*p1, 101, 102, 9, 50, 51, 52]
    c2 = [103, 9]
    p3 = [*p2, 103, 9, 60, 61]
    c3 = [104, 105, 9]
    frame = pl.DataFrame([_turn("a", 3, p3, c3), _turn("a", 1, p1, c1), _turn("a", 2, p2, [7, 7, 9], c2)])
    (traj,) = trajectories(frame).iter_rows(named=True)
    assert traj["record_ids"] == ["rec_a_1", "rec_a_2", "rec_a_3"] and traj["turns"] == 3
    assert traj["input_ids"] == [*p3, *c3]
    # The choice the session went on with (turn 2 sampled two), not the first one.
    expected = [IGNORE] * 3 + c1 + [IGNORE] * 3 + c2 + [IGNORE] * 2 + c3
    assert traj["labels"] == expected
    trained = [t for t, lab in zip(traj["input_ids"], traj["labels"], strict=True) if lab != IGNORE]
    assert trained == [*c1, *c2, *c3]


def test_a_prompt_that_breaks_off_starts_a_new_trajectory() -> None:
    # The client edited the history: turn 2 does not continue turn 1, so its completion is trained
    # in the context it was served in, as a trajectory of its own.
    frame = pl.DataFrame([_turn("b", 1, [1, 2], [101, 9]), _turn("b", 2, [1, 5, 101, 9, 50], [102, 9]),
                          _turn("c", 1, [3], [103, 9])])
    rows = trajectories(frame).sort("session_id").to_dicts()
    assert [(r["session_id"], r["record_ids"]) for r in rows] == [
        ("b", ["rec_b_1"]), ("b", ["rec_b_2"]), ("c", ["rec_c_1"])]
    assert rows[1]["input_ids"] == [1, 5, 101, 9, 50, 102, 9]
    assert rows[1]["labels"] == [IGNORE] * 5 + [102, 9]
    stats = CutStats()
    (cut,) = trajectory_examples(pl.DataFrame(rows[1:2]), max_length=4, stats=stats)
    assert cut["input_ids"] == [9, 50, 102, 9] and cut["labels"] == [IGNORE, IGNORE, 102, 9], "cut from the left"
    assert stats.prompts_cut == 1


def test_three_turn_tool_session_reported_and_trained(gateway: Gateway, tiny: Path, tmp_path: Path) -> None:
    client = gateway.client(**{"x-reef-scenario": "agent-traj"})
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."},
                            {"role": "user", "content": "List the files."}]
    record_ids = []
    for turn in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=messages, tools=[READ, BASH], max_tokens=48, temperature=0)
        record_ids.append(raw.headers["x-reef-agent-record-id"])
        message = raw.parse().choices[0].message
        if turn == 0:
            assert message.tool_calls, message
            messages += [{"role": "assistant", "content": None,
                          "tool_calls": [c.model_dump() for c in message.tool_calls]},
                         {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "notes.txt"}]
        else:
            messages += [{"role": "assistant", "content": message.content or ""},
                         {"role": "user", "content": "Thanks!"}]

    records = [httpx.get(f"{gateway.url}/reef/records/{r}").json() for r in record_ids]
    (session,) = {r["gen_ai.conversation.id"] for r in records}
    report = httpx.post(f"{gateway.url}/reef/report", headers={"x-reef-scenario": "agent-traj"},
                        json={"session_id": session, "score": 1.0, "report_id": "rep_session_1"})
    assert report.status_code == 200, report.text
    assert report.json()["agent_record_ids"] == record_ids
    again = httpx.post(f"{gateway.url}/reef/report", headers={"x-reef-scenario": "agent-traj"},
                       json={"session_id": session, "score": 1.0, "report_id": "rep_session_1"})
    assert again.json()["duplicate"] is True
    unknown = httpx.post(f"{gateway.url}/reef/report", headers={"x-reef-scenario": "agent-traj"},
                         json={"session_id": "ses_nope", "score": 1.0})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "session_id"
    wait_flushed(gateway)

    recipe = load_recipe("rft", {"scenario": "agent-traj", "trajectories": True, "max_steps": 3,
                                 "base_model": str(tiny), "group_by": "scenario", "learning_rate": 1e-4})
    snap = Snapshot.create("agent-traj", gateway.data_dir, recipe.experience(), root=tmp_path / "snaps",
                           ledger_root=tmp_path / "ledger")
    (traj,) = snap.trajectories().iter_rows(named=True)
    assert traj["record_ids"] == record_ids and traj["score"] == 1.0 and traj["group"] == "scenario"
    # Against the recorded ids: the sequence is the last turn's served prompt and completion, and the
    # labels are exactly the three completions the engine sampled, at the places they were served.
    last = records[-1]
    assert traj["input_ids"] == last["prompt_token_ids"] + last["choices"][0]["token_ids"]
    for rec in records:
        start, ids = len(rec["prompt_token_ids"]), rec["choices"][0]["token_ids"]
        assert traj["input_ids"][start:start + len(ids)] == ids
        assert traj["labels"][start:start + len(ids)] == ids
    assert sum(lab != IGNORE for lab in traj["labels"]) == sum(len(r["choices"][0]["token_ids"]) for r in records)
    tool_result_at = records[1]["prompt_token_ids"]
    assert all(lab == IGNORE for lab in traj["labels"][len(records[0]["prompt_token_ids"]) + len(
        records[0]["choices"][0]["token_ids"]):len(tool_result_at)]), "tool result tokens are masked"

    candidate = recipe.run(snap, out_dir=tmp_path / "cand", progress=False)
    assert candidate.metrics["train_samples"] == 1
    assert json.loads((tmp_path / "cand" / "candidate.json").read_text())["lineage"]["snapshot_id"] == snap.id
