"""The learner inside `reef serve`, with scenarios a user brings, end to end: two scenarios declared
only in a temp serve.yaml (eval files and reward functions in a module next to it, outside reef/;
one recipe a user's own class), traffic through the gateway, one learner in one server running a
round for each in its own process while serving continues, the gate scoring with the user's
rewards, an automatic release (hot-swapped at once) under `auto` and a dashboard approval under
`approval`, no record trained on twice, and records, ledgers and chains kept apart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import streamlit as st
import yaml

from reef.client import ReefClient
from reef.experience import load
from reef.recipe import ledger
from reef.registry.candidates import CandidateRegistry
from reef.registry.chain import ReleaseChain
from reef.scenario import get_scenario
from reef.traffic.simulate import simulate
from tests.helpers import MODEL_NAME, TINY
from tests.helpers.dashboard import app, texts
from tests.helpers.gateway import Gateway
from tests.helpers.tiny import task as demo

pytestmark = pytest.mark.start_early(2)

TOKEN = "byo-token"
MIN_RECORDS = 24  # rewarded chats a round waits for; 320 chats at ~16% success give ~40
EVAL_TASKS = 40

REWARDS = '''\
"""A user's rewards, outside Reef: one per task, one TRL-style batch; each call is logged."""
import re
from pathlib import Path

CALLS = Path(__file__).with_name("reward-calls.jsonl")


def _log(name, n):
    with CALLS.open("a") as f:
        f.write('{"reward": "%s", "replies": %d}\\n' % (name, n))


def _right(answer, reply):
    m = re.search(r"Answer:\\s*(-?\\d+)", reply)
    return 1.0 if m and int(m.group(1)) == answer else 0.0


def exact(task, reply):
    _log("exact", 1)
    return _right(task["answer"], reply), "checked"


def batch(prompts, completions, answer, **columns):
    _log("batch", len(completions))
    return [_right(a, c[0]["content"]) for a, c in zip(answer, completions)]
'''

RECIPES = '''\
"""A user's own recipe class, next to serve.yaml: rft with its own defaults."""
from dataclasses import dataclass

from recipes.rft.recipe import RFT, RFTConfig


@dataclass
class SteadyConfig(RFTConfig):
    kind: str = "lora"
    max_steps: int = 40
    learning_rate: float = 4e-3


class SteadyRFT(RFT):
    name = "steady-rft"
    config_class = SteadyConfig
'''


def _learner(gw: Gateway) -> dict:
    return httpx.get(f"{gw.url}/reef/status").json()["learner"]


def _wait(gw: Gateway, until, timeout_s: float = 240.0) -> dict:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _learner(gw)
        if until(state):
            return state
        time.sleep(0.5)
    raise AssertionError(f"learner never got there: {state}")


def _serve_yaml(folder: Path, learner: bool) -> None:
    rows = [json.dumps(demo.as_row(t)) for t in demo.eval_tasks()[:EVAL_TASKS]]
    (folder / "evals").mkdir(parents=True, exist_ok=True)
    (folder / "evals" / "add.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "my_rewards.py").write_text(REWARDS)
    (folder / "my_recipes.py").write_text(RECIPES)
    (folder / "serve.yaml").write_text(yaml.safe_dump({
        "admin_token": TOKEN, "served_model_name": MODEL_NAME, "store": {"flush_interval_s": 0.2},
        "learner": {"enabled": learner, "interval_s": 1, "min_records": MIN_RECORDS},
        "recipes": {
            # LoRA: a full-weight release would change the weights of the session's shared vLLM.
            "fast-rft": {"recipe": "rft", "params": {"min_score": 1.0, "kind": "lora", "max_steps": 30,
                                                      "learning_rate": 5e-3}},
            "steady": {"recipe": "my_recipes:SteadyRFT", "params": {"min_score": 1.0}},
        },
        "scenarios": {
            "support": {"policy": "auto", "recipe": "fast-rft", "reward": "my_rewards:exact",
                        "eval": {"path": "evals/add.jsonl", "max_new_tokens": 16}},
            "triage": {"policy": "approval", "recipe": "steady", "reward": "my_rewards:batch",
                       "eval": {"path": "evals/add.jsonl", "max_new_tokens": 16}},
        },
    }, sort_keys=False))


def _greedy(gw: Gateway, scenario: str, n: int = 16) -> list[str]:
    client = gw.client(**{"x-reef-scenario": scenario})
    return [client.chat.completions.create(model=MODEL_NAME, messages=t.messages, max_tokens=12, temperature=0)
            .choices[0].message.content for t in demo.eval_tasks()[:n]]


@pytest.mark.vllm
def test_two_user_scenarios_learn_in_one_server(make_gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    # Traffic first, learner after (a restart over the same data): a round started on the first few
    # rewarded chats would learn too little for the gate to tell (LoRA on ~10 samples, measured).
    recorder: Gateway = make_gateway("byo", extra_args=["--model", str(TINY)])
    _serve_yaml(recorder.workdir, learner=False)
    recorder.start()
    before = _greedy(recorder, "support")
    for seed, scenario in enumerate(("support", "triage")):
        users = get_scenario("demo-add").model_copy(update={"name": scenario})  # the demo's users and their rewards
        # ~7 % of the base model's sampled replies are right: 480 chats give ~33 rewarded, MIN_RECORDS 24.
        summary = simulate(recorder.url, users, requests=480, concurrency=8, seed=seed, progress=False)
        assert summary.errors == 0 and sum(summary.scores) >= MIN_RECORDS, "need rewarded traffic to learn from"
    recorder.stop()

    # Settings serve.yaml leaves out come from the environment (REEF_*).
    gw: Gateway = make_gateway("byo", extra_args=["--model", str(TINY)], env={"REEF_RELEASE__GATE__SAMPLES": "2"})
    _serve_yaml(gw.workdir, learner=True)
    gw.start()
    learner = _learner(gw)
    assert learner["enabled"] is True
    per = learner["scenarios"]
    assert {name: s["recipe"] for name, s in per.items()} == {"support": "rft", "triage": "my_recipes:SteadyRFT"}
    running = _wait(gw, lambda s: s["running"] or any(x["rounds"] >= 1 for x in s["scenarios"].values()))
    if running["running"]:  # serving goes on while a round trains
        reply = gw.client().chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4)
        assert reply.choices[0].message.content is not None
    done = _wait(gw, lambda s: all(x["rounds"] >= 1 for x in s["scenarios"].values()) and not s["running"],
                 timeout_s=480)
    support, triage = done["scenarios"]["support"], done["scenarios"]["triage"]
    assert support["last_error"] is None and triage["last_error"] is None, done
    for one in (support, triage):
        assert one["last_round"]["status"] == "trained" and one["last_round"]["candidate"], one["last_round"]

    # support (auto): selected by the gate on the user's reward, released and served at once.
    assert support["last_round"]["gate"]["decision"] == "select", support["last_round"]["gate"]
    assert support["last_round"]["release"] == "support@r1"
    status = httpx.get(f"{gw.url}/reef/status").json()["scenarios"]
    serving = status["support"]["serving"]
    assert serving["release_id"] == "support@r1" and serving["kind"] == "lora" and serving["error"] is None
    assert status["triage"]["serving_release"] == "triage@r0", "one scenario's release never moves another"
    after = _greedy(gw, "support")
    assert after != before, "the released adapter changes what support's users are served"
    assert _greedy(gw, "triage") == before, "triage still serves its base model"

    # The gate called the user's rewards: both arms, every eval task, release.gate.samples replies each.
    calls = [json.loads(line) for line in (gw.workdir / "reward-calls.jsonl").read_text().splitlines()]
    assert sum(c["replies"] for c in calls if c["reward"] == "exact") >= 2 * EVAL_TASKS * 2
    assert sum(c["replies"] for c in calls if c["reward"] == "batch") >= 2 * EVAL_TASKS * 2

    # Records, ledgers and chains kept apart.
    data = gw.data_dir
    for name in ("support", "triage"):
        records = set(load(name, data).lazy().collect()["record_id"].to_list())
        ids = ledger.consumed(data / "ledger", name)["record_id"].to_list()
        consumed = set(ids)
        assert consumed and consumed <= records and len(ids) == len(consumed), name  # none trained on twice
        assert (data / "candidates" / name / "candidate.json").is_file()
    assert not (set(ledger.consumed(data / "ledger", "support")["record_id"].to_list())
                & set(ledger.consumed(data / "ledger", "triage")["record_id"].to_list()))
    triage_id = triage["last_round"]["candidate_id"]
    view = CandidateRegistry(data, "triage").get(triage_id)
    assert view.scenario == "triage" and view.lineage.recipe == "my_recipes:SteadyRFT"
    assert [r.release_id for r in ReleaseChain.for_data_dir(data, "triage").releases()] == ["triage@r0"]

    # triage (approval): the selected candidate waits, and is released from the dashboard.
    assert triage["last_round"]["gate"]["decision"] == "select", triage["last_round"]["gate"]
    assert triage["last_round"]["release"] is None and view.status == "selected"
    st.cache_data.clear()  # pages cache reads per data version; start from this data dir
    at = app(monkeypatch, data, gw.url, token=TOKEN)
    at.selectbox(key="scenario_picker").set_value("triage").run()
    at.switch_page("views/release.py").run()
    assert {m.label: m.value for m in at.metric}["Head"] == "triage@r0"
    at.button(key=f"approve_{triage_id}").click().run()
    assert any("as triage@r1" in s for s in texts(at, "success")), texts(at, "error")
    with ReefClient(gw.url) as client:
        assert client.releases("triage")["serving"]["release_id"] == "triage@r1"
        assert client.head("support") == "support@r1"
    assert _greedy(gw, "triage") != before

    # Nothing new arrived: the learner counts nothing pending and trained no second round on the same ids.
    later = _wait(gw, lambda s: s["pending"]["records"] == 0, timeout_s=30)
    assert {name: x["rounds"] for name, x in later["scenarios"].items()} == {"support": 1, "triage": 1}, later


@pytest.mark.vllm
def test_a_round_waits_for_rewarded_and_unrewarded_reports(make_gateway) -> None:  # noqa: ANN001
    # Below the thresholds no round starts and the status says why; the reports that reach them start one.
    gw: Gateway = make_gateway("signal", extra_args=["--model", str(TINY)])
    gw.workdir.mkdir(parents=True, exist_ok=True)
    (gw.workdir / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "store": {"flush_interval_s": 0.2},
        "learner": {"enabled": True, "interval_s": 0.5, "min_records": 4, "min_rewarded": 2, "min_unrewarded": 2},
        "recipes": {"rl": {"recipe": "online_rl", "params": {"kind": "lora", "max_steps": 1, "baseline": "batch"}}},
        "scenarios": {"support": {"policy": "approval", "recipe": "rl"}},
    }))
    gw.start()
    client = gw.client(**{"x-reef-scenario": "support"})
    ids = [client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=t.messages, max_tokens=8).headers["x-reef-agent-record-id"]
        for t in demo.eval_tasks()[:4]]

    def report(record_id: str, score: float) -> None:
        resp = httpx.post(f"{gw.url}/reef/report", json={"agent_record_id": record_id, "score": score},
                          headers={"x-reef-scenario": "support"})
        assert resp.status_code == 200, resp.text

    report(ids[0], 1.0)
    report(ids[1], 0.0)
    reason = "waiting: 1 of 2 rewarded, 1 of 2 unrewarded, 2 of 4 records"
    waiting = _wait(gw, lambda s: s["scenarios"]["support"]["waiting"] == reason, timeout_s=60)
    assert waiting["waiting"] == {"support": reason} and not waiting["running"]
    assert waiting["scenarios"]["support"]["round"] is None and waiting["scenarios"]["support"]["rounds"] == 0
    cli = subprocess.run([sys.executable, "-m", "reef.cli", "status", "--url", gw.url], capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and f"learner support (online_rl): {reason}; 0 rounds" in cli.stdout, cli.stdout

    report(ids[2], 1.0)
    report(ids[3], 0.0)
    started = _wait(gw, lambda s: (s["scenarios"]["support"]["round"] or {}).get("records") is not None,
                    timeout_s=120)
    mine = started["scenarios"]["support"]
    assert mine["waiting"] is None and started["waiting"] == {}, started
    assert mine["round"]["records"] == 4 and mine["round"]["recipe"] == "online_rl", mine["round"]
