"""Harness releases against the real engine: a harness release changes what the model is sent (the
stored prompt token ids) with no weight change, `GET /reef/harness` serves its files, and a
composite release (LoRA + harness) and its rollback under a few concurrent clients fail no request
and label every record with the harness it was served with.

Gate results are recorded through the candidate registry: gating harness candidates is the gate's
job (not tested here); what is tested is that only selected candidates are released.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from reef.client import ReefAPIError, ReefClient
from reef.core.hashing import sha256_file
from reef.experience.schema import RECORD_FEATURES
from reef.experience.shards import scan
from reef.registry.candidates import CandidateRegistry, GateResult, register_candidate
from reef.registry.harness import Harness, inject
from tests.helpers import MODEL_NAME, TINY, wait_for
from tests.helpers.gateway import Gateway
from tests.helpers.releases import Load

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = pytest.mark.vllm

TOKEN = "test-admin-token"
SYSTEM = "You are Reef's test agent. Answer with one number."
RULES = "- Never explain.\n- Never apologise."
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def harness_candidate(folder: Path, scenario: str, system: str = SYSTEM) -> Path:
    (folder / "skills" / "add").mkdir(parents=True)
    (folder / "system.md").write_text(system + "\n")
    (folder / "rules.md").write_text(RULES + "\n")
    (folder / "skills" / "add" / "SKILL.md").write_text("---\nname: add\ndescription: add numbers\n---\nAdd them.\n")
    (folder / "candidate.json").write_text(json.dumps({"kind": "harness", "scenario": scenario,
                                                       "lineage": {"recipe": "hand-written"}}))
    return folder


def lora_candidate(folder: Path, scenario: str) -> Path:
    """A randomly initialised LoRA on the tiny model: other weights in seconds, no training."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(TINY), LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM"))
    model.save_pretrained(folder)
    lineage = {"recipe": "random-init", "base_model": str(TINY),
               "base_model_sha256": sha256_file(TINY / "model.safetensors")}
    (folder / "candidate.json").write_text(json.dumps({"kind": "lora", "scenario": scenario, "lineage": lineage}))
    return folder


def select(data_dir: Path, scenario: str, candidate_id: str, head: str) -> None:
    CandidateRegistry(data_dir, scenario).record_gate(candidate_id, GateResult(
        decision="select", reason="recorded by the test", head_release_id=head))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("harness")
    (work / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "admin_token": TOKEN, "store": {"flush_interval_s": 0.2},
        "scenarios": {s: {"harness": {"inject": "system_prepend"}} for s in ("h-inject", "h-composite")},
    }))
    return work


@pytest.fixture(scope="module")
def gw(vllm_url: str, workdir: Path) -> Iterator[Gateway]:
    gateway = Gateway(workdir, vllm_url, ["--model", str(TINY)]).start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def api(gw: Gateway) -> ReefClient:
    return ReefClient(gw.url, admin_token=TOKEN)


def ask(gw: Gateway, scenario: str) -> tuple[dict, str]:
    raw = gw.client(**{"x-reef-scenario": scenario}).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=4)
    record = httpx.get(f"{gw.url}/reef/records/{raw.headers['x-reef-agent-record-id']}", timeout=30).json()
    return record, raw.headers["x-reef-release-id"]


def test_inject_modes() -> None:
    h = Harness("0" * 64, {"system.md": "S", "rules.md": "R"})
    own = [{"role": "system", "content": "mine"}, *QUESTION]
    assert inject(own, h, "system_prepend")[0] == {"role": "system", "content": "S\n\nR\n\nmine"}
    assert inject(own, h, "system_replace") == [{"role": "system", "content": "S\n\nR"}, *QUESTION]
    assert inject(QUESTION, h, "system_prepend") == [{"role": "system", "content": "S\n\nR"}, *QUESTION]
    assert inject(own, h, "off") == own
    parts = [{"role": "system", "content": [{"type": "text", "text": "mine"}]}]
    assert inject(parts, h, "system_prepend")[0]["content"][0] == {"type": "text", "text": "S\n\nR\n\n"}


def test_shards_from_before_the_harness_column_still_read(tmp_path: Path) -> None:
    schema = RECORD_FEATURES.arrow_schema
    old = pa.schema([f for f in schema if f.name != "harness_id"])
    pq.write_table(old.empty_table(), tmp_path / "part-00000001.parquet")
    frame = scan(str(tmp_path / "*.parquet"), "records").collect()
    assert "harness_id" in frame.columns and frame.height == 0


def test_a_harness_release_changes_what_the_model_is_sent(gw: Gateway, api: ReefClient, workdir: Path,
                                                          tmp_path: Path) -> None:
    s = "h-inject"
    before, label = ask(gw, s)
    assert before["harness_id"] is None and label == f"{s}@r0"
    view = register_candidate(workdir / "data", harness_candidate(tmp_path / "h", s))
    assert view.kind == "harness" and view.status == "registered"
    with pytest.raises(ReefAPIError) as refused:  # not gated: never released
        api.release(s, view.candidate_id, f"{s}@r0")
    assert refused.value.status == 409
    select(workdir / "data", s, view.candidate_id, f"{s}@r0")
    made = api.release(s, view.candidate_id, f"{s}@r0", approved_by="pytest")["release"]
    r0 = api.releases(s)["releases"][0]
    assert made["harness_id"] == view.candidate_id and made["content_id"] == r0["content_id"]  # same weights
    assert made["harness_lineage"]["recipe"] == "hand-written"

    after, label = ask(gw, s)
    assert label == made["release_id"] == after["release_id"]
    assert after["harness_id"] == view.candidate_id
    assert after["messages"][0] == {**after["messages"][0], "role": "system", "content": f"{SYSTEM}\n\n{RULES}"}
    # The prompt the engine tokenized grew by the system prompt, and still ends with the question.
    assert len(after["prompt_token_ids"]) > len(before["prompt_token_ids"]) + 10
    assert after["prompt_token_ids"][-8:] == before["prompt_token_ids"][-8:]

    served = httpx.get(f"{gw.url}/reef/harness", params={"scenario": s}, timeout=30).json()
    assert served["release_id"] == made["release_id"] and served["inject"] == "system_prepend"
    assert served["files"]["skills/add/SKILL.md"].startswith("---\nname: add")
    assert served["manifest"]["kind"] == "harness" and served["system_prompt"] == f"{SYSTEM}\n\n{RULES}"
    old = httpx.get(f"{gw.url}/reef/harness", params={"scenario": s, "release_id": f"{s}@r0"}, timeout=30).json()
    assert old["harness_id"] is None and old["files"] == {}
    missing = httpx.get(f"{gw.url}/reef/harness", params={"scenario": s, "release_id": f"{s}@r9"}, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_inject_off_sends_the_client_body(gw: Gateway, api: ReefClient, workdir: Path, tmp_path: Path) -> None:
    s = "h-off"
    before, _ = ask(gw, s)
    view = register_candidate(workdir / "data", harness_candidate(tmp_path / "h", s))
    select(workdir / "data", s, view.candidate_id, f"{s}@r0")
    api.release(s, view.candidate_id, f"{s}@r0")
    after, label = ask(gw, s)
    assert label == f"{s}@r1" and after["harness_id"] is None
    assert after["prompt_token_ids"] == before["prompt_token_ids"]
    served = httpx.get(f"{gw.url}/reef/harness", params={"scenario": s}, timeout=30).json()
    assert served["harness_id"] == view.candidate_id and served["inject"] == "off"


def test_composite_release_and_rollback_under_load(gw: Gateway, api: ReefClient, workdir: Path,
                                                   tmp_path: Path) -> None:
    s = "h-composite"
    data = workdir / "data"
    api.releases(s)  # the scenario's chain (r0) exists before the gate results name it
    lora = register_candidate(data, lora_candidate(tmp_path / "lora", s))
    tree = register_candidate(data, harness_candidate(tmp_path / "h", s))
    for cid in (lora.candidate_id, tree.candidate_id):
        select(data, s, cid, f"{s}@r0")
    with Load(gw.url, MODEL_NAME, s, QUESTION, clients=3) as load:
        wait_for(lambda: len(load.outcomes) >= 3)
        made = api.release(s, lora.candidate_id, f"{s}@r0", approved_by="pytest", harness=tree.candidate_id)
        new = made["release"]
        assert (new["content_id"], new["kind"], new["harness_id"]) == (lora.candidate_id, "lora", tree.candidate_id)
        assert "harness" in new["evaluation"] and made["serving"]["release_id"] == new["release_id"]
        # Twice the clients: at least one request was sent after the release (each client has one in flight).
        load.wait_for_more(2 * 3)
        back = api.rollback(s, f"{s}@r0", new["release_id"], approved_by="pytest")["release"]
        assert back["restores"] == f"{s}@r0" and back["harness_id"] is None
        load.wait_for_more(2 * 3)
    assert not load.errors(), load.errors()[:3]
    chain = {r["release_id"]: r for r in api.releases(s)["releases"]}
    labels: set[str] = set()
    for outcome in load.outcomes:
        record = httpx.get(f"{gw.url}/reef/records/{outcome.record_id}", timeout=30).json()
        assert record["harness_id"] == chain[record["release_id"]]["harness_id"], record["record_id"]
        injected = record["messages"][0]["role"] == "system"
        assert injected == (record["harness_id"] is not None)
        labels.add(record["release_id"])
    assert labels == {f"{s}@r0", new["release_id"], back["release_id"]}, labels
    assert {c["candidate_id"]: c["status"] for c in api.candidates(s)} == {
        lora.candidate_id: "released", tree.candidate_id: "released"}
