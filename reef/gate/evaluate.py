"""The evaluation gate: a candidate vs. a baseline (the scenario's head) on the scenario's eval suite,
each arm's replies scored by the one evaluator (reef.gate.evaluator).

Both answer every eval task `samples` times with the scenario's `max_new_tokens` and temperature;
a task's success is the mean reward of its scored replies. A scenario with an `environment` is
answered in episodes: its tool calls are executed and the model goes on until its final answer,
which is what the reward scores (reef.scenario.environment). Through the serving engine (`engine`:
vLLM's OpenAI server) when the candidate is a LoRA: it is loaded under a temporary adapter name
(reef.sampling.engine). Full-weight candidates, and every gate without an engine, sample with
transformers instead: one engine cannot hold two sets of full weights on CPU. The per-task
differences are resampled (tasks with replacement) into a bootstrap confidence interval of the
mean difference, and the candidate is selected only when the whole interval lies above
`min_delta`: "better, and not by luck". A paired exact sign test over the tasks where the arms
differ is reported beside it (`sign_p`). A reply the reward could not score is left out and
counted (`unscored`); a task with no scored reply in either arm is left out of the pairing.

An infrastructure fault is not a judgement (reef.gate.faults): a request that times out, loses its
connection or gets a 5xx is retried (`fault_retries`); a task still failing is void, left out of
both arms and counted (`void_pairs`). With fewer than `min_valid_pairs` tasks answered, or when the
engine fails outside any one task, the decision is "void": the candidate is neither selected nor
rejected and may be gated again. Anything else that goes wrong (no eval suite, a corrupt artifact,
a candidate for another base, a request the engine refuses) rejects it: the gate fails closed.

A harness candidate (prompts, rules, skills; reef.recipe.harness_recipe) is gated the same way with the
head's weights answering both arms: each eval prompt is sent with the candidate's harness in one
arm and with the head's harness (or none) in the other, applied the way the scenario serves it
(`harness.inject`; `off`, where clients apply the harness themselves, is gated as
`system_prepend`), with the same per-task seeds, so the pairs differ only by the harness.

    python -m reef.gate.evaluate CANDIDATE_ID [--data-dir data] [--engine-url URL --engine-model NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reef.core.paths import DataDir
from reef.gate.evaluator import declared_scenario, score_replies, suite_for
from reef.gate.faults import Void, fault_of, with_retries
from reef.gate.stats import bootstrap_ci, sign_test
from reef.registry.artifacts import ArtifactStore
from reef.registry.base_model import base_of, ensure_scenario, model_folders
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
from reef.registry.chain import ReleaseChain
from reef.registry.harness import Harness, inject, load_harness
from reef.registry.schema import Release, adapter_name
from reef.sampling.engine import Arm, EngineEndpoint, EngineSession, NoFreeSlotError, run_session, taking_turns
from reef.scenario import EvalSuite, Task

__all__ = ["GateConfig", "EngineEndpoint", "GateFaultError", "HarnessArms", "Weights", "bootstrap_ci",
           "evaluate_candidate", "gate_folders", "gate_weights"]
Outputs = dict[str, list[list[str]]]
ARMS = ("candidate", "head")


@dataclass(frozen=True)
class GateConfig:
    samples: int | None = None  # None: the scenario's eval.samples
    seed: int = 0  # of the bootstrap resampling (the replies' seeds are the scenario's eval.seed)
    confidence: float = 0.95
    min_delta: float = 0.0
    bootstrap: int = 2000
    probe_tokens: int = 8
    concurrency: int = 64  # engine requests in flight (each asks for `samples` replies)
    fault_retries: int = 2  # further tries of a sample request after an infrastructure fault
    fault_backoff_s: float = 1.0  # before the first retry; doubled before each next one
    min_valid_pairs: int = 16  # tasks the engine must answer in both arms (at most the suite's size)
    request_timeout_s: float = 600.0  # of one engine request; past it, the request has faulted


class GateFaultError(RuntimeError):
    """The engine faulted outside any one task (e.g. the probe) past its retries: nothing to judge."""


@dataclass
class EngineRun:
    """What the engine answered: replies per arm (a void task's are empty in both), the fault of
    each void task, the retries spent, and the candidate's probe reply."""

    outputs: Outputs
    probe: str = ""
    faults: dict[int, str] = dataclasses.field(default_factory=dict)
    retries: int = 0


@dataclass(frozen=True)
class Weights:
    """One arm of the gate: a full model folder, a LoRA adapter on it, and the name the engine
    already serves it under (the base model, a serving release's adapter), if any."""

    model: Path
    adapter: Path | None = None
    served: str | None = None

    @classmethod
    def of_folder(cls, path: Path | str) -> Weights:
        """A model folder, or a recipe's candidate folder (a LoRA runs on the base it names)."""
        from reef.core.paths import CANDIDATE_FILE

        path = Path(path)
        meta = json.loads((path / CANDIDATE_FILE).read_text()) if (path / CANDIDATE_FILE).is_file() else {}
        if meta.get("kind") == "lora":
            return cls(Path(meta["lineage"]["base_model"]), path)
        return cls(path)


@dataclass(frozen=True)
class HarnessArms:
    """The harness each arm's eval prompts are sent with (None: as the suite has them), and how."""

    candidate: Harness | None
    head: Harness | None
    inject: str = "system_prepend"

    def tasks(self, suite: EvalSuite) -> dict[str, list[Task]]:
        mode = "system_prepend" if self.inject == "off" else self.inject
        return {arm: [t if h is None else {**t, "messages": inject(list(t["messages"]), h, mode)} for t in suite.tasks]
                for arm, h in (("candidate", self.candidate), ("head", self.head))}


# --- sampling ----------------------------------------------------------------------------------


def _transformers_outputs(candidate: Weights, head: Weights, suite: EvalSuite, arm_tasks: dict[str, list[Task]],
                          samples: int, config: GateConfig, progress: bool) -> tuple[Outputs, str]:
    import torch
    from tqdm.auto import tqdm

    from reef.sampling.completion import texts
    from reef.sampling.episodes import run_episodes
    from reef.sampling.load import load_model
    from reef.sampling.transformers import TransformersSampler

    tools = [t.get("tools") for t in suite.tasks] if any(t.get("tools") for t in suite.tasks) else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model's ops are too small for a second thread to help
    outputs: Outputs = {}
    probe = ""
    loaded: dict[Weights, Any] = {}
    try:
        for arm, weights in tqdm([("candidate", candidate), ("head", head)], desc="gate", disable=not progress):
            if weights not in loaded:  # a harness candidate runs on the head's weights: load them once
                loaded = {weights: load_model(weights.model, weights.adapter)}
            sampler = TransformersSampler(*loaded[weights])
            if suite.environment is not None:  # multi-turn: the environment executes the tool calls
                got = run_episodes(sampler, arm_tasks[arm], suite.environment, suite.max_turns, samples,
                                   max_new_tokens=suite.max_new_tokens, temperature=suite.temperature, seed=suite.seed)
            else:
                prompts = [t["messages"] for t in arm_tasks[arm]]
                got = sampler.sample(prompts, samples, max_new_tokens=suite.max_new_tokens,
                                     temperature=suite.temperature, seed=suite.seed, tools=tools)
            outputs[arm] = texts(got)
            if arm == "candidate" and config.probe_tokens:
                probe = sampler.sample(suite.prompts[:1], 1, max_new_tokens=config.probe_tokens, temperature=0.0,
                                       seed=0)[0][0].text
    finally:
        torch.set_num_threads(threads)
    return outputs, probe


def _engine_outputs(engine: EngineEndpoint, candidate: Weights, head: Weights, suite: EvalSuite,
                    arm_tasks: dict[str, list[Task]], samples: int, config: GateConfig,
                    progress: bool) -> EngineRun:
    from tqdm.auto import tqdm

    async def body(session: EngineSession) -> EngineRun:
        names = dict(zip(("candidate", "head"), await session.prepare(
            [Arm(candidate.served, candidate.adapter), Arm(head.served, head.adapter)]), strict=True))
        bar = tqdm(total=2 * len(suite.tasks), desc="gate (engine)", disable=not progress)
        tries = [0]

        async def once(arm: str, i: int) -> list[str]:
            tries[0] += 1
            settings: dict[str, Any] = {"samples": samples, "max_tokens": suite.max_new_tokens,
                                        "temperature": suite.temperature, "seed": suite.seed + i}
            if suite.environment is not None:
                return await session.episodes(names[arm], dict(arm_tasks[arm][i]), suite.environment,
                                              suite.max_turns, **settings)
            return await session.sample(names[arm], dict(arm_tasks[arm][i]), **settings)

        async def one(arm: str, i: int) -> list[str] | Void:
            # A retry sends the same seed: it samples the replies the first try would have.
            got = await with_retries(lambda: once(arm, i), config.fault_retries, config.fault_backoff_s)
            bar.update(1)
            return got

        # Both arms interleaved, so the engine batches them together and stays busy.
        jobs = [(arm, i) for i in range(len(suite.tasks)) for arm in ("candidate", "head")]
        tasks = [asyncio.ensure_future(one(arm, i)) for arm, i in jobs]
        try:
            got = await asyncio.gather(*tasks)
        except BaseException:  # no request may outlive the adapters it runs on
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            bar.close()
        run = EngineRun({"candidate": [[] for _ in suite.tasks], "head": [[] for _ in suite.tasks]})
        for (arm, i), replies in zip(jobs, got, strict=True):
            if isinstance(replies, Void):
                run.faults.setdefault(i, replies.fault)
            else:
                run.outputs[arm][i] = replies
        for i in run.faults:  # out of both arms: one arm's replies alone pair with nothing
            run.outputs["candidate"][i], run.outputs["head"][i] = [], []
        if config.probe_tokens:
            # What the swap's canary request (temperature 0, seed 0, messages only) must reproduce.
            probe = await with_retries(lambda: session.weights.greedy(
                names["candidate"], list(suite.prompts[0]), config.probe_tokens), config.fault_retries,
                config.fault_backoff_s)
            if isinstance(probe, Void):
                raise GateFaultError(f"the probe request faulted {probe.attempts} times: {probe.fault}")
            run.probe = probe
        run.retries = tries[0] - len(jobs)
        return run

    return run_session(engine, config.concurrency, body, config.request_timeout_s)


# --- the comparison ----------------------------------------------------------------------------


def gate_weights(candidate: Weights, head: Weights, suite: EvalSuite, config: GateConfig | None = None, *,
                 engine: EngineEndpoint | None = None, head_label: str = "head", head_release_id: str | None = None,
                 data_dir: Path | str | None = None, progress: bool = True,
                 harnesses: HarnessArms | None = None) -> GateResult:
    """Compare two models on `suite`; raises on any error (evaluate_candidate turns that into a reject,
    or a void when it is an infrastructure fault).

    Through `engine` when the candidate is a LoRA (or a harness, with `harnesses`: both arms on the
    head's weights) and the head runs on the engine's base weights (`head.served` or an adapter);
    `data_dir` is where gates sharing the engine take turns. `harnesses`: the harness each arm's
    prompts are sent with (no probe then: a harness release loads no weights to prove)."""
    config = config or GateConfig()
    if harnesses is not None:
        config = dataclasses.replace(config, probe_tokens=0)
    started = time.monotonic()
    # Greedy replies to one prompt are all the same (and vLLM refuses n > 1 without sampling).
    samples = 1 if suite.temperature == 0 else config.samples or suite.samples
    arm_tasks = (harnesses.tasks(suite) if harnesses is not None
                 else {arm: list(suite.tasks) for arm in ARMS})
    note = ""
    backend: Literal["engine", "transformers"] = "transformers"
    run: EngineRun | None = None
    on_engine = candidate.adapter is not None or (harnesses is not None and candidate == head)
    if engine is not None and on_engine and (head.served or head.adapter):
        try:
            with taking_turns(Path(data_dir) if data_dir is not None else None):
                run = _engine_outputs(engine, candidate, head, suite, arm_tasks, samples, config, progress)
            backend = "engine"
        except NoFreeSlotError as exc:
            note = f" (engine: {exc}, so transformers sampled)"
    if run is None:
        run = EngineRun(*_transformers_outputs(candidate, head, suite, arm_tasks, samples, config, progress))
    outputs = run.outputs
    scored = {arm: score_replies(suite, outputs[arm]) for arm in outputs}
    per_task = {arm: scored[arm].per_task for arm in scored}
    unscored_per_task = {arm: scored[arm].unscored_per_task for arm in scored}
    outcomes = [PromptOutcome(
        messages=list(suite.prompts[i]), candidate_replies=outputs["candidate"][i], head_replies=outputs["head"][i],
        candidate_score=per_task["candidate"][i], head_score=per_task["head"][i],
        unscored=sum(unscored_per_task[arm][i] for arm in scored), fault=run.faults.get(i),
    ) for i in range(len(suite.tasks))]
    common = {"head_release_id": head_release_id, "samples_per_prompt": samples, "backend": backend,
              "void_pairs": len(run.faults), "fault_retries": run.retries, "per_prompt": outcomes}
    valid, needed = len(outcomes) - len(run.faults), min(config.min_valid_pairs, len(outcomes))
    if valid < needed:
        return GateResult(decision="void", reason=f"gate void: {valid} of {len(outcomes)} pairs valid, "
                          f"{needed} needed ({_faults(run.faults)}){note}",
                          seconds=round(time.monotonic() - started, 2), **common)
    unscored = sum(o.unscored for o in outcomes)
    paired = [o for o in outcomes if o.candidate_score is not None and o.head_score is not None]
    if not paired:
        raise ValueError(f"the reward scored no task in both arms ({unscored} replies unscored)")
    diffs = [o.candidate_score - o.head_score for o in paired]  # type: ignore[operator]
    low, high = bootstrap_ci(diffs, config.confidence, config.bootstrap, config.seed)
    n = len(diffs)
    delta = sum(diffs) / n
    selected = low > config.min_delta
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    sign_p = sign_test(wins, losses)
    cand_success = sum(o.candidate_score for o in paired) / n  # type: ignore[misc]
    head_success = sum(o.head_score for o in paired) / n  # type: ignore[misc]
    left_out = f"; {unscored} replies unscored, {valid - n} tasks left out" if unscored else ""
    void = f"; {len(run.faults)} pairs void ({_faults(run.faults)})" if run.faults else ""
    reason = (f"success {cand_success:.3f} vs {head_success:.3f} ({head_label}); delta {delta:+.3f}, "
              f"{config.confidence:.0%} CI [{low:+.3f}, {high:+.3f}] "
              f"{'lies' if selected else 'does not lie'} above {config.min_delta:+.3f}; "
              f"sign test {wins}-{losses} p={sign_p:.3g}{left_out}{void}{note}")
    return GateResult(
        decision="select" if selected else "reject", reason=reason,
        candidate_success=round(cand_success, 4), head_success=round(head_success, 4),
        delta=round(delta, 4), ci_low=round(low, 4), ci_high=round(high, 4), confidence=config.confidence,
        prompts=n, wins=wins, losses=losses, ties=n - wins - losses, unscored=unscored, sign_p=sign_p,
        probe=(Probe(messages=list(suite.prompts[0]), max_tokens=config.probe_tokens, text=run.probe)
               if config.probe_tokens else None),
        seconds=round(time.monotonic() - started, 2), **common,
    )


def _faults(faults: dict[int, str]) -> str:
    """`29 engine faults: ReadTimeout` / `3 engine faults: 2 HTTP 503, 1 ReadTimeout`."""
    kinds = Counter(faults.values())
    named = (next(iter(kinds)) if len(kinds) == 1
             else ", ".join(f"{count} {kind}" for kind, count in kinds.most_common()))
    return f"{len(faults)} engine faults: {named}" if faults else "no engine faults"


def gate_folders(candidate: Path | str, baseline: Path | str, scenario: str, config: GateConfig | None = None, *,
                 progress: bool = True) -> GateResult:
    """The gate on two folders, outside any release chain (the DVC evaluate stage, `reef recipe run`):
    a recipe's candidate folder vs. a model folder (transformers; raises on errors). A harness
    candidate folder is gated on `baseline`'s weights against no harness."""
    folder = Path(candidate)
    if _folder_kind(folder) == "harness":
        from reef.registry.artifacts import tree_files

        files = {p: (folder / p).read_text(encoding="utf-8") for p in tree_files(folder) if p not in _NOT_HARNESS}
        arms = HarnessArms(Harness("", files), None, declared_scenario(scenario).harness.inject)
        weights = Weights.of_folder(baseline)
        return gate_weights(weights, weights, suite_for(scenario), config, head_label=str(baseline),
                            progress=progress, harnesses=arms)
    return gate_weights(Weights.of_folder(candidate), Weights.of_folder(baseline), suite_for(scenario), config,
                        head_label=str(baseline), progress=progress)


_NOT_HARNESS = ("candidate.json", "eval.json")  # a candidate folder's metadata and `reef recipe run`'s metrics


def _folder_kind(folder: Path) -> str | None:
    meta = folder / "candidate.json"
    return json.loads(meta.read_text()).get("kind") if meta.is_file() else None


# --- a registered candidate against its scenario's head -------------------------------------------


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


def _engine_holds_base(data_dir: Path | str, base_content: str) -> bool:
    """Whether the engine runs the base weights: full weights are shared by every scenario, so a
    full-weight head anywhere means the engine may hold other weights than the base."""
    for scenario in sorted(p.parent.name for p in DataDir(data_dir).releases().glob("*/chain.jsonl")):
        head = ReleaseChain.for_data_dir(data_dir, scenario).head()
        if head is not None and head.kind == "full" and head.content_id != base_content:
            return False
    return True


def _head_weights(store: ArtifactStore, head: Release, r0: Release, engine: EngineEndpoint | None) -> Weights:
    model, adapter = model_folders(store, head.content_id)
    if engine is None:
        return Weights(model, adapter)
    if head.content_id == r0.content_id:
        return Weights(model, None, engine.model)
    return Weights(model, adapter, adapter_name(head.content_id) if adapter is not None else None)


def evaluate_candidate(data_dir: Path | str, candidate_id: str, config: GateConfig | None = None, *,
                       base_model: str | None = None, progress: bool = True,
                       engine: EngineEndpoint | None = None) -> GateResult:
    """Gate a registered candidate against its scenario's current head and record the decision.

    `engine` is the serving vLLM (its OpenAI server, not the gateway); without it, or for
    full-weight candidates, transformers samples. `base_model` creates the scenario's r0 when the
    scenario has no chain yet (default: the base the candidate was trained on)."""
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
        if engine is not None and not _engine_holds_base(data_dir, r0.content_id):
            engine = None
        suite = suite_for(view.scenario, engine.base_url if engine else None, engine.model if engine else None)
        head_weights = _head_weights(store, head, r0, engine)
        if view.kind == "harness":  # same weights in both arms; the prompts carry each arm's harness
            arms = HarnessArms(load_harness(store, view.candidate_id),
                               load_harness(store, head.harness_id) if head.harness_id else None,
                               declared_scenario(view.scenario).harness.inject)
            result = gate_weights(head_weights, head_weights, suite, config, engine=engine,
                                  head_label=head.release_id, head_release_id=head.release_id, data_dir=data_dir,
                                  progress=progress, harnesses=arms)
        else:
            _check_same_base(store, view.candidate_id, r0)
            result = gate_weights(Weights(*model_folders(store, view.candidate_id)), head_weights, suite, config,
                                  engine=engine, head_label=head.release_id, head_release_id=head.release_id,
                                  data_dir=data_dir, progress=progress)
    except Exception as exc:  # noqa: BLE001 - the gate fails closed: any error rejects, but a fault judges nothing
        fault = fault_of(exc)
        void = fault is not None or isinstance(exc, GateFaultError)
        reason = (f"gate error: {exc}" if not void else f"gate void: {exc}" if fault is None
                  else f"gate void: engine fault ({fault}): {exc}")
        result = GateResult(decision="void" if void else "reject", reason=reason,
                            head_release_id=head.release_id if head else None)
    registry.record_gate(view.candidate_id, result)
    return result


def engine_of(url: str | None, model: str | None) -> EngineEndpoint | None:
    """`--engine-url/--engine-model` as a EngineEndpoint (None when no URL was given)."""
    if url is None:
        return None
    if not model:
        raise ValueError("--engine-url needs --engine-model (the base model's served name)")
    return EngineEndpoint(url, model)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-url", default=None,
                        help="the serving vLLM's OpenAI server (not the gateway); unset: transformers samples")
    parser.add_argument("--engine-model", default=None, help="the base model's name on that server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reef.gate.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("candidate")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--samples", type=int, default=GateConfig.samples)
    parser.add_argument("--min-delta", type=float, default=GateConfig.min_delta)
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    try:
        engine = engine_of(args.engine_url, args.engine_model)
    except ValueError as exc:
        parser.error(str(exc))
    result = evaluate_candidate(args.data_dir, args.candidate, GateConfig(samples=args.samples,
                                                                          min_delta=args.min_delta), engine=engine)
    print(f"{result.decision}: {result.reason}")
    return 0 if result.decision == "select" else 1


if __name__ == "__main__":
    raise SystemExit(main())
