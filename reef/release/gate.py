"""The evaluation gate: a registered candidate vs. the scenario's head, on the scenario's eval suite.

Both answer every eval prompt `samples` times (transformers, same seed); a prompt's success is the
mean verifier score of its samples. The per-prompt differences are resampled (prompts with
replacement) into a bootstrap confidence interval of the mean difference, and the candidate is
selected only when the whole interval lies above `min_delta`: "better, and not by luck". Anything
that goes wrong (no eval suite, a corrupt artifact, a candidate for another base) rejects it: the
gate fails closed.

    python -m reef.release.gate CANDIDATE_ID [--data-dir data]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reef.release.artifacts import ArtifactStore
from reef.release.base_model import base_of, ensure_scenario, model_folders
from reef.release.candidates import (
    TRANSITIONS,
    CandidateRegistry,
    CandidateStateError,
    CandidateView,
    GateResult,
    Probe,
    PromptOutcome,
    find_candidate,
)
from reef.release.chain import ReleaseChain
from reef.release.schema import Release


@dataclass(frozen=True)
class GateConfig:
    samples: int | None = None  # None: the scenario's eval.samples
    seed: int = 0
    temperature: float = 1.0
    confidence: float = 0.95
    min_delta: float = 0.0
    bootstrap: int = 2000
    probe_tokens: int = 8


def bootstrap_ci(diffs: list[float], confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile interval of the mean of `diffs`, resampling its items with replacement."""
    values = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def _load(store: ArtifactStore, content_id: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    full, adapter = model_folders(store, content_id)
    model = AutoModelForCausalLM.from_pretrained(full, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model.eval(), AutoTokenizer.from_pretrained(full)


def _check_same_base(store: ArtifactStore, candidate: str, r0: Release) -> None:
    """The candidate must serve on the scenario's base: same weights for a LoRA, same tokenizer and
    chat template for full weights."""
    manifest, base = store.get(candidate), store.get(r0.content_id)
    if manifest.kind == "lora":
        if base_of(store, manifest).content_id != r0.content_id:
            raise ValueError(f"the LoRA runs on weights {manifest.base_model_sha256}, not this scenario's base")
    elif (manifest.tokenizer_sha256, manifest.chat_template_sha256) != (base.tokenizer_sha256,
                                                                          base.chat_template_sha256):
        raise ValueError("the candidate's tokenizer or chat template differs from the base model's")


def compare(store: ArtifactStore, candidate: str, head: Release, scenario: str, config: GateConfig,
            progress: bool = True) -> GateResult:
    """Run the gate; raises on any error (evaluate_candidate turns that into a reject)."""
    import torch
    from tqdm.auto import tqdm

    from reef.recipe.evaluate import mean_score, replies, suite_for

    started = time.monotonic()
    suite = suite_for(scenario)
    samples = config.samples or suite.samples
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's ops are too small for a second thread to help
    outputs: dict[str, list[list[str]]] = {}
    probe_text = ""
    try:
        for arm, content in tqdm([("candidate", candidate), ("head", head.content_id)], desc="gate",
                                 disable=not progress):
            model, tokenizer = _load(store, content)
            outputs[arm] = replies(model, tokenizer, suite.prompts, samples=samples, temperature=suite.temperature,
                                   seed=suite.seed, max_new_tokens=suite.max_new_tokens)
            if arm == "candidate":
                probe_text = replies(model, tokenizer, suite.prompts[:1], samples=1, temperature=0.0, seed=0,
                                     max_new_tokens=config.probe_tokens)[0][0]
    finally:
        torch.set_num_threads(threads)
    scored = {arm: suite.score(outputs[arm]) for arm in outputs}
    outcomes = []
    for i, messages in enumerate(suite.prompts):
        outcomes.append(PromptOutcome(
            messages=list(messages), candidate_replies=outputs["candidate"][i], head_replies=outputs["head"][i],
            candidate_score=mean_score(scored["candidate"][i]), head_score=mean_score(scored["head"][i]),
        ))
    diffs = [o.candidate_score - o.head_score for o in outcomes]
    low, high = bootstrap_ci(diffs, config.confidence, config.bootstrap, config.seed)
    n = len(diffs)
    delta = sum(diffs) / n
    selected = low > config.min_delta
    cand_success = sum(o.candidate_score for o in outcomes) / n
    head_success = sum(o.head_score for o in outcomes) / n
    reason = (f"success {cand_success:.3f} vs {head_success:.3f} ({head.release_id}); delta {delta:+.3f}, "
              f"{config.confidence:.0%} CI [{low:+.3f}, {high:+.3f}] "
              f"{'lies' if selected else 'does not lie'} above {config.min_delta:+.3f}")
    return GateResult(
        decision="select" if selected else "reject", reason=reason, head_release_id=head.release_id,
        candidate_success=round(cand_success, 4), head_success=round(head_success, 4),
        delta=round(delta, 4), ci_low=round(low, 4), ci_high=round(high, 4), confidence=config.confidence,
        prompts=n, samples_per_prompt=samples, wins=sum(d > 0 for d in diffs),
        losses=sum(d < 0 for d in diffs), ties=sum(d == 0 for d in diffs),
        probe=Probe(messages=list(suite.prompts[0]), max_tokens=config.probe_tokens, text=probe_text),
        seconds=round(time.monotonic() - started, 2), per_prompt=outcomes,
    )


def evaluate_candidate(data_dir: Path | str, candidate_id: str, config: GateConfig | None = None, *,
                       base_model: str | None = None, progress: bool = True) -> GateResult:
    """Gate a registered candidate against its scenario's current head and record the decision.

    `base_model` creates the scenario's r0 when the scenario has no chain yet (default: the base
    the candidate was trained on)."""
    config = config or GateConfig()
    view: CandidateView = find_candidate(data_dir, candidate_id)
    if TRANSITIONS.final(view.state):  # refused before spending minutes on a result nobody may record
        raise CandidateStateError(f"candidate {view.candidate_id[:12]} is {view.status} for good: nothing to gate")
    store = ArtifactStore.for_data_dir(data_dir)
    registry = CandidateRegistry(data_dir, view.scenario)
    head: Release | None = ReleaseChain.for_data_dir(data_dir, view.scenario, artifacts=store).head()
    try:
        if head is None:
            base = base_model or (view.lineage.base_model if view.lineage else None)
            if base is None:
                raise ValueError(f"scenario {view.scenario} has no release yet and no base model is known")
            chain, _ = ensure_scenario(data_dir, view.scenario, base, store)
            head = chain.head()
            assert head is not None
        r0 = ReleaseChain.for_data_dir(data_dir, view.scenario).releases()[0]
        _check_same_base(store, view.candidate_id, r0)
        result = compare(store, view.candidate_id, head, view.scenario, config, progress=progress)
    except Exception as exc:  # noqa: BLE001 - the gate fails closed: any error rejects
        result = GateResult(decision="reject", reason=f"gate error: {exc}",
                            head_release_id=head.release_id if head else None)
    registry.record_gate(view.candidate_id, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reef.release.gate", description=__doc__.splitlines()[0])
    parser.add_argument("candidate")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--samples", type=int, default=GateConfig.samples)
    parser.add_argument("--min-delta", type=float, default=GateConfig.min_delta)
    args = parser.parse_args(argv)
    result = evaluate_candidate(args.data_dir, args.candidate, GateConfig(samples=args.samples,
                                                                          min_delta=args.min_delta))
    print(f"{result.decision}: {result.reason}")
    return 0 if result.decision == "select" else 1


if __name__ == "__main__":
    raise SystemExit(main())
