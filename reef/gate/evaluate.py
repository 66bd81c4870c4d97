"""The evaluation gate: a candidate vs. a baseline (the scenario's head) on the scenario's eval suite,
and its decision. The arms are resolved by reef.gate.arms, sampled by reef.gate.sample and scored
by the suite's reward (reef.gate.scoring); here they are paired and judged.

A task's success is the mean reward of its scored replies. The per-task differences are judged by
two statistics (reef.gate.stats), and the candidate is selected only when both agree: the bootstrap
confidence interval of the mean difference (tasks resampled with replacement) lies above
`min_delta` ("better, by at least this"), and the paired exact sign test over the tasks where the
arms differ is below 1 - `confidence` with more candidate wins ("not by luck": a few large wins
among ties can lift an interval above 0, 5 wins of 5 cannot pass the test). `sign_test: false`
leaves the interval alone to decide. A reply the reward could not score is left out and counted
(`unscored`); a task without a scored reply in both arms is left out of the pairing.

An infrastructure fault is not a judgement (reef.gate.faults): a task whose requests still fault
after their retries is void, left out of both arms and counted (`void_pairs`). With fewer than
`min_valid_pairs` tasks scored in both arms (a faulted task is not, nor one whose replies the reward
could not score in an arm), or when the engine fails outside any one task, the decision is "void":
the candidate is neither selected nor rejected and may be gated again (the learner does, within
`learner.gate_retries`). Anything else that
goes wrong (no eval suite, a corrupt artifact, a candidate for another base, a request the engine
refuses) rejects it: the gate fails closed.

    python -m reef.gate.evaluate CANDIDATE_ID [--data-dir data] [--engine-url URL --engine-model NAME]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from reef.config import GateSettings
from reef.gate.arms import HarnessArms, Weights, engine_holds_base, first_head, folder_arms, registered_arms
from reef.gate.faults import GateFaultError, fault_of
from reef.gate.head_replies import HeadReplies
from reef.gate.looks import merge, part, plan_looks
from reef.gate.sample import Replies, sample_arms
from reef.gate.scoring import score_replies, suite_for
from reef.gate.stats import Verdict, judge
from reef.registry.artifacts import ArtifactStore
from reef.registry.candidates import (
    TRANSITIONS,
    CandidateRegistry,
    CandidateStateError,
    CandidateView,
    GateResult,
    Probe,
    PromptOutcome,
    find_candidate,
)
from reef.registry.schema import Release
from reef.registry.state import open_chain
from reef.sampling.engine import EngineEndpoint, add_engine_arguments, engine_of
from reef.scenario import EvalSuite

__all__ = ["evaluate_candidate", "gate_folders", "gate_weights", "schedule"]


def gate_weights(candidate: Weights, head: Weights, suite: EvalSuite, config: GateSettings | None = None, *,
                 engine: EngineEndpoint | None = None, head_label: str = "head", head_release_id: str | None = None,
                 data_dir: Path | str | None = None, progress: bool = True,
                 harnesses: HarnessArms | None = None, kept: HeadReplies | None = None) -> GateResult:
    """Compare two models on `suite`; raises on any error (evaluate_candidate turns that into a reject,
    or a void when it is an infrastructure fault).

    Through `engine` when the candidate is a LoRA (or a harness, with `harnesses`: both arms on the
    head's weights) and the head runs on the engine's base weights (`head.served` or an adapter);
    `data_dir` is where gates sharing the engine take turns. `harnesses`: the harness each arm's
    prompts are sent with (a harness candidate's gate has no probe: its release loads no weights to
    prove; the probe is the suite's own first prompt either way). `kept`: the head replies kept
    between gates on the engine (reef.gate.head_replies)."""
    config = config or GateSettings()
    if harnesses is not None and harnesses.compared:
        config = config.model_copy(update={"probe_tokens": 0})
    started = time.monotonic()
    samples, needed, looks = schedule(suite, config)
    early = config.model_copy(update={"confidence": config.early_confidence})
    parts: list[tuple[list[int], Replies]] = []
    for k, indices in enumerate(looks):
        start = sum(len(p) for p in looks[:k])
        # The probe is the suite's first task's, which leads the first part (reef.gate.looks).
        settings = config if k == 0 else config.model_copy(update={"probe_tokens": 0})
        parts.append((indices, sample_arms(candidate, head, part(suite, indices, start), samples, settings,
                                           engine=engine, data_dir=data_dir, progress=progress, harnesses=harnesses,
                                           kept=kept)))
        if k < len(looks) - 1:
            sampled = sorted(i for ids, _ in parts for i in ids)
            paired = _paired(_outcomes(suite, merge(len(suite.tasks), parts), sampled))
            if len(paired) >= needed and judge(_diffs(paired), early).selected:
                break
    stopped_early = len(parts) < len(looks)
    run = merge(len(suite.tasks), parts)
    note = run.note
    outcomes = _outcomes(suite, run, sorted(i for ids, _ in parts for i in ids))
    common = {"head_release_id": head_release_id, "samples_per_prompt": samples, "backend": run.backend,
              "void_pairs": len(run.faults), "fault_retries": run.retries, "per_prompt": outcomes,
              "tasks_sampled": len(outcomes), "stopped_early": stopped_early, "head_replies_reused": run.head_reused}
    unscored = sum(o.unscored for o in outcomes)
    paired = _paired(outcomes)
    answered, valid = len(outcomes) - len(run.faults), len(paired)
    if valid < needed:
        left = (f"; {answered - valid} answered tasks unscored in an arm ({unscored} replies unscored)"
                if answered > valid else "")
        return GateResult(decision="void", reason=f"gate void: {valid} of {len(outcomes)} pairs valid, "
                          f"{needed} needed ({_faults(run.faults)}{left}){note}", unscored=unscored,
                          seconds=round(time.monotonic() - started, 2), **common)
    n = len(paired)
    verdict = judge(_diffs(paired), config)
    cand_success = sum(o.candidate_score for o in paired) / n  # type: ignore[misc]
    head_success = sum(o.head_score for o in paired) / n  # type: ignore[misc]
    left_out = f"; {unscored} replies unscored, {answered - n} tasks left out" if unscored else ""
    void = f"; {len(run.faults)} pairs void ({_faults(run.faults)})" if run.faults else ""
    reason = (f"success {cand_success:.3f} vs {head_success:.3f} ({head_label}); delta {verdict.delta:+.3f}, "
              f"{config.confidence:.0%} CI [{verdict.low:+.3f}, {verdict.high:+.3f}] "
              f"{'lies' if verdict.interval_clears else 'does not lie'} above {config.min_delta:+.3f}; "
              f"sign test {verdict.wins}-{verdict.losses} p={verdict.sign_p:.3g}{_sign_says(verdict, config)}"
              f"{left_out}{void}{note}")
    if run.head_reused:
        reason += f"; the head's replies to {run.head_reused} tasks kept from before it (reef.gate.head_replies)"
    if stopped_early:
        reason += (f"; stopped early at look {len(parts)} of {len(looks)} ({len(outcomes)} of {len(suite.tasks)} "
                   f"tasks): both statistics passed at {config.early_confidence:.1%}")
    return GateResult(
        decision="select" if verdict.selected else "reject", reason=reason,
        candidate_success=round(cand_success, 4), head_success=round(head_success, 4),
        delta=round(verdict.delta, 4), ci_low=round(verdict.low, 4), ci_high=round(verdict.high, 4),
        confidence=config.confidence, prompts=n, wins=verdict.wins, losses=verdict.losses, ties=verdict.ties,
        unscored=unscored, sign_p=verdict.sign_p,
        probe=(Probe(messages=list(suite.prompts[0]), max_tokens=config.probe_tokens, text=run.probe)
               if config.probe_tokens else None),
        seconds=round(time.monotonic() - started, 2), **common,
    )


def schedule(suite: EvalSuite, config: GateSettings) -> tuple[int, int, list[list[int]]]:
    """How a gate samples `suite`: replies per task and arm, the valid pairs a verdict needs, and the
    task indices of each look (reef.gate.looks; a task's seed is `suite.seed` + its place in them)."""
    # Greedy replies to one prompt are all the same (and vLLM refuses n > 1 without sampling).
    samples = 1 if suite.temperature == 0 else config.samples or suite.samples
    needed = min(config.min_valid_pairs, len(suite.tasks))
    return samples, needed, plan_looks(len(suite.tasks), config.looks, suite.seed, needed)


def _outcomes(suite: EvalSuite, run: Replies, sampled: list[int]) -> list[PromptOutcome]:
    """Each sampled task's replies, scores and fault, in suite order."""
    outputs = {arm: [run.outputs[arm][i] for i in sampled] for arm in run.outputs}
    scored = {arm: score_replies(part(suite, sampled, 0), outputs[arm]) for arm in outputs}
    return [PromptOutcome(
        messages=list(suite.prompts[i]), candidate_replies=outputs["candidate"][j], head_replies=outputs["head"][j],
        candidate_score=scored["candidate"].per_task[j], head_score=scored["head"].per_task[j],
        unscored=sum(scored[arm].unscored_per_task[j] for arm in scored), fault=run.faults.get(i),
    ) for j, i in enumerate(sampled)]


def _paired(outcomes: list[PromptOutcome]) -> list[PromptOutcome]:
    """The valid pairs: a pair counts once both arms have a scored reply (a faulted task has none,
    and neither has a task whose replies the reward could not score in one arm)."""
    return [o for o in outcomes if o.candidate_score is not None and o.head_score is not None]


def _diffs(paired: list[PromptOutcome]) -> list[float]:
    return [o.candidate_score - o.head_score for o in paired]  # type: ignore[operator]


def _sign_says(verdict: Verdict, config: GateSettings) -> str:
    """Whether the sign test agrees, in words: ` below 0.05`, ` not below 0.05`, ` (off)`."""
    if not config.sign_test:
        return " (not required: gate.sign_test is off)"
    alpha = f"{1.0 - config.confidence:.3g}"
    if verdict.sign_agrees:
        return f" below {alpha}"
    return f" not below {alpha}" if verdict.wins > verdict.losses else " (the head won as many or more)"


def _faults(faults: dict[int, str]) -> str:
    """`29 engine faults: ReadTimeout` / `3 engine faults: 2 HTTP 503, 1 ReadTimeout`."""
    kinds = Counter(faults.values())
    named = (next(iter(kinds)) if len(kinds) == 1
             else ", ".join(f"{count} {kind}" for kind, count in kinds.most_common()))
    return f"{len(faults)} engine faults: {named}" if faults else "no engine faults"


def gate_folders(candidate: Path | str, baseline: Path | str, scenario: str, config: GateSettings | None = None, *,
                 progress: bool = True) -> GateResult:
    """The gate on two folders, outside any release chain (the DVC evaluate stage, `reef recipe run`):
    a recipe's candidate folder vs. a model folder (transformers; raises on errors). A harness
    candidate folder is gated on `baseline`'s weights against no harness."""
    arms = folder_arms(candidate, baseline, scenario)
    return gate_weights(arms.candidate, arms.head, suite_for(scenario), config, head_label=str(baseline),
                        progress=progress, harnesses=arms.harnesses)


def evaluate_candidate(data_dir: Path | str, candidate_id: str, config: GateSettings | None = None, *,
                       base_model: str | None = None, progress: bool = True,
                       engine: EngineEndpoint | None = None) -> GateResult:
    """Gate a registered candidate against its scenario's current head and record the decision.

    `engine` is the serving vLLM (its OpenAI server, not the gateway); without it, or for
    full-weight candidates, transformers samples. `base_model` creates the scenario's r0 when the
    scenario has no chain yet (default: the base the candidate was trained on)."""
    config = config or GateSettings()
    view: CandidateView = find_candidate(data_dir, candidate_id)
    if TRANSITIONS.final(view.state):  # refused before spending minutes on a result nobody may record
        raise CandidateStateError(f"candidate {view.candidate_id[:12]} is {view.status} for good: nothing to gate")
    store = ArtifactStore.for_data_dir(data_dir)
    registry = CandidateRegistry(data_dir, view.scenario)
    head: Release | None = open_chain(data_dir, view.scenario, artifacts=store).head()
    try:
        if head is None:
            head = first_head(data_dir, view, base_model, store)
        r0 = open_chain(data_dir, view.scenario).releases()[0]
        if engine is not None and not engine_holds_base(data_dir, r0.content_id):
            engine = None
        suite = suite_for(view.scenario, engine.base_url if engine else None, engine.model if engine else None)
        arms = registered_arms(store, view, head, r0, engine)
        kept = HeadReplies(data_dir, view.scenario) if engine is not None and config.reuse_head_replies else None
        result = gate_weights(arms.candidate, arms.head, suite, config, engine=engine, head_label=head.release_id,
                              head_release_id=head.release_id, data_dir=data_dir, progress=progress,
                              harnesses=arms.harnesses, kept=kept)
    except Exception as exc:  # noqa: BLE001 - the gate fails closed: any error rejects, but a fault judges nothing
        fault = fault_of(exc)
        void = fault is not None or isinstance(exc, GateFaultError)
        reason = (f"gate error: {exc}" if not void else f"gate void: {exc}" if fault is None
                  else f"gate void: engine fault ({fault}): {exc}")
        result = GateResult(decision="void" if void else "reject", reason=reason,
                            head_release_id=head.release_id if head else None)
    registry.record_gate(view.candidate_id, result)
    return result


def main(argv: list[str] | None = None) -> int:
    defaults = GateSettings()
    parser = argparse.ArgumentParser(prog="python -m reef.gate.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("candidate")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--samples", type=int, default=defaults.samples)
    parser.add_argument("--min-delta", type=float, default=defaults.min_delta)
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    try:
        engine = engine_of(args.engine_url, args.engine_model)
    except ValueError as exc:
        parser.error(str(exc))
    result = evaluate_candidate(args.data_dir, args.candidate, GateSettings(samples=args.samples,
                                                                            min_delta=args.min_delta), engine=engine)
    print(f"{result.decision}: {result.reason}")
    return 0 if result.decision == "select" else 1


if __name__ == "__main__":
    raise SystemExit(main())
