"""The learning pipeline's steps, as DVC stages and as plain functions for the CLI.

    python -m reef.recipe.stage snapshot|train|evaluate [--params params.yaml]

Each stage reads params.yaml and writes one fixed folder DVC tracks (DVC content-addresses it;
the content hash and ids are inside): `data/snapshots/<scenario>/`, `data/candidates/<scenario>/`,
`data/metrics/<scenario>.json`. `learn_once()` runs one round (snapshot -> train -> evaluate),
through `dvc repro` when the project has a dvc.yaml, so the lock file stays the record of it.
`run_recipe()` is the notebook/CLI path: content-hashed snapshot and candidate folders, no DVC.
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

from reef.durable import replace_atomically
from reef.recipe import ledger
from reef.recipe.base import Recipe
from reef.recipe.registry import load_recipe, resolve
from reef.recipe.snapshot import EmptySnapshotError, Snapshot, content_hash, select
from reef.recipe.spec import Candidate

DEFAULT_PARAMS = Path("params.yaml")


@dataclass(frozen=True)
class Params:
    raw: dict[str, Any]

    @classmethod
    def read(cls, path: Path | str = DEFAULT_PARAMS) -> Params:
        return cls(yaml.safe_load(Path(path).read_text()) or {})

    @property
    def scenario(self) -> str:
        return self.raw["scenario"]

    @property
    def base_model(self) -> str:
        return self.raw.get("base_model", {}).get("path", "data/models/tiny")

    @property
    def data_dir(self) -> Path:
        return Path(self.raw.get("source", {}).get("data_dir", "data"))

    @property
    def ledger_root(self) -> Path:
        return Path(self.raw.get("source", {}).get("ledger_root", ledger.DEFAULT_ROOT))

    @property
    def recipe_ref(self) -> str:
        return self.raw["train"]["recipe"]

    def recipe_params(self) -> dict[str, Any]:
        """`train` minus `recipe`, with `train.experience` flattened in: the recipe config's fields."""
        train = dict(self.raw.get("train", {}))
        train.pop("recipe", None)
        experience = train.pop("experience", None) or {}
        return {"scenario": self.scenario, "base_model": self.base_model, **experience, **train}

    def recipe(self) -> Recipe:
        return load_recipe(self.recipe_ref, self.recipe_params())

    @property
    def snapshot_dir(self) -> Path:
        return Path("data/snapshots") / self.scenario

    @property
    def candidate_dir(self) -> Path:
        return Path("data/candidates") / self.scenario

    @property
    def metrics_file(self) -> Path:
        return Path("data/metrics") / f"{self.scenario}.json"

    @property
    def evaluate(self) -> dict[str, Any]:
        return dict(self.raw.get("evaluate", {}))


def stage_snapshot(params: Params) -> Snapshot:
    # An empty snapshot is written, not refused: "nothing new" is then the train stage's clear
    # failure, and `learn_once` can bring upstream stages up to date before deciding to train.
    spec = params.recipe().experience()
    return Snapshot.create(params.scenario, params.data_dir, spec, dest=params.snapshot_dir,
                           ledger_root=params.ledger_root, allow_empty=True)


def stage_train(params: Params, progress: bool = True) -> Candidate:
    return params.recipe().run(Snapshot.open(params.snapshot_dir), out_dir=params.candidate_dir, progress=progress)


def gate_metrics(candidate: Path | str, baseline: Path | str, scenario: str, evaluate: dict[str, Any],
                 out: Path, progress: bool = False) -> dict[str, Any]:
    """The gate's comparison of a candidate folder with `baseline`, written to `out` as metrics JSON.
    `evaluate` (params.yaml's section) holds GateConfig fields: samples, seed, confidence, min_delta."""
    from dataclasses import fields

    from reef.release.gate import GateConfig, gate_folders

    known = {f.name for f in fields(GateConfig)}
    if unknown := sorted(set(evaluate) - known):
        raise ValueError(f"evaluate: unknown key(s) {unknown}; the gate takes {sorted(known)} (sampling settings "
                         "are the scenario's eval: max_new_tokens, samples, temperature, seed)")
    result = gate_folders(candidate, baseline, scenario, GateConfig(**evaluate), progress=progress)
    metrics = {"scenario": scenario, "baseline": str(baseline), **result.summary()}
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(out, (json.dumps(metrics, indent=2) + "\n").encode())
    return metrics


def stage_evaluate(params: Params) -> dict[str, Any]:
    ev = params.evaluate
    baseline = ev.pop("baseline", None) or params.base_model
    return gate_metrics(params.candidate_dir, baseline, params.scenario, ev, params.metrics_file)


def _selection(params: Params) -> tuple[int, dict[str, int], str]:
    """What a snapshot would hold now, without writing anything: (records, counts, content hash)."""
    from reef.experience import load

    spec = params.recipe().experience()
    taken = set(ledger.consumed(params.ledger_root, params.scenario)["record_id"].to_list())
    frame, counts = select(load(params.scenario, params.data_dir).collect(), spec, taken)
    return frame.height, counts, content_hash(frame, spec)


def pending(params: Params) -> dict[str, int]:
    """How many records the next round would take, and why the others are left out."""
    records, counts, _ = _selection(params)
    return {"records": records, **counts}


def _dvc(*args: str) -> None:
    subprocess.run(["dvc", *args], check=True)


def learn_once(params_path: Path | str = DEFAULT_PARAMS, *, use_dvc: bool | None = None,
               progress: bool = True) -> dict[str, Any]:
    """One learning round: snapshot -> train -> evaluate. Returns {"status": "trained" | "nothing_new",
    "pending": counts, "candidate": candidate.json, "metrics": eval metrics}.

    With DVC (the default when dvc.yaml exists) the stages run through `dvc repro`, so dvc.lock
    records the round. The snapshot stage reruns by itself when traffic arrived; it is forced when
    eligible records are waiting that the current snapshot lacks (deferred by `batch_size`, or
    reported since), since DVC sees no changed input then.
    """
    params = Params.read(params_path)
    if use_dvc is None:
        use_dvc = Path("dvc.yaml").is_file() and shutil.which("dvc") is not None
    if use_dvc:
        _dvc("repro", "snapshot")  # upstream stages, and the snapshot when its inputs changed
    records, counts, digest = _selection(params)
    if records == 0 and params.recipe().needs_experience:
        return {"status": "nothing_new", "pending": {"records": 0, **counts}}
    if use_dvc:
        current = params.snapshot_dir / "manifest.json"
        if not current.is_file() or Snapshot.open(params.snapshot_dir).hash != digest:
            _dvc("repro", "--force", "--single-item", "snapshot")
        _dvc("repro", "evaluate")
    else:
        stage_snapshot(params)
        stage_train(params, progress=progress)
        stage_evaluate(params)
    return {
        "status": "trained",
        "pending": {"records": records, **counts},
        "candidate": Candidate.read(params.candidate_dir).to_json(),
        "metrics": json.loads(params.metrics_file.read_text()),
    }


def run_recipe(name: str, params_path: Path | str | None = DEFAULT_PARAMS, overrides: dict[str, Any] | None = None,
               *, out_root: Path | str = "data/candidates", evaluate: bool = True,
               progress: bool = True) -> dict[str, Any]:
    """`reef recipe run NAME`: snapshot (content-hashed under data/snapshots/), train into
    data/candidates/<id>/, evaluate. Params come from params.yaml's `train` section when it names
    the same recipe, else the recipe's defaults; `overrides` (e.g. {"max_steps": 5}) win."""
    cls = resolve(name)
    params = Params.read(params_path) if params_path and Path(params_path).is_file() else Params({})
    values: dict[str, Any] = {}
    if "scenario" in params.raw:
        values = {"scenario": params.scenario, "base_model": params.base_model}
    if params.raw.get("train", {}).get("recipe") and resolve(params.recipe_ref) is cls:
        values = params.recipe_params()
    recipe = cls(**{**values, **(overrides or {})})
    spec = recipe.experience()
    snap = Snapshot.create(spec.scenario, params.data_dir, spec, ledger_root=params.ledger_root,
                           allow_empty=not recipe.needs_experience)
    candidate = recipe.run(snap, out_root=out_root, progress=progress)
    out: dict[str, Any] = {"snapshot": snap.id, "candidate": candidate.to_json()}
    if evaluate:
        ev = params.evaluate
        baseline = ev.pop("baseline", None) or recipe.config.base_model
        out["metrics"] = gate_metrics(candidate.path, baseline, spec.scenario, ev, Path(candidate.path) / "eval.json",
                                      progress=progress)
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
    parser = argparse.ArgumentParser(prog="python -m reef.recipe.stage", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["snapshot", "train", "evaluate", "learn", "pending"])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the result JSON here (for the learner)")
    args = parser.parse_args(argv)
    params = Params.read(args.params)
    try:
        if args.stage == "snapshot":
            snap = stage_snapshot(params)
            result: Any = {"snapshot": snap.id, "records": len(snap.record_ids), "counts": snap.manifest["counts"]}
        elif args.stage == "train":
            cand = stage_train(params, progress=not args.quiet)
            result = {"candidate": cand.id, "train_loss": cand.metrics.get("train_loss")}
        elif args.stage == "evaluate":
            result = stage_evaluate(params)
        elif args.stage == "pending":
            result = pending(params)
        else:
            result = learn_once(args.params, progress=not args.quiet)
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
