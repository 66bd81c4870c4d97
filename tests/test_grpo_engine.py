"""The grpo recipe through the session's real vLLM: TRL's GRPOTrainer samples the policy it trains
from our engine (its LoRA loaded under a temporary name each step, unloaded after), scores the
replies with the scenario's reward, trains, and keeps every rollout with its provenance, token ids
and behaviour logprobs."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import httpx
import pytest

from reef.recipe import Snapshot, load_recipe
from reef.sampling.engine import TEMP_PREFIX, EngineEndpoint
from reef.scenario import get_scenario
from tests.helpers import MODEL_NAME

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm]


def test_grpo_samples_the_trained_policy_through_the_engine(vllm_url: str, serving_model: Path,
                                                            tmp_path: Path) -> None:
    demo_add = get_scenario("demo-add")  # the tiny model is right about a quarter of the time
    params = {"scenario": "demo-add", "base_model": str(serving_model), "max_steps": 2, "prompts_per_step": 2,
              "num_generations": 4, "max_new_tokens": 12, "max_prompts": 8, "sample_seed": 0}
    recipe = load_recipe("grpo", params, declared=demo_add)
    recipe.engine = EngineEndpoint(vllm_url, MODEL_NAME)
    snap = Snapshot.create("demo-add", tmp_path / "no-data", recipe.experience(), root=tmp_path / "snaps",
                           ledger_root=tmp_path / "ledger", allow_empty=True)
    cand = recipe.run(snap, out_root=tmp_path / "cands", progress=False)

    m = cand.metrics
    assert cand.kind == "lora" and m["rollouts"] == 2 * 2 * 4  # steps x prompts x generations
    files = list((cand.path / "rollouts").glob("*.parquet"))
    rows = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    assert len(rows) == m["rollouts"] and set(rows["source"]) == {"grpo"}
    assert all(r["prompt_ids"] and r["completion_ids"] for r in rows)
    assert all(len(r["logprobs"]) == len(r["completion_ids"]) and max(r["logprobs"]) <= 0 for r in rows)
    assert all(r["reward"] in (0.0, 1.0) for r in rows)
    assert [row["step"] for row in cand.training_log][-1] == 2
    assert not (cand.path / "adapters").exists() and not any(cand.path.glob(".trainer*"))
    models = httpx.get(f"{vllm_url}/v1/models", timeout=30).json()["data"]
    assert not [m["id"] for m in models if m["id"].startswith(TEMP_PREFIX)]  # every step's adapter unloaded
