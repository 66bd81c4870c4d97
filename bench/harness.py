"""Harness evolution on the bundled demo-rules scenario: held-out success under the base harness and
under the evolved harness, the same weights, side by side in one run, with the gate's interval.

One round, as the learner runs it: the base model answers the scenario's training prompts (offline
traffic, recorded and scored with the reward's feedback as a served chat would be), harness_evolve's
`mined` proposer turns the recurring feedback into a rule, and the gate compares the candidate
harness with the head's (none) on the held-out eval suite (36 tasks x `--samples` replies per arm,
each prompt sent with its arm's harness as `harness.inject: system_prepend` serves it, same seeds).
CPU time per phase is this process's (transformers on one thread; no engine).

    .venv/bin/python bench/harness.py [--samples 8] [--prompts 72]

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import GateSettings  # noqa: E402
from reef.gate.evaluate import evaluate_candidate  # noqa: E402
from reef.learn.round import RoundPlan, run_round  # noqa: E402
from reef.registry.candidates import CandidateRegistry  # noqa: E402
from reef.traffic.offline import record_offline_traffic  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402
from tests.helpers.tiny import rules as demo  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
OUT = REPO / "bench" / "out"
console = Console(width=160)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(phases: dict[str, tuple[float, float]], name: str, fn: Any) -> Any:
    wall, used = time.monotonic(), cpu()
    out = fn()
    phases[name] = (time.monotonic() - wall, cpu() - used)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8, help="replies per eval task and arm")
    parser.add_argument("--prompts", type=int, default=72, help="training prompts answered by the base model")
    parser.add_argument("--traffic-samples", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    add_flag(parser)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    phases: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="reef-bench-harness-") as tmp:
        data = Path(tmp) / "data"
        traffic = timed(phases, "traffic (base model, offline)", lambda: record_offline_traffic(
            TINY, data, demo.SCENARIO, prompts=args.prompts, samples=args.traffic_samples, seed=args.seed))
        plan = RoundPlan(scenario=demo.SCENARIO, recipe="harness_evolve", base_model=str(TINY), experience_dir=data,
                         data_dir=data, ledger_root=data / "ledger", snapshot_root=data / "snapshots",
                         candidate_root=data / "candidates")
        out = timed(phases, "propose (mined feedback)", lambda: run_round(plan, evaluate=False, progress=False))
        if out.status != "trained" or out.candidate is None:
            console.print(f"[red]no candidate: {out}")
            return 1
        folder = out.candidate.path
        view = CandidateRegistry(data, demo.SCENARIO).register(folder)
        result = timed(phases, "gate (both arms, transformers)", lambda: evaluate_candidate(
            data, view.candidate_id, GateSettings(samples=args.samples, seed=args.seed), base_model=str(TINY),
            progress=False))
        rules = (folder / "rules.md").read_text()

    table = Table(title=f"demo-rules held-out ({result.prompts} tasks x {result.samples_per_prompt} replies), "
                        "same weights")
    for col in ("harness", "success", "delta vs base", f"{result.confidence:.0%} CI", "wins/losses/ties"):
        table.add_column(col)
    table.add_row("base (none)", f"{result.head_success:.1%}", "-", "-", "-")
    table.add_row(f"evolved: rules.md {rules.strip()!r}", f"{result.candidate_success:.1%}",
                  f"{result.delta:+.3f}", f"[{result.ci_low:+.3f}, {result.ci_high:+.3f}]",
                  f"{result.wins}/{result.losses}/{result.ties}")
    console.print(table)
    lines = [f"gate: {result.decision} ({result.reason})",
             f"traffic: {traffic['records']} records, mean score {traffic['mean_score']:.3f}; "
             f"proposer saw {out.candidate.metrics['failures']} failures",
             *(f"  {name:34} {used:6.1f} s CPU  {wall:6.1f} s wall" for name, (wall, used) in phases.items())]
    for line in lines:
        console.print(line)
    publish(args, "harness", table, "\n".join(f"- {line.strip()}" for line in lines))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "harness.json").write_text(json.dumps({
        "gate": result.summary(), "rules": rules, "traffic": traffic,
        "phases": {k: {"wall_s": round(w, 2), "cpu_s": round(c, 2)} for k, (w, c) in phases.items()},
        "load_average": os.getloadavg(),
    }, indent=2, default=str))
    return 0 if result.decision == "select" else 1


if __name__ == "__main__":
    raise SystemExit(main())
