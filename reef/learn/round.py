"""One learning round: snapshot -> train -> register -> gate. The only round orchestrator: the
server's learner (in its own process, `python -m reef.learn.round --plan plan.json`), `reef learn
--once`, `reef recipe run` and the DVC stages (each stage one step of it) all run these functions.

A `RoundPlan` says what a round does: which scenario, which recipe with which params, where the
experience is read from, where the snapshot and candidate go, and whether training continues from
the scenario's head. `plan_round` builds it from a recipe setting (a `RecipeSpec`): serve.yaml's
(`plan_for_scenario`, the learner) or params.yaml's `train` (reef.learn.pipeline, the DVC stages and the CLI).

Continuing from the head: a full-weight round trains the head's weights (the weights that produced
the experience), so each release builds on the last; a LoRA round on the base model continues
from the head's adapter when the head is a LoRA on that base (`init_adapter`). A LoRA is only ever
trained on the base model, the only weights an adapter can be served on. Whether a selected
candidate is released is the server's decision (policy), not the round's.

The learner starts a round only on enough signal (`Thresholds`, from `learner.min_*` and the recipe
setting's, `thresholds`): eligible new records (what the snapshot would take), and of the eligible
ones rewarded and unrewarded records (`signal`); a plan that carries them (`wait_for`) is checked
again by the round itself, which returns `waiting` with the reason instead of starting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from reef.core.crashpoints import crash_point
from reef.core.paths import DEFAULT_DATA_DIR, DataDir

if TYPE_CHECKING:
    import polars as pl

    from reef.config import GateSettings, ServeConfig
    from reef.learn.round_log import Round, RoundLog
    from reef.recipe.base import Recipe
    from reef.recipe.snapshot import Snapshot
    from reef.registry.schema import Candidate
    from reef.sampling.engine import EngineEndpoint
    from reef.scenario.schema import RecipeSpec


COUNTS = ("rewarded", "unrewarded", "records")  # the signal a round waits for, in the order a reason names it


class Thresholds(BaseModel):
    """What a learner round waits for: eligible new records (those its snapshot would take, were it
    not capped by `batch_size`: `eligible` in the counts) and, of the eligible ones, rewarded and
    unrewarded records (`signal`). 0: not waited for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    records: int = Field(default=1, ge=1)
    rewarded: int = Field(default=0, ge=0)
    unrewarded: int = Field(default=0, ge=0)

    def shortfall(self, counts: Mapping[str, int]) -> str | None:
        """None when every count reached its threshold; else why a round waits, every count named,
        e.g. `waiting: 3 of 4 rewarded, 12 of 4 unrewarded, 15 of 16 records`."""
        have = {**counts, "records": counts.get("eligible", counts.get("records", 0))}
        wanted = [(name, getattr(self, name)) for name in COUNTS if getattr(self, name) > 0]
        if all(have.get(name, 0) >= n for name, n in wanted):
            return None
        return "waiting: " + ", ".join(f"{have.get(name, 0)} of {n} {name}" for name, n in wanted)


class RoundPlan(BaseModel):
    """What one round does; JSON, so the learner can hand it to the round's process."""

    model_config = ConfigDict(extra="forbid")

    scenario: str
    recipe: str = Field(description="a built-in name or module:Class")
    params: dict[str, Any] = Field(default_factory=dict, description="the recipe config's fields")
    base_model: str = "data/models/tiny"
    experience_dir: Path = Field(default=DEFAULT_DATA_DIR, description="where the scenario's experience is read")
    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="releases, candidates register and artifacts")
    ledger_root: Path = DataDir().ledger
    snapshot_dir: Path | None = Field(default=None, description="a fixed folder; None: content-hashed")
    snapshot_root: Path = DataDir().snapshots()
    candidate_dir: Path | None = Field(default=None, description="a fixed folder; None: <candidate_root>/<id>")
    candidate_root: Path = DataDir().candidates()
    continue_from_head: bool = True
    import_dirs: list[Path] = Field(default_factory=list, description="folders user recipe modules live in")
    wait_for: Thresholds | None = Field(default=None, description="the round starts only on this much signal "
                                        "(the learner's); None: on any eligible record")

    def recipe_params(self) -> dict[str, Any]:
        return {"base_model": self.base_model, **self.params, "scenario": self.scenario}

    def load_recipe(self) -> Recipe:
        from reef.recipe.loading import load_recipe

        return load_recipe(self.recipe, self.recipe_params(), extra=self.import_dirs)


class RoundResumeError(RuntimeError):
    """An interrupted round's files do not say how far it got (someone removed its candidate)."""


def plan_round(scenario: str, spec: RecipeSpec, *, base_model: str, data_dir: Path, experience_dir: Path | None = None,
               ledger_root: Path | None = None, fixed: bool = True, continue_from_head: bool = True,
               import_dirs: list[Path] | None = None) -> RoundPlan:
    """The round of `spec` for `scenario`; the one planner, for the learner and the pipeline alike.
    Its folders live in `data_dir`: `snapshots/<s>/` and `candidates/<s>/` when `fixed`, else
    content-hashed ones beside them; the experience is read from `experience_dir` (default: `data_dir`)
    and consumed ids kept in `ledger_root` (default: `ledger/`). `base_model` unless the spec names one."""
    params = spec.recipe_params()
    base = str(params.pop("base_model", None) or base_model)
    layout = DataDir(data_dir)
    return RoundPlan(
        scenario=scenario, recipe=spec.recipe, params=params, base_model=base,
        experience_dir=experience_dir or data_dir, data_dir=data_dir, ledger_root=ledger_root or layout.ledger,
        snapshot_dir=layout.snapshots(scenario) if fixed else None, snapshot_root=layout.snapshots(),
        candidate_dir=layout.candidates(scenario) if fixed else None, candidate_root=layout.candidates(),
        continue_from_head=continue_from_head, import_dirs=import_dirs or [],
    )


def plan_for_scenario(config: ServeConfig, scenario: str) -> RoundPlan | None:
    """The learner's round for a scenario declared in serve.yaml (or by a package); None without a recipe.
    Everything lives in the server's data dir; a user's recipe module may sit next to serve.yaml."""
    spec = config.scenario(scenario).recipe_spec(config.recipes)
    if spec is None:
        return None
    dirs = [config.config_file.parent] if config.config_file else []
    return plan_round(scenario, spec, base_model=config.model_path, data_dir=Path(config.data_dir).resolve(),
                      import_dirs=dirs)


def thresholds(config: ServeConfig, scenario: str, recipe: Recipe | None = None) -> Thresholds:
    """What the learner's round for `scenario` waits for: each count's recipe setting (`min_records`,
    `min_rewarded`, `min_unrewarded` of `recipes.<name>`), else the learner's, for the counts the
    recipe learns from (`Recipe.waits_for`; a count it does not is 0 unless its setting names it)."""
    spec = config.scenario(scenario).recipe_spec(config.recipes)
    waits = recipe.waits_for if recipe is not None else frozenset(COUNTS)

    def pick(name: str) -> int:
        own: int | None = getattr(spec, f"min_{name}") if spec is not None else None
        if own is not None:
            return own
        return int(getattr(config.learner, f"min_{name}")) if name in waits or name == "records" else 0

    return Thresholds(records=pick("records"), rewarded=pick("rewarded"), unrewarded=pick("unrewarded"))


def min_records(config: ServeConfig, scenario: str) -> int:
    """Eligible records that start a learner round: the recipe's `min_records`, else the learner's."""
    return thresholds(config, scenario).records


# --- the steps ------------------------------------------------------------------------------


def from_head(plan: RoundPlan) -> RoundPlan:
    """The plan with the head to continue from: its weights (full) or its adapter (LoRA on the base)."""
    if not plan.continue_from_head:
        return plan
    from reef.registry.artifacts import ArtifactStore
    from reef.registry.base_model import base_of, ensure_scenario

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


def pending(plan: RoundPlan, recipe: Recipe | None = None) -> dict[str, int]:
    """How many records the next snapshot would take, why the others are left out, how many are
    eligible (whatever one round's `batch_size` takes) and how many of those are rewarded and
    unrewarded (`signal`)."""
    records, counts, _ = selection(plan, recipe, with_signal=True)
    return {"records": records, **counts}


def selection(plan: RoundPlan, recipe: Recipe | None = None, *,
              with_signal: bool = False) -> tuple[int, dict[str, int], str]:
    """What a snapshot would hold now, without writing anything: (records, counts, content hash);
    `with_signal`: the counts include `eligible`, `rewarded` and `unrewarded` (`signal`)."""
    from reef.experience import load
    from reef.recipe import ledger
    from reef.recipe.snapshot import content_hash, select

    recipe = recipe or plan.load_recipe()
    spec = recipe.experience()
    taken = set(ledger.consumed(plan.ledger_root, plan.scenario)["record_id"].to_list())
    experience = load(plan.scenario, plan.experience_dir).collect()
    frame, counts = select(experience, spec, taken)
    if with_signal:
        counts.update(signal(experience, recipe, taken, frame))
    return frame.height, counts, content_hash(frame, spec)


def signal(experience: pl.DataFrame, recipe: Recipe, taken: set[str],
           selected: pl.DataFrame | None = None) -> dict[str, int]:
    """What waits for the recipe, whatever one round takes: `eligible`, the new records its spec
    selects, not capped by `batch_size`; and of the new records it could learn from (unconsumed,
    trainable and reported, not cut by its `min_score` either) how many are `rewarded` (at least
    `recipe.success_threshold()`, or above 0 when it is None) and `unrewarded` (below it).
    `selected`: the spec's own selection, reused where it is the same."""
    import polars as pl

    from reef.recipe.snapshot import select

    spec = recipe.experience()
    # batch_size 0: a recipe that makes its own samples takes no records, however many wait.
    uncapped = dataclasses.replace(spec, batch_size=None) if spec.batch_size else spec
    eligible = selected if selected is not None and uncapped == spec else select(experience, uncapped, taken)[0]
    wide = dataclasses.replace(uncapped, min_score=None, needs_reports=True)
    frame = eligible if wide == uncapped else select(experience, wide, taken)[0]
    reported = frame.filter(pl.col("score").is_not_null())
    threshold = recipe.success_threshold()
    good = pl.col("score") >= threshold if threshold is not None else pl.col("score") > 0
    if spec.corrections:  # a correction is a target to learn from, however low the score
        good = good | pl.col("correction").is_not_null()
    rewarded = reported.filter(good).height
    return {"eligible": eligible.height, "rewarded": rewarded, "unrewarded": reported.height - rewarded}


def take_snapshot(plan: RoundPlan, recipe: Recipe | None = None) -> Snapshot:
    # An empty snapshot is written, not refused: "nothing new" is the train step's clear failure
    # (EmptySnapshotError), and a recipe that makes its own samples trains on an empty one.
    from reef.recipe.snapshot import Snapshot

    spec = (recipe or plan.load_recipe()).experience()
    return Snapshot.create(plan.scenario, plan.experience_dir, spec, root=plan.snapshot_root, dest=plan.snapshot_dir,
                           ledger_root=plan.ledger_root, allow_empty=True)


def train(plan: RoundPlan, snapshot: Snapshot | None = None, *, progress: bool = True,
          engine: EngineEndpoint | None = None) -> Candidate:
    """Run the recipe on the snapshot; `engine` (the serving vLLM) is there for recipes that ask a model."""
    from reef.recipe.snapshot import Snapshot

    plan = from_head(plan)
    if snapshot is None:
        if plan.snapshot_dir is None:
            raise ValueError("train needs the snapshot, or a plan with a fixed snapshot_dir")
        snapshot = Snapshot.open(plan.snapshot_dir)
    recipe = plan.load_recipe()
    recipe.engine = engine
    return recipe.run(snapshot, out_root=plan.candidate_root, out_dir=plan.candidate_dir, progress=progress)


def gate(plan: RoundPlan, candidate_path: Path | str, gate_config: GateSettings | None = None, *,
         engine: EngineEndpoint | None = None, progress: bool = True) -> tuple[str, Any]:
    """Register the candidate and gate it against the scenario's head: (candidate id, GateResult).
    `engine`: the serving vLLM (not the gateway), which samples a LoRA candidate's replies."""
    from reef.gate.evaluate import evaluate_candidate
    from reef.registry.candidates import register_candidate

    view = register_candidate(plan.data_dir, candidate_path)
    return view.candidate_id, evaluate_candidate(plan.data_dir, view.candidate_id, gate_config, progress=progress,
                                                 engine=engine)


def run_round(plan: RoundPlan, gate_config: GateSettings | None = None, *, evaluate: bool = True,
              engine: EngineEndpoint | None = None, progress: bool = True) -> dict[str, Any]:
    """snapshot -> train -> register -> gate, each step a transition of the scenario's round log
    (reef.learn.round_log). A round that an earlier process left open is closed first: resumed from
    its last durable step (its result is returned) or abandoned (then a new round runs).
    A plan with `wait_for` starts no round below it: {"status": "waiting", "reason", "pending"}.
    {"status": "trained" | "nothing_new", "round", "round_state", "pending": counts, "snapshot",
    "candidate" (candidate.json), "candidate_id", "metrics", "gate" (without per-prompt outputs)}."""
    from reef.learn.round_log import RoundLog

    log = RoundLog.for_data_dir(plan.data_dir, plan.scenario)
    with log.lock():
        resumed = resume(plan, log, gate_config, evaluate=evaluate, engine=engine, progress=progress)
        if resumed is not None:
            return resumed
        recipe = plan.load_recipe()
        records, counts, _ = selection(plan, recipe, with_signal=plan.wait_for is not None)
        waiting = {"records": records, **counts}
        short = plan.wait_for.shortfall(waiting) if plan.wait_for is not None else None
        if short is not None:  # the learner counted enough, but not this much is here now: start nothing
            return {"status": "waiting", "scenario": plan.scenario, "pending": waiting, "reason": short}
        if records == 0 and recipe.needs_experience:
            return {"status": "nothing_new", "scenario": plan.scenario, "pending": waiting}
        rnd = log.begin(plan.recipe)
        with _failing(log, rnd):
            snap = take_snapshot(plan, recipe)
            log.append(rnd, "snapshotted", snapshot_id=snap.id, snapshot_hash=snap.hash, records=len(snap.record_ids))
            candidate = train(plan, snap, progress=progress, engine=engine)
            log.append(rnd, "trained", candidate=candidate.id, candidate_path=str(candidate.path))
            crash_point("round:trained")
            out: dict[str, Any] = {"status": "trained", "scenario": plan.scenario, "round": rnd.round_id,
                                   "pending": waiting, "snapshot": snap.id, "candidate": candidate.to_json(),
                                   "metrics": candidate.metrics}
            out.update(_register_and_gate(plan, log, rnd, gate_config, evaluate=evaluate, engine=engine,
                                          progress=progress))
        return {**out, "round_state": rnd.state}


def resume(plan: RoundPlan, log: RoundLog, gate_config: GateSettings | None = None, *, evaluate: bool = True,
           engine: EngineEndpoint | None = None, progress: bool = True) -> dict[str, Any] | None:
    """Close the round an earlier process left open (killed mid-round): the resumed round's result,
    or None when there was none to resume (nothing open, or it was abandoned: nothing was consumed)."""
    from reef.registry.schema import Candidate

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
    candidate = Candidate.read(rnd.candidate_path)
    out: dict[str, Any] = {"status": "trained", "scenario": plan.scenario, "round": rnd.round_id,
                           "resumed_from": rnd.state, "snapshot": rnd.snapshot_id, "candidate": candidate.to_json(),
                           "metrics": candidate.metrics}
    with _failing(log, rnd):
        out.update(_register_and_gate(plan, log, rnd, gate_config, evaluate=evaluate, engine=engine,
                                      progress=progress, resumed=True))
    return {**out, "round_state": rnd.state}


def _register_and_gate(plan: RoundPlan, log: RoundLog, rnd: Round, gate_config: GateSettings | None, *,
                       evaluate: bool, engine: EngineEndpoint | None, progress: bool,
                       resumed: bool = False) -> dict[str, Any]:
    """The steps after `trained` (or after `registered`, when resuming one)."""
    from reef.gate.evaluate import evaluate_candidate
    from reef.registry.candidates import register_candidate

    if not evaluate:
        log.append(rnd, "done", resumed=resumed, reason="not gated in this round")
        return {}
    if rnd.state == "trained":
        assert rnd.candidate_path is not None
        view = register_candidate(plan.data_dir, rnd.candidate_path)
        log.append(rnd, "registered", resumed=resumed, candidate_id=view.candidate_id)
    assert rnd.candidate_id is not None
    result = evaluate_candidate(plan.data_dir, rnd.candidate_id, gate_config, progress=progress, engine=engine)
    log.append(rnd, "gated", resumed=resumed, decision=result.decision, reason=result.reason)
    if result.decision == "void":
        # An engine fault is no judgement: the candidate stays registered (state gate_void) and is
        # neither released nor rejected; gating it again (`reef gate`) judges it.
        log.append(rnd, "done", resumed=resumed, reason=f"{result.reason}; not judged: gate candidate "
                   f"{rnd.candidate_id} again with `reef gate`")
    elif result.decision != "select":
        log.append(rnd, "rejected", resumed=resumed, reason=result.reason)
    return {"candidate_id": rnd.candidate_id, "gate": result.model_dump(mode="json", exclude={"per_prompt"})}


def _trained_on(plan: RoundPlan, snapshot_hash: str | None) -> Path | None:
    """The candidate folder trained on this snapshot, when the ledger says its training finished."""
    import polars as pl

    from reef.recipe import ledger
    from reef.registry.schema import Candidate

    if snapshot_hash is None:
        return None
    rows = ledger.consumed(plan.ledger_root, plan.scenario).filter(pl.col("snapshot_hash") == snapshot_hash)
    if rows.height == 0:
        return None
    folder_id = rows["candidate_id"][0]
    path = plan.candidate_dir or plan.candidate_root / folder_id
    if not (path / "candidate.json").is_file() or Candidate.read(path).lineage.snapshot_hash != snapshot_hash:
        raise RoundResumeError(f"the ledger says snapshot {snapshot_hash[:12]} trained {folder_id}, but {path} "
                               "does not hold a candidate trained on it")
    return path


def _remove_staging(plan: RoundPlan) -> None:
    """The half-written folders a killed training left beside its fixed candidate folder."""
    import shutil

    if plan.candidate_dir is None:
        return
    for stale in plan.candidate_dir.parent.glob(f".{plan.candidate_dir.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def _failing(log: RoundLog, rnd: Round) -> Iterator[None]:
    """An error in a step ends the round as `failed`, with the error as its reason."""
    from reef.learn.round_log import TRANSITIONS

    try:
        yield
    except Exception as exc:
        if TRANSITIONS.allowed(rnd.state, "failed"):
            log.append(rnd, "failed", reason=f"{type(exc).__name__}: {exc}"[:500])
        raise


def main(argv: list[str] | None = None) -> int:
    from reef.config import GateSettings
    from reef.learn.round_log import RoundBusyError
    from reef.recipe.snapshot import EmptySnapshotError
    from reef.sampling.engine import add_engine_arguments, engine_of

    defaults = GateSettings()
    parser = argparse.ArgumentParser(prog="python -m reef.learn.round", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="a RoundPlan as JSON")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gate-samples", type=int, default=defaults.samples)
    parser.add_argument("--gate-confidence", type=float, default=defaults.confidence)
    parser.add_argument("--gate-min-delta", type=float, default=defaults.min_delta)
    parser.add_argument("--gate-fault-retries", type=int, default=defaults.fault_retries)
    parser.add_argument("--gate-min-valid-pairs", type=int, default=defaults.min_valid_pairs)
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    plan = RoundPlan.model_validate_json(args.plan.read_text())
    gate_config = GateSettings(samples=args.gate_samples, confidence=args.gate_confidence,
                               min_delta=args.gate_min_delta, fault_retries=args.gate_fault_retries,
                               min_valid_pairs=args.gate_min_valid_pairs)
    try:
        result = run_round(plan, gate_config, engine=engine_of(args.engine_url, args.engine_model), progress=False)
    except EmptySnapshotError as exc:
        result = {"status": "nothing_new", "scenario": plan.scenario, "reason": str(exc)}
    except RoundBusyError as exc:
        result = {"status": "busy", "scenario": plan.scenario, "reason": str(exc)}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: result.get(k) for k in ("scenario", "status", "candidate_id")}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
