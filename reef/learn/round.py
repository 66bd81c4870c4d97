"""One learning round: snapshot -> train -> register -> gate.

The only round orchestrator: the server's learner (in its own process, `python -m reef.learn.round
--request request.json --out result.json`), `reef learn --once`, `reef recipe run` and the DVC
stages (each stage one step of it) all run these functions. What a round does is planned apart,
in reef.learn.plan (a `RoundPlan`), which is all the server imports; this module pulls in the trainers.

Continuing from the head: a full-weight round trains the head's weights (the weights that produced
the experience), so each release builds on the last; a LoRA round on the base model continues
from the head's adapter when the head is a LoRA on that base (`init_adapter`). A LoRA is only ever
trained on the base model, the only weights an adapter can be served on. Whether a selected
candidate is released is the server's decision (policy), not the round's.

A plan that carries thresholds (`wait_for`, the learner's) is checked again here on what the round
finds: below them it returns `waiting` with the reason instead of starting.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from reef.config import CONFIG_FILE_ENV, GateSettings
from reef.config.learner import AccelerateSettings
from reef.core.crashpoints import crash_point
from reef.gate.evaluate import evaluate_candidate
from reef.gate.warm import warm_head
from reef.learn.launch import launch_training, launches
from reef.learn.pending import selection
from reef.learn.plan import RoundPlan, RoundRequest, RoundResult
from reef.learn.round_log import TRANSITIONS, Round, RoundBusyError, RoundLog
from reef.recipe import ledger
from reef.recipe.base import Recipe
from reef.recipe.snapshot import EmptySnapshotError, Snapshot
from reef.registry.artifacts import ArtifactStore
from reef.registry.base_model import base_of, ensure_scenario
from reef.registry.candidates import GateResult, register_candidate
from reef.registry.harness import Harness, load_harness
from reef.registry.schema import Candidate
from reef.registry.state import open_chain
from reef.sampling.engine import EngineEndpoint


class RoundResumeError(RuntimeError):
    """An interrupted round's files do not say how far it got (someone removed its candidate)."""


# --- the steps ------------------------------------------------------------------------------


def from_head(plan: RoundPlan) -> RoundPlan:
    """The plan with the head to continue from: its weights (full) or its adapter (LoRA on the base)."""
    if not plan.continue_from_head:
        return plan
    store = ArtifactStore.for_data_dir(plan.data_dir)
    chain, _ = ensure_scenario(plan.data_dir, plan.scenario, plan.base_model, store)
    head = chain.head()
    r0 = chain.releases()[0]
    if head is None or head.release_id == r0.release_id:
        return plan
    lora = plan.params.get("kind") == "lora"
    if head.kind == "full" and not lora:
        return plan.model_copy(update={"base_model": str(store.verify(head.content_id).resolve())})
    if head.kind == "lora" and lora and base_of(store, store.get(head.content_id)).content_id == r0.content_id:
        adapter = str(store.verify(head.content_id).resolve())
        return plan.model_copy(update={"params": {**plan.params, "init_adapter": adapter}})
    return plan


def served_harness(data_dir: Path | str, recipe: Recipe) -> Harness | None:
    """The head's harness where the gateway injects it into served prompts (`harness.inject` not off)."""
    head = open_chain(data_dir, recipe.config.scenario).head()
    if head is None or head.harness_id is None or recipe.scenario().harness.inject == "off":
        return None
    return load_harness(ArtifactStore.for_data_dir(data_dir), head.harness_id)


def take_snapshot(plan: RoundPlan, recipe: Recipe | None = None) -> Snapshot:
    # An empty snapshot is written, not refused: "nothing new" is the train step's clear failure
    # (EmptySnapshotError), and a recipe that makes its own samples trains on an empty one.
    spec = (recipe or plan.load_recipe()).experience()
    return Snapshot.create(plan.scenario, plan.experience_dir, spec, root=plan.snapshot_root, dest=plan.snapshot_dir,
                           ledger_root=plan.ledger_root, allow_empty=True)


def train(plan: RoundPlan, snapshot: Snapshot | None = None, *, progress: bool = True,
          engine: EngineEndpoint | None = None, launcher: AccelerateSettings | None = None) -> Candidate:
    """Run the recipe on the snapshot; `engine` (the serving vLLM) is there for recipes that ask a model;
    `launcher`: through accelerate, several processes (reef.learn.launch), where the recipe allows."""
    plan = from_head(plan)
    if snapshot is None:
        if plan.snapshot_dir is None:
            raise ValueError("train needs the snapshot, or a plan with a fixed snapshot_dir")
        snapshot = Snapshot.open(plan.snapshot_dir)
    recipe = plan.load_recipe()
    if launcher is not None and launches(recipe):
        return launch_training(plan, snapshot, launcher)
    recipe.engine = engine
    recipe.served_harness = served_harness(plan.data_dir, recipe)
    return recipe.run(snapshot, out_root=plan.candidate_root, out_dir=plan.candidate_dir, progress=progress)


def gate(plan: RoundPlan, candidate_path: Path | str, settings: GateSettings | None = None, *,
         engine: EngineEndpoint | None = None, progress: bool = True) -> tuple[str, GateResult]:
    """Register the candidate and gate it against the scenario's head: (candidate id, GateResult).
    `engine`: the serving vLLM (not the gateway), which samples a LoRA candidate's replies."""
    view = register_candidate(plan.data_dir, candidate_path)
    return view.candidate_id, evaluate_candidate(plan.data_dir, view.candidate_id, settings, progress=progress,
                                                 engine=engine)


def run_round(plan: RoundPlan, settings: GateSettings | None = None, *, evaluate: bool = True,
              engine: EngineEndpoint | None = None, progress: bool = True,
              launcher: AccelerateSettings | None = None) -> RoundResult:
    """snapshot -> train -> register -> gate, each step a transition of the scenario's round log
    (reef.learn.round_log), gated with `settings` (None: the gate's defaults). A round that an earlier
    process left open is closed first: resumed from its last durable step (its result is returned) or
    abandoned (then a new round runs). A plan with `wait_for` starts no round below it (`waiting`)."""
    log = RoundLog.for_data_dir(plan.data_dir, plan.scenario)
    with log.lock():
        resumed = resume(plan, log, settings, evaluate=evaluate, engine=engine, progress=progress)
        if resumed is not None:
            return resumed
        recipe = plan.load_recipe()
        records, counts, _ = selection(plan, recipe, with_signal=plan.wait_for is not None)
        waiting = {"records": records, **counts}
        short = plan.wait_for.shortfall(waiting) if plan.wait_for is not None else None
        if short is not None:  # the learner counted enough, but not this much is here now: start nothing
            return RoundResult(status="waiting", scenario=plan.scenario, pending=waiting, reason=short)
        if records == 0 and recipe.needs_experience:
            return RoundResult(status="nothing_new", scenario=plan.scenario, pending=waiting)
        rnd = log.begin(plan.recipe)
        with _failing(log, rnd):
            snap = take_snapshot(plan, recipe)
            log.append(rnd, "snapshotted", snapshot_id=snap.id, snapshot_hash=snap.hash, records=len(snap.record_ids))
            candidate = train(plan, snap, progress=progress, engine=engine, launcher=launcher)
            log.append(rnd, "trained", candidate=candidate.id, candidate_path=str(candidate.path))
            crash_point("round:trained")
            candidate_id, result = _register_and_gate(plan, log, rnd, settings, evaluate=evaluate, engine=engine,
                                                      progress=progress)
        return RoundResult(status="trained", scenario=plan.scenario, round=rnd.round_id, round_state=rnd.state,
                           pending=waiting, snapshot=snap.id, candidate=candidate,
                           metrics=candidate.metrics, candidate_id=candidate_id, gate=result)


def resume(plan: RoundPlan, log: RoundLog, settings: GateSettings | None = None, *, evaluate: bool = True,
           engine: EngineEndpoint | None = None, progress: bool = True) -> RoundResult | None:
    """Close the round an earlier process left open (killed mid-round): the resumed round's result,
    or None when there was none to resume (nothing open, or it was abandoned: nothing was consumed)."""
    rnd = log.open_round()
    if rnd is None:
        return None
    if rnd.state in ("planned", "snapshotted"):
        try:
            path = _trained_on(plan, rnd.snapshot_hash)
        except RoundResumeError as exc:
            log.append(rnd, "failed", resumed=True, reason=str(exc))
            return None
        if path is None:  # killed before training finished: the ledger holds none of its records
            log.append(rnd, "abandoned", resumed=True, reason=f"interrupted while {rnd.state}; it consumed nothing, "
                       "so its records wait for the next round")
            _remove_staging(plan)
            return None
        # Killed after the ledger took the records but before `trained` was written: the candidate is whole.
        log.append(rnd, "trained", resumed=True, candidate=Candidate.read(path).id, candidate_path=str(path))
    if rnd.state == "gated":  # selected; releasing it is the server's decision (reef.learn.learner)
        log.append(rnd, "done", resumed=True, reason="selected by the gate; release it with `reef release`")
        return None
    assert rnd.candidate_path is not None
    resumed_from = rnd.state
    candidate = Candidate.read(rnd.candidate_path)
    with _failing(log, rnd):
        candidate_id, result = _register_and_gate(plan, log, rnd, settings, evaluate=evaluate, engine=engine,
                                                  progress=progress, resumed=True)
    return RoundResult(status="trained", scenario=plan.scenario, round=rnd.round_id, round_state=rnd.state,
                       resumed_from=resumed_from, snapshot=rnd.snapshot_id, candidate=candidate,
                       metrics=candidate.metrics, candidate_id=candidate_id, gate=result)


def _register_and_gate(plan: RoundPlan, log: RoundLog, rnd: Round, settings: GateSettings | None, *,
                       evaluate: bool, engine: EngineEndpoint | None, progress: bool,
                       resumed: bool = False) -> tuple[str | None, GateResult | None]:
    """The steps after `trained` (or after `registered`, when resuming one): (candidate id, the gate's
    result without its per-prompt outputs), both None when the round is not gated."""
    if not evaluate:
        log.append(rnd, "done", resumed=resumed, reason="not gated in this round")
        return None, None
    if rnd.state == "trained":
        assert rnd.candidate_path is not None
        view = register_candidate(plan.data_dir, rnd.candidate_path)
        log.append(rnd, "registered", resumed=resumed, candidate_id=view.candidate_id)
    assert rnd.candidate_id is not None
    result = evaluate_candidate(plan.data_dir, rnd.candidate_id, settings, progress=progress, engine=engine)
    log.append(rnd, "gated", resumed=resumed, decision=result.decision, reason=result.reason)
    if result.decision == "void":
        # An engine fault is no judgement: the candidate stays registered (state gate_void) and is
        # neither released nor rejected; gating it again (the learner, `reef gate`) judges it.
        log.append(rnd, "done", resumed=resumed, reason=f"{result.reason}; not judged: the learner gates candidate "
                   f"{rnd.candidate_id} again (learner.gate_retries), or `reef gate` it")
    elif result.decision != "select":
        log.append(rnd, "rejected", resumed=resumed, reason=result.reason)
    return rnd.candidate_id, result.model_copy(update={"per_prompt": None})


def _trained_on(plan: RoundPlan, snapshot_hash: str | None) -> Path | None:
    """The candidate folder trained on this snapshot, when the ledger says its training finished."""
    if snapshot_hash is None:
        return None
    rows = ledger.consumed(plan.ledger_root, plan.scenario).filter(pl.col("snapshot_hash") == snapshot_hash)
    if rows.height == 0:
        return None
    folder_id = rows["candidate_id"][0]
    path = plan.candidate_dir or plan.candidate_root / folder_id
    found = Candidate.read_if_any(path)
    if found is None or found.lineage.snapshot_hash != snapshot_hash:
        raise RoundResumeError(f"the ledger says snapshot {snapshot_hash[:12]} trained {folder_id}, but {path} "
                               "does not hold a candidate trained on it")
    return path


def _remove_staging(plan: RoundPlan) -> None:
    """The half-written folders a killed training left beside its fixed candidate folder."""
    if plan.candidate_dir is None:
        return
    for stale in plan.candidate_dir.parent.glob(f".{plan.candidate_dir.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def _failing(log: RoundLog, rnd: Round) -> Iterator[None]:
    """An error in a step ends the round as `failed`, with the error as its reason."""
    try:
        yield
    except Exception as exc:
        if TRANSITIONS.allowed(rnd.state, "failed"):
            log.append(rnd, "failed", reason=f"{type(exc).__name__}: {exc}"[:500])
        raise


def regate(plan: RoundPlan, candidate_id: str, settings: GateSettings | None = None, *,
           engine: EngineEndpoint | None = None, progress: bool = True) -> RoundResult:
    """Gate a registered candidate again (the learner's retry of a void gate): no snapshot, no
    training; the candidate register records the result like any gate's. It holds the scenario's
    round lock, so it never gates beside a round of the same scenario."""
    with RoundLog.for_data_dir(plan.data_dir, plan.scenario).lock():
        result = evaluate_candidate(plan.data_dir, candidate_id, settings, progress=progress, engine=engine)
    return RoundResult(status="regated", scenario=plan.scenario, candidate_id=candidate_id,
                       gate=result.model_copy(update={"per_prompt": None}))


def run_request(request: RoundRequest) -> RoundResult:
    """The round a `RoundRequest` asks for, as the round process runs it: gated, quietly; a round
    another process runs, or a snapshot with nothing to learn from, is a result, not an error.
    With `regate`, only that candidate's gate again; with `warm`, only the next gate's head replies."""
    scenario = request.plan.scenario
    try:
        if request.warm:
            if request.engine is None:
                raise ValueError("warming the next gate needs the engine")
            warmed = warm_head(request.plan.data_dir, scenario, request.gate, request.engine)
            return RoundResult(status="warmed", scenario=scenario, reason=warmed.skipped,
                               metrics={**warmed.model_dump(mode="json"), "complete": warmed.complete})
        if request.regate is not None:
            return regate(request.plan, request.regate, request.gate, engine=request.engine, progress=False)
        return run_round(request.plan, request.gate, engine=request.engine, progress=False,
                         launcher=request.launcher)
    except EmptySnapshotError as exc:
        return RoundResult(status="nothing_new", scenario=scenario, reason=str(exc))
    except RoundBusyError as exc:
        return RoundResult(status="busy", scenario=scenario, reason=str(exc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reef.learn.round", description=__doc__.splitlines()[0])
    parser.add_argument("--request", type=Path, required=True, help="a RoundRequest as JSON (reef.learn.plan)")
    parser.add_argument("--out", type=Path, required=True, help="where the RoundResult is written, as JSON")
    args = parser.parse_args(argv)
    request = RoundRequest.model_validate_json(args.request.read_text())
    if request.config_file is not None:
        # What reef.config.resolve() reads in this process: the gate and the recipe see the scenario
        # (its eval suite, its rewards) as the server declared it.
        os.environ[CONFIG_FILE_ENV] = str(request.config_file)
    result = run_request(request)
    args.out.write_text(result.model_dump_json(indent=2))
    print(json.dumps(result.model_dump(mode="json", include={"scenario", "status", "candidate_id"})), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
