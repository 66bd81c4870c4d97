"""The next-turn recipe with reports off: simulated demo users who never report, only react (a doubt
after a wrong reply, a thank-you after a right one), through the real gateway and engine; the
recipe reads those reactions as rewards and hints and trains a candidate that moves toward the
hinted targets and away from the rejected replies."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import polars as pl
import pytest
import torch
from transformers import AutoModelForCausalLM

from recipes.next_turn.signals import next_turn_signals, read_next_turn
from reef.experience import load
from reef.experience.load import SESSION_COL
from reef.recipe import Snapshot, load_recipe
from reef.scenario import NextTurnRule, NextTurnSpec, Score, get_scenario
from reef.traffic.simulate import FOLLOW_UP, THANKS, simulate
from tests.helpers.gateway import Gateway
from tests.helpers.tiny import task as demo

pytestmark = pytest.mark.start_early(12)


def test_demo_rules_read_the_users_reactions() -> None:
    spec = get_scenario(demo.SCENARIO).next_turn
    assert spec is not None
    assert read_next_turn(spec, "user", FOLLOW_UP)[0] == 0.0
    assert read_next_turn(spec, "user", THANKS)[0] == 1.0
    assert read_next_turn(spec, "user", "What is 2 + 2?") == (None, None)
    assert read_next_turn(spec, "tool", FOLLOW_UP) == (None, None), "a user rule does not read tool results"


def _turn(session: str, k: int, messages: list[tuple[str, str]], reply: str) -> dict:
    return {SESSION_COL: session, "record_id": f"{session}-{k}", "created_at": f"2026-01-01T00:00:0{k}",
            "messages": [{"role": r, "content": c} for r, c in messages], "prompt_token_ids": [1, 2, k],
            "choices": [{"token_ids": [7, k], "logprobs": [-0.1, -0.2], "content": reply}]}


def test_signals_pair_each_reply_with_what_came_next() -> None:
    q = [("system", "s"), ("user", "What is 2 + 2?")]
    rows = [
        _turn("a", 0, q, "Answer: 5"),
        _turn("a", 1, [*q, ("assistant", "Answer: 5"), ("user", FOLLOW_UP)], "Answer: 4"),
        _turn("a", 2, [*q, ("assistant", "Answer: 5"), ("user", FOLLOW_UP), ("assistant", "Answer: 4"),
                       ("user", THANKS)], "You are welcome!"),
        _turn("b", 0, q, "calling"),
        _turn("b", 1, [*q, ("assistant", "calling"), ("tool", "Error: no such file")], "sorry"),
        _turn("c", 0, q, "Answer: 4"),
        _turn("c", 1, [("user", "an edited history")], "x"),  # does not continue turn 0: no pair
        _turn("d", 0, q, "Answer: 4"),
        _turn("d", 1, [*q, ("assistant", "Answer: 4"), ("user", "Hm, and 3 + 3?")], "Answer: 6"),
    ]
    spec = NextTurnSpec(rules=[*get_scenario(demo.SCENARIO).next_turn.rules,
                               NextTurnRule(pattern="error", role="tool", reward=0.0)])
    votes = []

    def judge(tasks: list, replies: list) -> list[Score]:  # a stand-in judge: grades what no rule read
        votes.extend(replies)
        return [Score(0.75) for _ in replies]

    out = next_turn_signals(pl.DataFrame(rows), spec, judge).sort("record_id")
    got = {r["record_id"]: (r["reward"], r["source"], r["hinted_reward"]) for r in out.iter_rows(named=True)}
    assert got == {"a-0": (0.0, "rule 0", 1.0), "a-1": (1.0, "rule 1", None), "b-0": (0.0, "rule 2", None),
                   "d-0": (0.75, "judge", None)}
    assert votes == ["Answer: 4\n\n(The next turn, from the user: Hm, and 3 + 3?)"]
    a0 = out.row(0, named=True)
    assert (a0["completion_ids"], a0["hinted_prompt_ids"], a0["hinted_completion_ids"]) == ([7, 0], [1, 2, 1], [7, 1])


def _wait_flushed(gw: Gateway, records: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = httpx.get(f"{gw.url}/reef/status").json()["scenarios"].get(demo.SCENARIO, {})
        if s.get("records", 0) >= records and not s.get("unflushed_records"):
            return
        time.sleep(0.2)
    raise AssertionError(f"not flushed: {s}")


def _mean_logprob(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> float:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(completion).unsqueeze(1)).mean())


@pytest.mark.vllm
def test_next_turn_learns_with_reports_off(gateway: Gateway, tiny: Path, tmp_path: Path) -> None:
    summary = simulate(gateway.url, demo.SCENARIO, requests=160, concurrency=8, follow_up_share=1.0, reactions=2,
                       report=False, progress=False)
    assert summary.errors == 0 and summary.reports == 0
    _wait_flushed(gateway, summary.requests)
    records = load(demo.SCENARIO, gateway.data_dir).collect()
    assert records["score"].is_null().all(), "no report reached the store"

    recipe = load_recipe("next_turn", {"scenario": demo.SCENARIO, "base_model": str(tiny), "max_steps": 12,
                                       "hint_samples": 2, "per_device_batch_size": 16})
    snap = Snapshot.create(demo.SCENARIO, gateway.data_dir, recipe.experience(), root=tmp_path / "snapshots",
                           ledger_root=tmp_path / "ledger")
    signals = recipe.signals(snap)
    read = signals.filter(pl.col("reward").is_not_null())
    # Honest signals: each reaction is the simulated user's own verdict, which the verifier reproduces.
    tasks = {t.messages[-1]["content"]: t for t in demo.train_tasks()}
    replies = load(demo.SCENARIO, gateway.data_dir).collect().select(
        "record_id", pl.col("choices").list.first().struct.field("content").alias("reply"))
    truth = read.join(replies, on="record_id").with_columns(
        right=pl.struct("messages", "reply").map_elements(
            lambda r: demo.score(tasks[r["messages"][1]["content"]], r["reply"]), return_dtype=pl.Float64))
    assert truth.height == read.height > 40
    assert (truth["right"] == truth["reward"]).all()
    assert 0 < read["reward"].sum() < read.height, "both accepted and rejected replies"

    candidate = recipe.run(snap, out_root=tmp_path / "candidates", progress=False)
    m = candidate.metrics
    assert m["rl_samples"] > 0 and m["accepted"] > 0 and m["rejected"] > 0, m
    # Re-prompted with the doubt the tiny model is right about twice as often as at its first try (its
    # corpus holds second tries), so hindsight gives targets: 39-48 of them in 4 runs.
    assert m["distil_samples"] == m["distil_recorded_targets"] + m["distil_fresh_targets"] > 0, m
    assert candidate.training_log and "distil_nll" in candidate.training_log[0]

    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    trained = AutoModelForCausalLM.from_pretrained(candidate.path, dtype=torch.float32).eval()

    def delta(rows: pl.DataFrame, completion: str = "completion_ids") -> float:
        pairs = [(list(p), list(c)) for p, c in rows.select("prompt_ids", completion).iter_rows()]
        return sum(_mean_logprob(trained, p, c) - _mean_logprob(base, p, c) for p, c in pairs) / len(pairs)

    # Away from the replies the users doubted, not away from the ones they thanked for. 19-30 of ~100
    # replies are thanked for (the traffic is sampled afresh each run); over 4 runs the thanked ones
    # gained -0.01 to +0.16 nats/token after 12 steps and the doubted ones lost 0.37-0.52, a gap of
    # 0.51-0.57 (the hinted targets, right answers on the same prompts, pull the other way).
    accepted, rejected = read.filter(pl.col("reward") == 1.0), read.filter(pl.col("reward") == 0.0)
    assert delta(accepted) > -0.1
    assert delta(rejected) < min(-0.2, delta(accepted) - 0.3)
    targets = rejected.filter(pl.col("hinted_reward") == 1.0)
    if targets.height:  # a retry the user then thanked for: its reply, distilled into the un-hinted prompt
        assert delta(targets, "hinted_completion_ids") > 0.0
