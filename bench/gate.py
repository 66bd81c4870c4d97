"""The gate through the serving engine vs. through transformers, side by side in one run; and the
engine's gate with the head's replies kept from before (reef.gate.head_replies: what the learner's
warm-up leaves), sampling the candidate's arm alone.

A LoRA candidate (rft, a few steps on offline demo traffic) against the base model on the demo-add
eval suite (80 tasks x `--samples` replies per arm, the scenario's 16 tokens at temperature 1), in
alternating order for `--rounds` rounds; medians of wall time, tasks/s and CPU time per task
(the engine's: the vLLM process group's CPU time plus this process's; transformers': this
process's). Targets: the engine path no slower on CPU; with the head kept, at most 0.6x the engine
gate's CPU per task.

    .venv/bin/python bench/gate.py [--rounds 3] [--samples 4]

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table
from rich.text import Text

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import GateSettings, ServeConfig  # noqa: E402
from reef.engine.supervisor import EngineSupervisor  # noqa: E402
from reef.gate.arms import Weights  # noqa: E402
from reef.gate.evaluate import gate_weights  # noqa: E402
from reef.gate.head_replies import HeadReplies  # noqa: E402
from reef.gate.scoring import suite_for  # noqa: E402
from reef.recipe import Snapshot, load_recipe  # noqa: E402
from reef.sampling.engine import EngineEndpoint  # noqa: E402
from reef.traffic.offline import record_offline_traffic  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402
from tests.helpers.tiny import task as demo  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
OUT = REPO / "bench" / "out"
MODEL_NAME = "reef-tiny"
console = Console()


def train_lora(work: Path) -> Path:
    record_offline_traffic(TINY, work / "traffic", demo.SCENARIO, prompts=64, samples=4, seed=1)
    rft = load_recipe("rft", {"scenario": demo.SCENARIO, "base_model": str(TINY), "kind": "lora", "max_steps": 30,
                              "learning_rate": 5e-3, "per_device_batch_size": 16, "min_score": 1.0})
    snap = Snapshot.create(demo.SCENARIO, work / "traffic", rft.experience(), root=work / "snapshots",
                           ledger_root=work / "ledger")
    return rft.run(snap, out_root=work / "candidates", progress=False, consume=False).path


def engine_cpu(pid: int) -> float:
    """CPU seconds of vLLM's API server and its engine-core/worker processes."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


PATHS = {"engine": "engine (vLLM, temporary adapter)", "kept": "engine, the head's replies kept from before",
         "transformers": "transformers (fp32, 1 thread)"}


def one(path: str, candidate: Weights, head: Weights, suite: Any, samples: int, engine: EngineEndpoint,
        engine_pid: int, kept: HeadReplies, warm_up: bool = False) -> dict[str, Any]:
    on_engine = path in ("engine", "kept")
    cpu0, eng0, t0 = time.process_time(), engine_cpu(engine_pid), time.perf_counter()
    result = gate_weights(candidate, head, suite, GateSettings(samples=samples),
                          engine=engine if on_engine else None, progress=False, kept=kept if path == "kept" else None)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + (engine_cpu(engine_pid) - eng0 if on_engine else 0.0)
    assert result.backend == ("engine" if on_engine else path), result.reason
    assert warm_up or (result.head_replies_reused > 0) == (path == "kept"), result.reason
    tasks = len(suite.tasks)
    return {"path": path, "wall_s": wall, "tasks_per_s": tasks / wall, "cpu_ms_per_task": 1000 * cpu / tasks,
            "candidate_success": result.candidate_success, "head_success": result.head_success,
            "decision": result.decision}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4)
    add_flag(parser)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="reef-bench-gate-"))
    with console.status("training a LoRA candidate..."):
        adapter = train_lora(work)
    suite = suite_for(demo.SCENARIO)
    config = ServeConfig(model=str(TINY), served_model_name=MODEL_NAME, data_dir=REPO / "data")
    supervisor = EngineSupervisor(config, work / "vllm.log")
    with console.status("starting vLLM..."):
        url = supervisor.start()
    assert supervisor.process is not None
    engine = EngineEndpoint(url, MODEL_NAME)
    candidate, head = Weights(TINY, adapter), Weights(TINY, served=MODEL_NAME, content="r0")
    kept = HeadReplies(work / "data", demo.SCENARIO)
    runs: list[dict[str, Any]] = []
    try:
        # A warm-up of each path (imports, first compiled shapes), not counted; the kept path's
        # keeps the head's replies, as the learner's warm-up does.
        for path in PATHS:
            one(path, candidate, head, suite, args.samples if path == "kept" else 1, engine,
                supervisor.process.pid, kept, warm_up=True)
        for r in range(args.rounds):
            for path in (list(PATHS) if r % 2 == 0 else list(reversed(PATHS))):
                with console.status(f"round {r + 1}/{args.rounds}: {path}..."):
                    runs.append(one(path, candidate, head, suite, args.samples, engine, supervisor.process.pid,
                                    kept))
                console.print(f"round {r + 1} {path}: {runs[-1]['wall_s']:.2f} s")
    finally:
        supervisor.stop()
    table = Table(title=f"gate on {demo.SCENARIO}: {len(suite.tasks)} tasks x {args.samples} replies x 2 arms, "
                        f"{suite.max_new_tokens} tokens, medians of {args.rounds} alternating rounds")
    for col in ("path", "wall s", "tasks/s", "CPU ms/task", "candidate success", "head success"):
        table.add_column(col, justify="right" if col != "path" else "left")
    summary = {}
    for path, label in PATHS.items():
        mine = [r for r in runs if r["path"] == path]
        med = {k: statistics.median(r[k] for r in mine) for k in ("wall_s", "tasks_per_s", "cpu_ms_per_task",
                                                                   "candidate_success", "head_success")}
        summary[path] = med
        table.add_row(label, f"{med['wall_s']:.2f}", f"{med['tasks_per_s']:.1f}", f"{med['cpu_ms_per_task']:.0f}",
                      f"{med['candidate_success']:.3f}", f"{med['head_success']:.3f}")
    console.print(table)
    speedup = summary["transformers"]["wall_s"] / summary["engine"]["wall_s"]
    ok = speedup >= 1.0
    kept_cpu = summary["kept"]["cpu_ms_per_task"] / summary["engine"]["cpu_ms_per_task"]
    kept_ok = kept_cpu <= 0.6
    verdict = (f"engine path {speedup:.2f}x the transformers path's speed (wall); target >= 1.0: "
               f"{'[green]met[/green]' if ok else '[red]missed[/red]'}\n"
               f"head's replies kept: {kept_cpu:.2f}x the engine gate's CPU per task "
               f"({summary['kept']['wall_s'] / summary['engine']['wall_s']:.2f}x its wall time); target <= 0.6: "
               f"{'[green]met[/green]' if kept_ok else '[red]missed[/red]'}")
    console.print(verdict)
    publish(args, "gate", table, Text.from_markup(verdict))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gate.json").write_text(json.dumps({"rounds": runs, "median": summary, "samples": args.samples,
                                               "speedup": speedup}, indent=2))
    return 0 if ok and kept_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
