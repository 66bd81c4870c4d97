"""What a recipe trains on, before any trainer runs: long examples cut from the left so that the
completion is always trained (every recipe's example builder), and a LoRA round continuing from a
previous adapter (`init_adapter`) instead of a fresh one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from recipes.experimental.kto.recipe import kto_examples
from recipes.online_rl.recipe import rl_examples
from reef.core.paths import CANDIDATE_FILE
from reef.recipe import Snapshot, load_recipe
from reef.recipe.policy_gradient import policy_gradient_loss
from reef.recipe.tokens import IGNORE, CutStats, fit_left, sft_examples
from reef.sampling.completion import Completion
from reef.sampling.rollout import sample
from reef.sampling.transformers import chat_prompt_ids

os.environ.setdefault("OMP_NUM_THREADS", "1")
PROMPT = list(range(100, 110))  # 10 tokens
COMPLETION = [7, 8, 9]


def test_fit_left_keeps_the_completion() -> None:
    assert fit_left(PROMPT, COMPLETION, 13) == (0, 3, False, False)  # fits exactly
    assert fit_left(PROMPT, COMPLETION, 8) == (5, 3, True, False)  # the prompt's start goes
    # The completion alone is too long: one prompt token stays (the first label's position), its start is kept.
    assert fit_left(PROMPT[:4], list(range(10)), 6) == (3, 5, True, True)
    assert fit_left(PROMPT, [], 4) == (6, 0, True, False)


def test_every_example_builder_cuts_from_the_left() -> None:
    samples = pl.DataFrame({
        "record_id": ["long", "huge", "short"], "group": ["g", "g", "g"], "score": [1.0, 0.0, 1.0],
        "weight": [1.0, 1.0, 1.0], "prompt_ids": [PROMPT, PROMPT, [1, 2]],
        "completion_ids": [COMPLETION, list(range(20, 32)), COMPLETION],
        "logprobs": [[-0.7, -0.8, -0.9], [-0.5] * 12, [-0.7, -0.8, -0.9]],
    })
    stats = CutStats()
    sft = sft_examples(samples, 8, stats)
    assert sft["input_ids"][0] == PROMPT[5:] + COMPLETION and sft["labels"][0] == [IGNORE] * 5 + COMPLETION
    assert sft["input_ids"][1] == PROMPT[-1:] + list(range(20, 27))  # completion's start, one prompt token
    assert sft["input_ids"][2] == [1, 2] + COMPLETION and stats.as_metrics() == {
        "truncated_prompts": 2, "truncated_completions": 1}

    stats = CutStats()
    ds, _ = rl_examples(samples, scale=False, max_length=8, stats=stats)
    assert ds["input_ids"][0] == PROMPT[5:] + COMPLETION and ds["completion_mask"][0] == [0] * 5 + [1] * 3
    assert ds["behaviour"][0] == pytest.approx([0.0] * 5 + [-0.7, -0.8, -0.9])  # still aligned to positions
    assert len(ds["behaviour"][1]) == len(ds["input_ids"][1]) == 8
    assert stats.as_metrics() == {"truncated_prompts": 2, "truncated_completions": 1}

    stats = CutStats()
    kto = kto_examples(samples, threshold=0.5, seed=0, max_length=8, stats=stats)
    rows = {tuple(c): p for p, c in zip(kto["prompt_ids"], kto["completion_ids"], strict=True)}
    assert rows[tuple(COMPLETION)] in (PROMPT[5:], [1, 2]) and len(rows[tuple(range(20, 27))]) == 1
    assert stats.as_metrics() == {"truncated_prompts": 2, "truncated_completions": 1}


def test_self_generated_rollouts_are_cut_from_the_left(tiny: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    long_chat = [{"role": "user", "content": "What is 2 + 4? " * 20}]
    prompt = chat_prompt_ids(tokenizer, long_chat)
    assert len(prompt) > 40
    torch.manual_seed(0)
    got = sample(model, tokenizer, [prompt], 2, max_new_tokens=6, max_length=40)[0]
    assert all(r.prompt_ids == prompt[-34:] for r in got)

    rollout = Completion(prompt, [10, 11, 12], "")
    cut = Completion(prompt[-5:], [10, 11, 12], "")
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        assert policy_gradient_loss(model, [rollout], [1.0], pad, max_length=8).item() == pytest.approx(
            policy_gradient_loss(model, [cut], [1.0], pad).item())


def lora_weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "adapter_model.safetensors"))


def test_lora_round_continues_from_an_adapter(tiny: Path, tmp_path: Path) -> None:
    # 16 samples: with 4, all of them were sometimes wrong (no reward spread, so no gradient at all).
    first = load_recipe("ttt", {"scenario": "demo-add", "base_model": str(tiny), "task_id": "add-2-4-t0",
                                "max_steps": 2, "samples_per_round": 16, "lora_r": 4})
    snap = Snapshot.create("demo-add", tmp_path / "no-data", first.experience(), root=tmp_path / "snaps",
                           ledger_root=tmp_path / "ledger", allow_empty=True)
    head = first.run(snap, out_root=tmp_path / "c", progress=False)
    trained = lora_weights(head.path)
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in trained.items())

    # Loaded trainable, with the adapter's own rank (4), not the config's (16) and not reset.
    params = {"scenario": "demo-add", "base_model": str(tiny), "task_id": "add-2-4-t0", "max_steps": 2,
              "samples_per_round": 16, "init_adapter": str(head.path)}
    cont = load_recipe("ttt", params)
    model, _ = cont.load_model()
    state = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(state) == len(trained) and all(v.shape[0] == 4 or v.shape[1] == 4 for v in state.values())
    assert sorted(v.sum().item() for v in state.values()) == pytest.approx(sorted(v.sum().item()
                                                                                 for v in trained.values()))
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    del model

    second = cont.run(snap, out_root=tmp_path / "c", progress=False)
    assert second.id != head.id and second.lineage.params["init_adapter"] == str(head.path)
    after = lora_weights(second.path)
    assert after.keys() == trained.keys() and any(not torch.equal(after[k], trained[k]) for k in after)

    with pytest.raises(ValueError, match="kind: lora"):
        rft = load_recipe("rft", {"scenario": "demo-add", "base_model": str(tiny), "init_adapter": str(head.path)})
        rft.load_model()
    with pytest.raises(ValueError, match="no adapter_config.json"):
        load_recipe("ttt", {**params, "init_adapter": str(tmp_path)}).load_model()
    meta = json.loads((head.path / CANDIDATE_FILE).read_text())
    meta["lineage"]["base_model_sha256"] = "0" * 64
    (head.path / CANDIDATE_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="trained on base weights 000000000000"):
        cont.load_model()
