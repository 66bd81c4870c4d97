"""The learning pipeline's steps as DVC stages, and `reef learn --once` / `reef recipe run`.

    python -m reef.learn.pipeline snapshot|train|evaluate|pending --scenario NAME [--params params.yaml]
    python -m reef.learn.pipeline learn [--scenario NAME]

params.yaml lists the scenarios the pipeline learns for (`scenarios:`); dvc.yaml's stages are
`foreach` over them, so each scenario has its own snapshot, train and evaluate stage, and new
traffic in one scenario reruns only its stages. `train:` is the recipe every scenario learns with;
a scenario's own keys (`scenarios.<name>: {max_steps: 60}` or `{recipe: kto, ...}`) override it.
Each stage writes one fixed folder DVC tracks (DVC content-addresses it; the content hash and ids
are inside): `data/snapshots/<scenario>/`, `data/candidates/<scenario>/`, `data/metrics/<scenario>.json`.

params.yaml is read by reef.config.params (strict: an unknown key exits 2 naming it), and each
round is planned by reef.learn.plan from its `train` setting, as the server's learner
plans from serve.yaml's. The steps themselves are reef.learn.round's, the one round orchestrator: a
stage is one step of a round. The pipeline trains from `base_model.path`, its declared dependency, never from a release
head DVC cannot see (`continue_from_head` is off; the server's learner continues from the head).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from reef.config import CONFIG_FILE_ENV, GateSettings, ParamsError, PipelineParams, TrainParams
from reef.config.learner import AccelerateSettings
from reef.config.params import DEFAULT_PARAMS
from reef.core.durable import replace_atomically
from reef.core.paths import DEFAULT_DATA_DIR, DataDir
from reef.gate.evaluate import gate_folders
from reef.learn import round as rounds
from reef.learn.pending import pending, selection
from reef.learn.plan import RoundPlan, plan_round
from reef.recipe.loading import resolve
from reef.recipe.snapshot import EmptySnapshotError, Snapshot
from reef.registry.schema import Candidate
from reef.scenario.schema import RecipeSpec

RELEASE_DIR = DataDir(DEFAULT_DATA_DIR)  # where the pipeline's candidates are registered and gated


def declare_scenarios(params: PipelineParams) -> None:
    """Make `source.serve_yaml` the serve.yaml this process (and the stages it starts) reads, as
    `reef.learn.round` does with the server's: the scenarios it declares are what the stages learn
    for. An explicit REEF_CONFIG wins."""
    if params.source.serve_yaml is not None and not os.environ.get(CONFIG_FILE_ENV):
        os.environ[CONFIG_FILE_ENV] = str(params.source.serve_yaml.resolve())


def plan(params: PipelineParams, scenario: str, spec: RecipeSpec | None = None, *, fixed: bool = True) -> RoundPlan:
    """The scenario's round, by the learner's planner: fixed folders (the DVC stages'), or content-hashed
    ones (`reef recipe run`); from `base_model.path`, never from a head DVC cannot see."""
    return plan_round(scenario, spec or params.recipe_spec(scenario), base_model=params.base_model.path,
                             data_dir=RELEASE_DIR.root, experience_dir=params.source.data_dir,
                             ledger_root=params.source.ledger_root, fixed=fixed, continue_from_head=False)


def checked(params: PipelineParams, scenario: str, spec: RecipeSpec | None = None, *, fixed: bool = True,
            overrides: dict[str, Any] | None = None) -> RoundPlan:
    """`plan`, its recipe fields checked against the recipe's config class: one it lacks is a
    ParamsError naming the key where it was written (`train.max_stepz`, or `--set max_stepz`)."""
    out = plan(params, scenario, spec, fixed=fixed)
    known = {f.name for f in fields(resolve(out.recipe, out.import_dirs).config_class)}
    for key in sorted(set(out.params) - known):
        raise ParamsError(f"--set {key}: unknown key") if key in (overrides or {}) else params.unknown(scenario, key)
    return out


def metrics_file(scenario: str) -> Path:
    return RELEASE_DIR.metrics / f"{scenario}.json"


def stage_snapshot(params: PipelineParams, scenario: str) -> Snapshot:
    return rounds.take_snapshot(checked(params, scenario))


def stage_train(params: PipelineParams, scenario: str, progress: bool = True) -> Candidate:
    return rounds.train(checked(params, scenario), progress=progress)


def gate_metrics(candidate: Path | str, baseline: Path | str, scenario: str, settings: GateSettings,
                 out: Path, progress: bool = False) -> dict[str, Any]:
    """The gate's comparison of a candidate folder with `baseline`, written to `out` as metrics JSON;
    `settings`: params.yaml's `gate:` (how replies are sampled is the scenario's eval section)."""
    result = gate_folders(candidate, baseline, scenario, settings, progress=progress)
    metrics = {"scenario": scenario, "baseline": str(baseline), **result.summary()}
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(out, (json.dumps(metrics, indent=2) + "\n").encode())
    return metrics


def stage_evaluate(params: PipelineParams, scenario: str) -> dict[str, Any]:
    candidate_dir = plan(params, scenario).candidate_dir
    assert candidate_dir is not None
    baseline = params.evaluate.baseline or params.base_model.path
    return gate_metrics(candidate_dir, baseline, scenario, params.gate, metrics_file(scenario))


def _dvc(*args: str) -> None:
    subprocess.run(["dvc", *args], check=True)


def learn_once(params_path: Path | str = DEFAULT_PARAMS, scenario: str | None = None, *, use_dvc: bool | None = None,
               progress: bool = True) -> dict[str, Any]:
    """One learning round of one scenario (default: the only one in params.yaml): snapshot -> train ->
    evaluate. Returns {"status": "trained" | "nothing_new", "scenario", "pending": counts,
    "candidate": candidate.json, "metrics": the evaluate stage's metrics}.

    With DVC (the default when dvc.yaml exists) the scenario's stages run through `dvc repro`, so
    dvc.lock records the round. Its snapshot stage reruns by itself when traffic arrived; it is
    forced when eligible records are waiting that the current snapshot lacks (deferred by
    `batch_size`, or reported since), since DVC sees no changed input then. Without DVC the round
    orchestrator runs the same steps.
    """
    params = PipelineParams.read(params_path)
    declare_scenarios(params)
    name = params.scenario(scenario)
    round_plan = checked(params, name)
    if use_dvc is None:
        use_dvc = Path("dvc.yaml").is_file() and shutil.which("dvc") is not None
    if use_dvc:
        _dvc("repro", f"snapshot@{name}")  # upstream stages, and the snapshot when its inputs changed
    recipe = round_plan.load_recipe()
    records, counts, digest = selection(round_plan, recipe)
    waiting = {"records": records, **counts}
    if records == 0 and recipe.needs_experience:
        return {"status": "nothing_new", "scenario": name, "pending": waiting}
    if use_dvc:
        assert round_plan.snapshot_dir is not None
        current = round_plan.snapshot_dir / "manifest.json"
        if not current.is_file() or Snapshot.open(round_plan.snapshot_dir).hash != digest:
            _dvc("repro", "--force", "--single-item", f"snapshot@{name}")
        _dvc("repro", f"evaluate@{name}")
    else:
        rounds.run_round(round_plan, evaluate=False, progress=progress)
        stage_evaluate(params, name)
    assert round_plan.candidate_dir is not None
    return {
        "status": "trained", "scenario": name, "pending": waiting,
        "candidate": Candidate.read(round_plan.candidate_dir).to_json(),
        "metrics": json.loads(metrics_file(name).read_text()),
    }


def run_recipe(name: str, params_path: Path | str | None = DEFAULT_PARAMS, overrides: dict[str, Any] | None = None,
               *, scenario: str | None = None, evaluate: bool = True, progress: bool = True,
               launcher: AccelerateSettings | None = None) -> dict[str, Any]:
    """`reef recipe run NAME`: the round orchestrator's snapshot and train steps with recipe NAME, in
    content-hashed folders (data/snapshots/<id>/, data/candidates/<id>/), no DVC; then the gate
    against the base model, written to the candidate's eval.json. Params come from params.yaml's
    (scenario's) train keys when they name the same recipe, else the recipe's defaults; `overrides`
    (e.g. {"max_steps": 5}) win. `launcher`: train through accelerate (reef.learn.launch)."""
    params = PipelineParams.read(params_path) if params_path and Path(params_path).is_file() else PipelineParams()
    declare_scenarios(params)
    overrides = dict(overrides or {})
    scenario = scenario or overrides.pop("scenario", None) or params.scenario()
    configured = params.train_for(scenario).recipe
    if configured is not None and resolve(configured) is resolve(name):
        spec = params.recipe_spec(scenario, overrides)
    else:
        spec = TrainParams.model_validate({"recipe": name, **overrides}).recipe_spec(params.name)
    round_plan = checked(params, scenario, spec, fixed=False, overrides=overrides)
    out = rounds.run_round(round_plan, evaluate=False, progress=progress, launcher=launcher)
    if evaluate and out.status == "trained" and out.candidate is not None:
        baseline = params.evaluate.baseline or round_plan.base_model
        path = out.candidate.path
        metrics = gate_metrics(path, baseline, scenario, params.gate, path / "eval.json", progress=progress)
        out = out.model_copy(update={"metrics": metrics})
    return out.model_dump(mode="json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reef.learn.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["snapshot", "train", "evaluate", "learn", "pending"])
    parser.add_argument("--scenario", help="default: the only scenario params.yaml declares")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the result JSON here")
    args = parser.parse_args(argv)
    try:
        params = PipelineParams.read(args.params)
        declare_scenarios(params)
        name = params.scenario(args.scenario)
        if args.stage != "evaluate":  # an unknown recipe field fails here, before any work
            checked(params, name)
    except (ValueError, OSError, LookupError, ImportError) as exc:
        print(f"reef: {exc}", file=sys.stderr)
        return 2
    try:
        if args.stage == "snapshot":
            snap = stage_snapshot(params, name)
            result: Any = {"snapshot": snap.id, "records": len(snap.record_ids), "counts": snap.manifest["counts"]}
        elif args.stage == "train":
            cand = stage_train(params, name, progress=not args.quiet)
            result = {"candidate": cand.id, "train_loss": cand.metrics.get("train_loss")}
        elif args.stage == "evaluate":
            result = stage_evaluate(params, name)
        elif args.stage == "pending":
            result = pending(checked(params, name))
        else:
            result = learn_once(args.params, name, progress=not args.quiet)
    except EmptySnapshotError as exc:
        print(f"nothing to learn from: {exc}", file=sys.stderr)
        return 3
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
