"""`POST /reef/records` imports demonstrations as records a recipe trains on: the engine's own token
ids for the prompt and the reply, the reward reported with them, all durable before the answer;
bad input is a 4xx naming what is wrong and writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from reef.experience import load
from reef.recipe.snapshot import ExperienceSpec, select
from tests.helpers import MODEL_NAME, wait_for
from tests.helpers.gateway import Gateway

pytestmark = [pytest.mark.model_free, pytest.mark.any_model]

TOKEN = "demo-admin"
ADMIN = {"authorization": f"Bearer {TOKEN}", "x-reef-scenario": "labels"}
DEMOS = [
    {"messages": [{"role": "user", "content": "Review: 'Broke after a day.' Label it."}],
     "completion": "Label: negative"},
    {"messages": [{"role": "system", "content": "Answer with a label."},
                  {"role": "user", "content": "Review: 'Works great.' Label it."}],
     "completion": "Label: positive", "score": 0.5},
]


def test_demonstrations_become_trainable_records(make_gateway, vllm_url: str) -> None:  # noqa: ANN001
    gw: Gateway = make_gateway(env={"REEF_ADMIN_TOKEN": TOKEN, "REEF_STORE__FLUSH_INTERVAL_S": "0.2"}).start()
    resp = httpx.post(f"{gw.url}/reef/records", json={"demonstrations": DEMOS}, headers=ADMIN, timeout=60)
    assert resp.status_code == 201, resp.text
    receipt = resp.json()
    assert len(receipt["agent_record_ids"]) == 2 and len(receipt["report_ids"]) == 2

    for record_id, demo in zip(receipt["agent_record_ids"], DEMOS, strict=True):
        record = httpx.get(f"{gw.url}/reef/records/{record_id}").json()
        engine = httpx.post(f"{vllm_url}/tokenize", json={
            "model": MODEL_NAME, "messages": demo["messages"], "add_generation_prompt": True}).json()
        assert record["prompt_token_ids"] == engine["tokens"]
        ids = record["choices"][0]["token_ids"]
        text = httpx.post(f"{vllm_url}/detokenize", json={"model": MODEL_NAME, "tokens": ids}).json()["prompt"]
        assert text.startswith(demo["completion"]), text
        assert record["choices"][0]["content"] == demo["completion"]
        assert {"name": "reef.source", "value": "demonstration"} in record["tags"]
        assert record["scenario"] == "labels"

    wait_for(lambda: httpx.get(f"{gw.url}/reef/status").json()["scenarios"]["labels"]["unflushed_records"] == 0)
    frame = load("labels", gw.data_dir).lazy().collect()
    chosen, _ = select(frame, ExperienceSpec(scenario="labels", min_score=1.0), set())
    assert chosen["record_id"].to_list() == [receipt["agent_record_ids"][0]], "only the demonstration scored 1.0"


def test_bad_imports_are_refused_and_write_nothing(make_gateway, tmp_path: Path) -> None:  # noqa: ANN001
    gw: Gateway = make_gateway(env={"REEF_ADMIN_TOKEN": TOKEN}).start()
    url = f"{gw.url}/reef/records"
    no_token = httpx.post(url, json={"demonstrations": DEMOS}, headers={"x-reef-scenario": "labels"})
    assert no_token.status_code == 401 and no_token.json()["error"]["message"]
    for body in ({"demonstrations": []}, {"demonstrations": [{"messages": [], "completion": "x"}]},
                 {"demonstrations": [{**DEMOS[0], "completion": ""}]}, {"demonstrations": [{**DEMOS[0], "x": 1}]},
                 {"demonstrations": [{**DEMOS[0], "score": "1"}]},
                 # JSON that parses but cannot be sent on (schemathesis found these as 500s).
                 {"demonstrations": [{**DEMOS[0], "completion": "\ud800"}]},
                 {"demonstrations": [{"messages": [{"role": "user", "content": "hi", "x": -2**80}],
                                      "completion": "x"}]}):
        got = httpx.post(url, content=json.dumps(body), headers={**ADMIN, "content-type": "application/json"})
        assert 400 <= got.status_code < 500 and got.json()["error"]["message"], (body, got.text)
    # One bad demonstration among good ones refuses the whole import.
    bad_role = {"messages": [{"role": "nobody", "content": "hi"}], "completion": "x"}
    got = httpx.post(url, json={"demonstrations": [DEMOS[0], bad_role]}, headers=ADMIN, timeout=60)
    assert 400 <= got.status_code < 500 and "demonstrations.1" in got.json()["error"]["message"], got.text
    status = httpx.get(f"{gw.url}/reef/status").json()["scenarios"]
    assert status.get("labels", {}).get("records", 0) == 0

    # The CLI: a JSONL file of demonstrations, and the same refusals as exit code 2.
    good, broken = tmp_path / "demos.jsonl", tmp_path / "broken.jsonl"
    good.write_text("".join(json.dumps(d) + "\n" for d in DEMOS))
    broken.write_text(json.dumps(DEMOS[0]) + "\n{not json\n")
    cli = [sys.executable, "-m", "reef.cli", "records", "import", "--scenario", "labels", "--url", gw.url]
    env = {**os.environ, "REEF_ADMIN_TOKEN": TOKEN}
    done = subprocess.run([*cli, str(good)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "imported 2 demonstrations" in done.stdout, done.stderr
    for path, says in ((broken, "broken.jsonl:2: not JSON"), (tmp_path / "absent.jsonl", "no such file")):
        done = subprocess.run([*cli, str(path)], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    done = subprocess.run([*cli, str(good)], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "REEF_ADMIN_TOKEN"})
    assert done.returncode == 2 and "admin token" in done.stderr, done.stderr
    wait_for(lambda: httpx.get(f"{gw.url}/reef/status").json()["scenarios"]["labels"]["records"] == 2)
