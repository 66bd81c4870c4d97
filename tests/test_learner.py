"""The learner inside `reef serve`: a round runs in its own process while serving continues, a
record is never trained on twice, and under policy `auto` a candidate the gate selects is
released and hot-swapped at once."""

from __future__ import annotations

import time

import httpx
import yaml

from reef.demo.task import SCENARIO
from reef.recipe import ledger
from reef.traffic.simulate import simulate
from tests.conftest import MODEL_NAME, TINY, Gateway

MIN_RECORDS = 24  # rewarded chats a round waits for; 320 chats at ~16% success give ~40


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


def test_serve_runs_learning_rounds(make_gateway) -> None:
    # Traffic first, learner after (a restart over the same data): a round that started on the first
    # few rewarded chats would learn too little for the gate to tell (LoRA on ~10 samples, measured).
    recorder: Gateway = make_gateway("learner", env={"REEF_SERVED_MODEL_NAME": MODEL_NAME,
                                                     "REEF_STORE__FLUSH_INTERVAL_S": "0.2"})
    recorder.start()
    summary = simulate(recorder.url, SCENARIO, requests=320, concurrency=8, progress=False)
    recorder.stop()
    assert summary.errors == 0 and sum(summary.scores) >= MIN_RECORDS, "need rewarded traffic to learn from"

    gw: Gateway = make_gateway("learner", extra_args=["--model", str(TINY)], env={
        "REEF_LEARNER__ENABLED": "true", "REEF_LEARNER__INTERVAL_S": "1", "REEF_STORE__FLUSH_INTERVAL_S": "0.2",
        "REEF_SERVED_MODEL_NAME": MODEL_NAME, "REEF_RELEASE__POLICY": "auto", "REEF_RELEASE__GATE_SAMPLES": "2",
    })
    # The scenario's recipe, declared in the server's serve.yaml (its working folder).
    (gw.workdir / "serve.yaml").write_text(yaml.safe_dump({
        "recipes": {"lora-rft": {"recipe": "recipes.rft.recipe:RFT", "min_records": MIN_RECORDS, "params": {
            "min_score": 1.0, "max_steps": 30,
            # LoRA: a full-weight release would change the weights of the session's shared vLLM.
            "kind": "lora", "learning_rate": 5e-3}}},
        "scenarios": {SCENARIO: {"recipe": "lora-rft"}},
    }))
    gw.start()
    assert _learner(gw)["enabled"] is True

    running = _wait(gw, lambda s: s["running"] or s["rounds"] >= 1)
    if running["running"]:  # serving goes on while a round trains
        reply = gw.client().chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4)
        assert reply.choices[0].message.content is not None
    done = _wait(gw, lambda s: s["rounds"] >= 1 and not s["running"])
    assert done["last_error"] is None, done
    assert done["last_round"]["status"] == "trained" and done["last_round"]["candidate"]
    # The gate compared it with r0 on the eval suite and selected it; policy auto released it.
    assert done["last_round"]["gate"]["decision"] == "select", done["last_round"]["gate"]
    release = done["last_round"]["release"]
    assert release == f"{SCENARIO}@r1"
    serving = httpx.get(f"{gw.url}/reef/status").json()["scenarios"][SCENARIO]["serving"]
    assert serving["release_id"] == release and serving["kind"] == "lora" and serving["error"] is None
    assert (gw.workdir / "data" / "candidates" / SCENARIO / "candidate.json").is_file()
    consumed = ledger.consumed(gw.workdir / "data" / "ledger", SCENARIO)["record_id"].to_list()
    assert consumed and len(consumed) == len(set(consumed))

    # Nothing new arrives: the learner sees nothing pending and trains no second round on the same ids.
    time.sleep(3)
    later = _learner(gw)
    assert later["rounds"] == 1 and later["pending"]["records"] == 0
