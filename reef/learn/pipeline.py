"""The learning pipeline's steps as DVC stages, and `reef learn --once` / `reef recipe run`.

    python -m reef.learn.pipeline snapshot|train|evaluate|pending --scenario NAME [--params params.yaml]
    python -m reef.learn.pipeline learn [--scenario NAME]

params.yaml lists the scenarios the pipeline learns for (`scenarios:`); dvc.yaml's stages are
`foreach` over them, so each scenario has its own snapshot, train and evaluate stage, and new
traffic in one scenario reruns only its stages. `train:` is the recipe every scenario learns with;
a scenario's own keys (`scenarios.<name>: {max_steps: 60}` or `{recipe: kto, ...}`) override it.
Each stage writes one fixed folder DVC tracks (DVC content-addresses it; the content hash and ids
are inside): `data/snapshots/<scenario>/`, `data/candidates/<scenario>/`, `data/metrics/<scenario>.json`.

The steps themselves are reef.learn.round's, the one round orchestrator: a stage is one step of
a round. The pipeline trains from `base_model.path`, its declared dependency, never from a release
head DVC cannot see (`continue_from_head` is off; the server's learner continues from the head).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reef.core.durable import replace_atomically
from reef.learn import round as rounds
from reef.learn.round import RoundPlan
from reef.recipe import ledger
from reef.recipe.snapshot import EmptySnapshotError, Snapshot
from reef.recipe.spec import Candidate

DEFAULT_PARAMS = Path("params.yaml")
RELEASE_DIR = Path("data")  # where the pipeline's candidates are registered and gated


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@dataclass(frozen=True)
class Params:
    raw: dict[str, Any]

    def __post_init__(self) -> None:
        if "scenario" in self.raw:
            raise ValueError(f"params.yaml: `scenario: {self.raw['scenario']}` is now `scenarios: "
                             f"{{{self.raw['scenario']}: {{}}}}` (one entry per scenario the pipeline learns for)")
        for name in self.scenarios:
            if "." in name:  # DVC addresses params by dotted path: `scenarios.a.b` cannot be tracked
                raise ValueError(f"params.yaml: scenarios.{name}: DVC cannot track a scenario name with a dot")

    @classmethod
    def read(cls, path: Path | str = DEFAULT_PARAMS) -> Params:
        return cls(yaml.safe_load(Path(path).read_text()) or {})

    @property
    def scenarios(self) -> list[str]:
        return list(self.raw.get("scenarios") or {})

    def scenario(self, name: str | None = None) -> str:
        """`name`, checked, or the only scenario params.yaml declares."""
        if name is not None:
            if name not in self.scenarios:
                raise ValueError(f"params.yaml declares no scenario {name!r} (scenarios: {self.scenarios})")
            return name
        if len(self.scenarios) != 1:
            raise ValueError(f"params.yaml declares scenarios {self.scenarios}: name one (--scenario)")
        return self.scenarios[0]

    @property
    def base_model(self) -> str:
        return self.raw.get("base_model", {}).get("path", "data/models/tiny")

    @property
    def data_dir(self) -> Path:
        return Path(self.raw.get("source", {}).get("data_dir", "data"))

    @property
    def ledger_root(self) -> Path:
        return Path(self.raw.get("source", {}).get("ledger_root", ledger.DEFAULT_ROOT))

    def train(self, scenario: str) -> dict[str, Any]:
        """`train` with the scenario's own keys over it."""
        return _merge(self.raw.get("train") or {}, (self.raw.get("scenarios") or {}).get(scenario) or {})

    def recipe_ref(self, scenario: str) -> str:
        return self.train(scenario)["recipe"]

    def recipe_params(self, scenario: str) -> dict[str, Any]:
        """The scenario's train keys minus `recipe`, `train.experience` flattened in: the recipe config's fields."""
        train = self.train(scenario)
        train.pop("recipe", None)
        experience = train.pop("experience", None) or {}
        return {**experience, **train}

    def plan(self, scenario: str, *, recipe: str | None = None, overrides: dict[str, Any] | None = None,
             fixed: bool = True) -> RoundPlan:
        """The scenario's round: fixed folders (the DVC stages'), or content-hashed ones (`reef recipe run`)."""
        own = recipe is None or recipe == self.train(scenario).get("recipe")
        values = self.recipe_params(scenario) if own else {}
        values = {**values, **(overrides or {})}
        base = values.pop("base_model", None) or self.base_model
        return RoundPlan(
            scenario=scenario, recipe=recipe or self.recipe_ref(scenario), params=values, base_model=base,
            experience_dir=self.data_dir, data_dir=RELEASE_DIR, ledger_root=self.ledger_root,
            snapshot_dir=Path("data/snapshots") / scenario if fixed else None,
            candidate_dir=Path("data/candidates") / scenario if fixed else None, continue_from_head=False,
        )

    def metrics_file(self, scenario: str) -> Path:
        return Path("data/metrics") / f"{scenario}.json"

    @property
    def evaluate(self) -> dict[str, Any]:
        return dict(self.raw.get("evaluate", {}))


def stage_snapshot(params: Params, scenario: str) -> Snapshot:
    return rounds.take_snapshot(params.plan(scenario))


def stage_train(params: Params, scenario: str, progress: bool = True) -> Candidate:
    return rounds.train(params.plan(scenario), progress=progress)


def gate_metrics(candidate: Path | str, baseline: Path | str, scenario: str, evaluate: dict[str, Any],
                 out: Path, progress: bool = False) -> dict[str, Any]:
    """The gate's comparison of a candidate folder with `baseline`, written to `out` as metrics JSON.
    `evaluate` (params.yaml's section) holds GateConfig fields: samples, seed, confidence, min_delta."""
    from dataclasses import fields

    from reef.gate.evaluate import GateConfig, gate_folders

    known = {f.name for f in fields(GateConfig)}
    if unknown := sorted(set(evaluate) - known):
        raise ValueError(f"evaluate: unknown key(s) {unknown}; the gate takes {sorted(known)} (sampling settings "
                         "are the scenario's eval: max_new_tokens, samples, temperature, seed)")
    result = gate_folders(candidate, baseline, scenario, GateConfig(**evaluate), progress=progress)
    metrics = {"scenario": scenario, "baseline": str(baseline), **result.summary()}
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(out, (json.dumps(metrics, indent=2) + "\n").encode())
    return metrics


def stage_evaluate(params: Params, scenario: str) -> dict[str, Any]:
    ev = params.evaluate
    baseline = ev.pop("baseline", None) or params.base_model
    plan = params.plan(scenario)
    assert plan.candidate_dir is not None
    return gate_metrics(plan.candidate_dir, baseline, scenario, ev, params.metrics_file(scenario))


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
    params = Params.read(params_path)
    name = params.scenario(scenario)
    plan = params.plan(name)
    if use_dvc is None:
        use_dvc = Path("dvc.yaml").is_file() and shutil.which("dvc") is not None
    if use_dvc:
        _dvc("repro", f"snapshot@{name}")  # upstream stages, and the snapshot when its inputs changed
    recipe = plan.load_recipe()
    records, counts, digest = rounds.selection(plan, recipe)
    waiting = {"records": records, **counts}
    if records == 0 and recipe.needs_experience:
        return {"status": "nothing_new", "scenario": name, "pending": waiting}
    if use_dvc:
        assert plan.snapshot_dir is not None
        current = plan.snapshot_dir / "manifest.json"
        if not current.is_file() or Snapshot.open(plan.snapshot_dir).hash != digest:
            _dvc("repro", "--force", "--single-item", f"snapshot@{name}")
        _dvc("repro", f"evaluate@{name}")
    else:
        rounds.run_round(plan, evaluate=False, progress=progress)
        stage_evaluate(params, name)
    assert plan.candidate_dir is not None
    return {
        "status": "trained", "scenario": name, "pending": waiting,
        "candidate": Candidate.read(plan.candidate_dir).to_json(),
        "metrics": json.loads(params.metrics_file(name).read_text()),
    }


def run_recipe(name: str, params_path: Path | str | None = DEFAULT_PARAMS, overrides: dict[str, Any] | None = None,
               *, scenario: str | None = None, evaluate: bool = True, progress: bool = True) -> dict[str, Any]:
    """`reef recipe run NAME`: the round orchestrator's snapshot and train steps with recipe NAME, in
    content-hashed folders (data/snapshots/<id>/, data/candidates/<id>/), no DVC; then the gate
    against the base model, written to the candidate's eval.json. Params come from params.yaml's
    (scenario's) train keys when they name the same recipe, else the recipe's defaults; `overrides`
    (e.g. {"max_steps": 5}) win."""
    from reef.recipe.registry import resolve

    params = Params.read(params_path) if params_path and Path(params_path).is_file() else Params({})
    overrides = dict(overrides or {})
    scenario = scenario or overrides.pop("scenario", None) or params.scenario()
    configured = params.train(scenario).get("recipe")
    same = configured is not None and resolve(configured) is resolve(name)
    plan = params.plan(scenario, recipe=configured if same else name, overrides=overrides, fixed=False)
    out = rounds.run_round(plan, evaluate=False, progress=progress)
    if evaluate and out["status"] == "trained":
        ev = params.evaluate
        baseline = ev.pop("baseline", None) or plan.base_model
        path = Path(out["candidate"]["path"])
        out["metrics"] = gate_metrics(path, baseline, scenario, ev, path / "eval.json", progress=progress)
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["max_steps=5", "kind=lora"]` -> {"max_steps": 5, "kind": "lora"} (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str):
            try:  # YAML 1.1 reads "1e-4" as a string
                parsed = float(parsed)
            except ValueError:
                pass
        out[key.strip()] = parsed
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reef.learn.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["snapshot", "train", "evaluate", "learn", "pending"])
    parser.add_argument("--scenario", help="default: the only scenario params.yaml declares")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the result JSON here")
    args = parser.parse_args(argv)
    try:
        params = Params.read(args.params)
        name = params.scenario(args.scenario)
    except (ValueError, OSError) as exc:
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
            result = rounds.pending(params.plan(name))
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
