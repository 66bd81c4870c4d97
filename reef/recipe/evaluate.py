"""Candidate vs. the serving model on a scenario's held-out eval suite, paired per prompt.

Both models answer every eval prompt `samples` times with plain transformers sampling from the
same seed; a prompt's success is the mean verifier score of its samples, and the comparison is the
per-prompt difference (mean, standard error, wins/losses/ties), which cancels prompt difficulty.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reef.recipe.spec import CANDIDATE_FILE
from reef.scenario import EvalSuite, Score, eval_suite, get_scenario


def suite_for(scenario: str, engine_url: str | None = None, engine_model: str | None = None) -> EvalSuite:
    """The declared eval suite of a scenario (see reef.scenario); ScenarioError when it has none."""
    from reef.config import resolve

    config, _ = resolve()  # serve.yaml in the working folder, if any, declares scenarios too
    return eval_suite(get_scenario(scenario, config), engine_url, engine_model)


def mean_score(scores: Sequence[Score]) -> float:
    """Mean of the scored replies; a reply the reward could not score is left out (0 when none were)."""
    values = [s.value for s in scores if s.value is not None]
    return sum(values) / len(values) if values else 0.0


def load_model(path: Path | str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model folder, a full candidate, or a LoRA candidate (merged into its base model)."""
    path = Path(path)
    meta = json.loads((path / CANDIDATE_FILE).read_text()) if (path / CANDIDATE_FILE).is_file() else {}
    if meta.get("kind") == "lora":
        from peft import PeftModel

        base = meta["lineage"]["base_model"]
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, path).merge_and_unload()
        return model.eval(), AutoTokenizer.from_pretrained(base)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def replies(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[dict[str, str]]], *,
            samples: int, temperature: float, seed: int, max_new_tokens: int = 16, batch_size: int = 32
            ) -> list[list[str]]:
    torch.manual_seed(seed)
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        ids = [tokenizer.encode(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False),
                                add_special_tokens=False) for p in prompts[start : start + batch_size]]
        width = max(map(len, ids))
        pad = tokenizer.pad_token_id
        gen = model.generate(
            input_ids=torch.tensor([[pad] * (width - len(i)) + i for i in ids]),
            attention_mask=torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids]),
            max_new_tokens=max_new_tokens, do_sample=temperature > 0, num_return_sequences=samples,
            temperature=temperature if temperature > 0 else None, top_k=0 if temperature > 0 else None,
            top_p=1.0 if temperature > 0 else None, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        out += [texts[i : i + samples] for i in range(0, len(texts), samples)]
    return out


def success_per_prompt(model_path: Path | str, suite: EvalSuite, **kwargs: Any) -> list[float]:
    model, tokenizer = load_model(model_path)
    got = replies(model, tokenizer, suite.prompts, max_new_tokens=suite.max_new_tokens, **kwargs)
    return [mean_score(scores) for scores in suite.score(got)]


def evaluate(candidate: Path | str, baseline: Path | str, scenario: str, *, samples: int | None = None,
             seed: int | None = None, temperature: float | None = None,
             out: Path | str | None = None) -> dict[str, Any]:
    """Paired success rates of `candidate` and `baseline` on the scenario's eval suite (its own
    samples, seed and temperature unless given); written as JSON to `out` when given (DVC metrics)."""
    suite = suite_for(scenario)
    samples = suite.samples if samples is None else samples
    seed = suite.seed if seed is None else seed
    temperature = suite.temperature if temperature is None else temperature
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kw = dict(samples=samples, temperature=temperature, seed=seed)
        cand = success_per_prompt(candidate, suite, **kw)
        base = success_per_prompt(baseline, suite, **kw)
    finally:
        torch.set_num_threads(threads)
    diffs = [c - b for c, b in zip(cand, base, strict=True)]
    n = len(diffs)
    metrics: dict[str, Any] = {
        "scenario": scenario,
        "prompts": n,
        "samples_per_prompt": samples,
        "temperature": temperature,
        "seed": seed,
        "candidate_success": round(sum(cand) / n, 4),
        "baseline_success": round(sum(base) / n, 4),
        "delta": round(sum(diffs) / n, 4),
        "delta_stderr": round(statistics.stdev(diffs) / math.sqrt(n), 4) if n > 1 else None,
        "wins": sum(d > 0 for d in diffs),
        "losses": sum(d < 0 for d in diffs),
        "ties": sum(d == 0 for d in diffs),
    }
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics
