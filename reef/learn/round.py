"""One learning round of `reef serve`'s learner, in its own process:
snapshot -> train -> register -> gate.

    python -m reef.learn.round --params params.yaml --data-dir data --out round.json

Full-weight rounds continue from the scenario's head (the weights that produced the experience),
so each release builds on the last; LoRA rounds train an adapter on the base model, the only
weights an adapter can be served on. The gate then compares the candidate with the head. Whether
a selected candidate is released is the server's decision (policy), not this process's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from reef.recipe.snapshot import EmptySnapshotError
from reef.recipe.stage import Params, pending, stage_snapshot, stage_train
from reef.release.artifacts import ArtifactStore
from reef.release.base_model import ensure_scenario
from reef.release.candidates import register_candidate
from reef.release.gate import GateConfig, evaluate_candidate


def _continue_from_head(params: Params, data_dir: Path) -> Params:
    """Params whose base model is the head's weights when the head is a full-weight release."""
    store = ArtifactStore.for_data_dir(data_dir)
    chain, _ = ensure_scenario(data_dir, params.scenario, params.base_model, store)
    head = chain.head()
    if head is None or head.kind != "full" or params.raw.get("train", {}).get("kind") == "lora":
        return params
    raw = json.loads(json.dumps(params.raw))
    raw.setdefault("base_model", {})["path"] = str(store.verify(head.content_id).resolve())
    return Params(raw)


def learn_round(params_path: Path | str, data_dir: Path | str, gate: GateConfig | None = None,
                progress: bool = False) -> dict[str, Any]:
    data_dir = Path(data_dir)
    params = Params.read(params_path)
    waiting = pending(params)
    if waiting["records"] == 0:
        return {"status": "nothing_new", "pending": waiting}
    params = _continue_from_head(params, data_dir)
    snap = stage_snapshot(params)
    candidate = stage_train(params, progress=progress)
    view = register_candidate(data_dir, candidate.path)
    result = evaluate_candidate(data_dir, view.candidate_id, gate, progress=progress)
    return {
        "status": "trained", "pending": waiting, "snapshot": snap.id, "candidate_id": view.candidate_id,
        "candidate": candidate.to_json(), "metrics": candidate.metrics,
        "gate": result.model_dump(mode="json", exclude={"per_prompt"}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reef.learn.round", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gate-samples", type=int, default=GateConfig.samples)
    parser.add_argument("--gate-confidence", type=float, default=GateConfig.confidence)
    parser.add_argument("--gate-min-delta", type=float, default=GateConfig.min_delta)
    args = parser.parse_args(argv)
    gate = GateConfig(samples=args.gate_samples, confidence=args.gate_confidence, min_delta=args.gate_min_delta)
    try:
        result = learn_round(args.params, args.data_dir, gate)
    except EmptySnapshotError as exc:
        result = {"status": "nothing_new", "reason": str(exc)}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: result.get(k) for k in ("status", "candidate_id")}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
