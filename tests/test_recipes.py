"""Recipes with real TRL on the tiny model: snapshots (selection, staleness, content hash), the
consumed ledger, rft and online_rl end to end (full and LoRA), candidate metadata, evaluation."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from recipes.online_rl.recipe import rl_examples
from reef.config import GateSettings
from reef.core.paths import CANDIDATE_FILE
from reef.learn.pipeline import gate_metrics
from reef.recipe import EmptySnapshotError, ExperienceSpec, RecipeConfig, Snapshot, load_recipe, resolve
from reef.recipe.ledger import ConsumedError, consumed
from reef.registry.schema import Candidate
from reef.sampling.load import load_model
from reef.traffic.offline import record_offline_traffic

os.environ.setdefault("OMP_NUM_THREADS", "1")
SCENARIO = "demo-add"


@pytest.fixture(scope="module")
def store(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two releases of demo traffic (24 prompts x 4 samples each); HEAD is r2, so r0 is 2 behind."""
    data = tmp_path_factory.mktemp("exp") / "data"
    record_offline_traffic(tiny, data, "demo-add", prompts=24, samples=4, seed=1, release=f"{SCENARIO}@r0")
    record_offline_traffic(tiny, data, "demo-add", prompts=24, samples=4, seed=2, release=f"{SCENARIO}@r2")
    (data / "releases" / SCENARIO).mkdir(parents=True)
    (data / "releases" / SCENARIO / "HEAD").write_text(f"{SCENARIO}@r2\n")
    return data


def recipe(ref: str, tiny: Path, **params: object):  # noqa: ANN201
    base = {"scenario": SCENARIO, "base_model": str(tiny), "max_steps": 3, "per_device_batch_size": 8}
    return load_recipe(ref, {**base, **params})


def test_registry_resolves_names_and_rejects_unknown_params(tiny: Path) -> None:
    assert resolve("rft") is resolve("recipes.rft.recipe:RFT")
    assert recipe("online_rl", tiny).ref == "recipes.online_rl.recipe:OnlineRL"
    with pytest.raises(ValueError, match="learning_rat"):
        load_recipe("rft", {"scenario": SCENARIO, "learning_rat": 1.0})
    with pytest.raises(ValueError, match="stale_policy"):
        load_recipe("rft", {"scenario": SCENARIO, "stale_policy": "downweight"})
    with pytest.raises(ValueError, match="needs `scenario`"):  # framework code names no scenario of its own
        load_recipe("rft", {})  # SFT has no sample weights: drop only


def test_snapshot_applies_staleness_as_declared(store: Path, tmp_path: Path) -> None:
    total = 2 * 24 * 4
    drop = ExperienceSpec(SCENARIO, max_staleness=1, stale_policy="drop", drop_duplicates=False)
    snap = Snapshot.create(SCENARIO, store, drop, root=tmp_path / "snaps", ledger_root=tmp_path / "ledger")
    assert snap.manifest["counts"]["stale_dropped"] == total // 2
    assert snap.head_release == f"{SCENARIO}@r2"
    assert set(snap.frame()["release_id"]) == {f"{SCENARIO}@r2"}

    down = ExperienceSpec(SCENARIO, max_staleness=1, stale_policy="downweight", stale_weight=0.25,
                          drop_duplicates=False)
    snap = Snapshot.create(SCENARIO, store, down, root=tmp_path / "snaps", ledger_root=tmp_path / "ledger")
    assert snap.manifest["counts"]["stale_downweighted"] == total // 2
    weights = dict(snap.frame().group_by("release_id").agg(pl.col("weight").max()).iter_rows())
    assert weights == {f"{SCENARIO}@r0": 0.25, f"{SCENARIO}@r2": 1.0}  # 2 behind, 1 over the limit

    again = Snapshot.create(SCENARIO, store, down, root=tmp_path / "snaps", ledger_root=tmp_path / "ledger")
    assert (again.id, again.path) == (snap.id, snap.path)  # content-hashed: same selection, same folder
    assert snap.path.name == f"{SCENARIO}-{snap.hash[:12]}"
    assert sorted(snap.record_ids) == sorted(snap.frame()["record_id"].to_list()) and len(snap.record_ids) == total


def test_snapshot_groups_and_batches(store: Path, tmp_path: Path) -> None:
    spec = ExperienceSpec(SCENARIO, group_by="tag:task_id", min_group_size=2, batch_size=20, drop_duplicates=False)
    snap = Snapshot.create(SCENARIO, store, spec, root=tmp_path, ledger_root=tmp_path / "ledger")
    samples = snap.samples()
    sizes = samples.group_by("group").len()["len"].to_list()
    assert sum(sizes) <= 20 and min(sizes) >= 2 and samples["group"].str.starts_with("task_id=").all()
    assert snap.manifest["counts"]["over_batch_deferred"] > 0
    # Served token ids, not a re-tokenization: the completion ends with the recorded <|im_end|>.
    row = samples.row(0, named=True)
    assert len(row["completion_ids"]) == len(row["logprobs"])


def test_rft_full_candidate_lineage_and_ledger(tiny: Path, store: Path, tmp_path: Path) -> None:
    rft = recipe("rft", tiny)
    ledger_root = tmp_path / "ledger"
    snap = Snapshot.create(SCENARIO, store, rft.experience(), root=tmp_path / "snaps", ledger_root=ledger_root)
    assert (snap.frame()["score"] >= 1.0).all()
    cand = rft.run(snap, out_root=tmp_path / "cands", progress=False)

    assert cand.path == tmp_path / "cands" / cand.id
    model = AutoModelForCausalLM.from_pretrained(cand.path)
    assert model.config.model_type == "qwen2"
    assert (cand.path / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    meta = json.loads((cand.path / CANDIDATE_FILE).read_text())
    lin = meta["lineage"]
    assert lin["snapshot_hash"] == snap.hash and lin["snapshot_id"] == snap.id
    assert lin["recipe"] == "recipes.rft.recipe:RFT"
    assert lin["params"]["max_steps"] == 3 and lin["params"]["min_score"] == 1.0
    assert lin["parent_release"] == f"{SCENARIO}@r2"
    assert len(lin["code_commit"].removesuffix("+dirty")) == 40
    assert lin["base_model_sha256"] and lin["versions"]["trl"]
    assert meta["metrics"]["train_samples"] > 0 and meta["metrics"]["train_loss"] > 0
    assert Candidate.read(cand.path) == cand

    # Consumed: the ledger holds exactly the snapshot's ids, and no later snapshot takes them.
    assert sorted(consumed(ledger_root, SCENARIO)["record_id"]) == sorted(snap.record_ids)
    with pytest.raises(EmptySnapshotError, match="'consumed': " + str(len(snap.record_ids))):
        Snapshot.create(SCENARIO, store, rft.experience(), root=tmp_path / "snaps", ledger_root=ledger_root)
    assert (meta["metrics"]["micro_batch"], meta["metrics"]["gradient_accumulation_steps"]) == (8, 1)

    # A sibling from the same round is fine; with a token budget below 8 examples, the micro-batch
    # shrinks and accumulation makes up the configured batch of 8.
    small = recipe("rft", tiny, max_batch_tokens=1).run(snap, out_root=tmp_path / "again", progress=False)
    metrics = json.loads((small.path / CANDIDATE_FILE).read_text())["metrics"]
    assert (metrics["micro_batch"], metrics["gradient_accumulation_steps"]) == (1, 8)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 64), accumulate=st.integers(1, 8), longest=st.integers(0, 5000),
       budget=st.one_of(st.none(), st.integers(1, 20000)))
def test_micro_batches_fit_the_token_budget_and_keep_the_batch(
        size: int, accumulate: int, longest: int, budget: int | None) -> None:
    config = RecipeConfig(scenario=SCENARIO, per_device_batch_size=size, gradient_accumulation_steps=accumulate,
                          max_batch_tokens=budget)
    micro, steps = config.micro_batch(longest)
    assert micro * steps == size * accumulate and 1 <= micro <= size
    if budget is None or size * longest <= budget:
        assert (micro, steps) == (size, accumulate)
    else:  # the largest batch that fits and divides the effective batch (1 always does)
        assert micro == 1 or micro * longest <= budget
        assert not any((size * accumulate) % d == 0 and d * longest <= budget for d in range(micro + 1, size + 1))


def test_a_record_is_never_consumed_twice(tiny: Path, store: Path, tmp_path: Path) -> None:
    rft = recipe("rft", tiny, max_steps=1)
    ledger_root = tmp_path / "ledger"
    store = Path(shutil.copytree(store, tmp_path / "data"))  # this test adds traffic
    first = Snapshot.create(SCENARIO, store, rft.experience(), dest=tmp_path / "a", ledger_root=ledger_root)
    record_offline_traffic(tiny, store, "demo-add", prompts=24, samples=4, seed=3, release=f"{SCENARIO}@r2")
    overlapping = Snapshot.create(SCENARIO, store, rft.experience(), dest=tmp_path / "b", ledger_root=ledger_root)
    assert set(first.record_ids) < set(overlapping.record_ids)
    rft.run(first, out_root=tmp_path / "cands", progress=False)
    # Taken before the first round finished, the second snapshot now overlaps consumed records.
    with pytest.raises(ConsumedError):
        rft.run(overlapping, out_root=tmp_path / "cands", progress=False)

    fresh = Snapshot.create(SCENARIO, store, rft.experience(), dest=tmp_path / "c", ledger_root=ledger_root)
    assert set(fresh.record_ids) == set(overlapping.record_ids) - set(first.record_ids)
    assert fresh.manifest["counts"]["consumed"] == len(first.record_ids)


def test_rl_examples_group_relative_advantages() -> None:
    samples = pl.DataFrame({
        "group": ["a", "a", "a", "a", "b", "b"], "score": [1.0, 0.0, 0.0, 0.0, 1.0, 1.0],
        "weight": [1.0, 1.0, 0.5, 1.0, 1.0, 1.0], "prompt_ids": [[1, 2]] * 6, "completion_ids": [[3, 4]] * 6,
        "logprobs": [[-0.1, -0.2]] * 5 + [[-0.1]],
    })
    ds, counts = rl_examples(samples, scale=False, max_length=64)
    assert counts == {"samples": 6, "no_logprobs": 1, "zero_advantage": 1, "train_samples": 4}
    assert ds["advantage"] == pytest.approx([0.75, -0.25, -0.25, -0.25])  # group "b" has no signal
    assert ds["weight"][2] == 0.5 and ds["completion_mask"][0] == [0, 0, 1, 1]
    assert ds["behaviour"][0] == pytest.approx([0.0, 0.0, -0.1, -0.2])


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_online_rl_end_to_end(kind: str, tiny: Path, store: Path, tmp_path: Path) -> None:
    rl = recipe("online_rl", tiny, kind=kind, max_staleness=1, stale_weight=0.5, max_steps=4, per_device_batch_size=16)
    snap = Snapshot.create(SCENARIO, store, rl.experience(), root=tmp_path / "snaps", ledger_root=tmp_path / "l")
    assert snap.manifest["counts"]["stale_downweighted"] > 0  # online_rl keeps stale samples, down-weighted
    cand = rl.run(snap, out_root=tmp_path / "cands", progress=False)
    m = cand.metrics
    assert m["train_samples"] + m["zero_advantage"] + m["no_logprobs"] == m["samples"] > 0
    # Recorded by the same weights: the importance ratio starts at ~1 and the cap rarely binds.
    assert 0.8 < m["is_ratio"] < 1.25 and m["is_truncated"] < 0.2
    # Every step's metrics are kept with the candidate: in candidate.json and as TensorBoard events.
    steps = [r for r in cand.training_log if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all({"reward", "kl", "grad_norm", "learning_rate", "is_ratio"} <= set(r) for r in steps)
    assert all(0.0 <= r["reward"] <= 1.0 and r["kl"] >= 0.0 for r in steps)
    assert list((cand.path / "tensorboard").rglob("events.out.tfevents.*"))
    assert Candidate.read(cand.path).training_log == cand.training_log
    if kind == "lora":
        assert (cand.path / "adapter_config.json").exists() and not (cand.path / "model.safetensors").exists()
    model, _ = load_model(cand.path)
    base, _ = load_model(tiny)
    ids = torch.tensor([snap.samples()["prompt_ids"][0].to_list()])
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits)  # training moved the weights


def test_the_gate_on_folders_is_paired_and_written_as_metrics(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "metrics.json"
    m = gate_metrics(tiny, tiny, SCENARIO, GateSettings(samples=1, seed=3), out)
    assert m["candidate_success"] == m["head_success"] and m["delta"] == 0.0 and m["decision"] == "reject"
    assert m["ties"] == m["prompts"] == 80 and m["unscored"] == 0 and json.loads(out.read_text()) == m
    with pytest.raises(ValueError, match="temperature"):
        gate_metrics(tiny, tiny, SCENARIO, GateSettings(temperature=0.5), out)  # the scenario's eval section says that
