"""Why online_rl was weak on demo-add: its settings side by side on the SAME recorded traffic.

    .venv/bin/python bench/online_rl_sweep.py [--chats 512] [--steps 30] [--eval-samples 8]

Records one round of traffic from the base model offline (transformers sampling, as the bench's
simulated users would get from vLLM: every train prompt once, then a share of them again, so most
prompts have one sample and some two), then trains one online_rl candidate per variant from the
base model on that one snapshot, and evaluates each on the 80 held-out prompts (same seed for
all, through the gate). Variants: the advantage's baseline (per prompt group vs the round's mean), its scale, the
learning rate, the importance-sampling cap. Results: bench/out/online_rl_sweep.json.

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import GateSettings  # noqa: E402
from reef.learn.pipeline import gate_metrics  # noqa: E402
from reef.recipe import Snapshot, load_recipe  # noqa: E402
from reef.traffic.offline import record_offline_traffic  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402
from tests.helpers.tiny import task as demo  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
console = Console(file=sys.stdout, width=140)

VARIANTS: dict[str, dict[str, Any]] = {
    "before: group baseline, group std, lr 5e-5": {"baseline": "group", "scale_rewards": "group",
                                                   "learning_rate": 5e-5},
    "group baseline, group std, lr 2e-4": {"baseline": "group", "scale_rewards": "group", "learning_rate": 2e-4},
    "group baseline, group std, lr 5e-4": {"baseline": "group", "scale_rewards": "group", "learning_rate": 5e-4},
    "group baseline, no scale, lr 5e-4": {"baseline": "group", "scale_rewards": "none", "learning_rate": 5e-4},
    "group baseline, group std, lr 1e-3": {"baseline": "group", "scale_rewards": "group", "learning_rate": 1e-3},
    "group baseline, group std, lr 2e-4, 60 steps": {"baseline": "group", "scale_rewards": "group",
                                                     "learning_rate": 2e-4, "max_steps": 60},
    "batch baseline, batch std, lr 5e-5": {"baseline": "batch", "scale_rewards": "batch", "learning_rate": 5e-5},
    "batch baseline, batch std, lr 2e-4": {"baseline": "batch", "scale_rewards": "batch", "learning_rate": 2e-4},
    "batch baseline, batch std, lr 5e-4": {"baseline": "batch", "scale_rewards": "batch", "learning_rate": 5e-4},
    "batch baseline, no scale, lr 5e-4": {"baseline": "batch", "scale_rewards": "none", "learning_rate": 5e-4},
    "batch baseline, batch std, lr 5e-4, cap 10": {"baseline": "batch", "scale_rewards": "batch",
                                                   "learning_rate": 5e-4, "is_cap": 10.0},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=int, default=512, help="recorded samples (train prompts once, then again)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--only", action="append", default=[], help="run only variants containing this text")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "online_rl_sweep.json")
    add_flag(parser)
    args = parser.parse_args(argv)
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="reef-rl-sweep-"))
    n_train = len(demo.train_tasks())
    t0 = time.perf_counter()
    record_offline_traffic(TINY, work / "data", demo.SCENARIO, prompts=min(args.chats, n_train), samples=1, seed=1)
    if args.chats > n_train:
        record_offline_traffic(TINY, work / "data", demo.SCENARIO, prompts=args.chats - n_train, samples=1, seed=2)
    console.print(f"recorded {args.chats} samples from the base model in {time.perf_counter() - t0:.0f} s")
    results: list[dict[str, Any]] = []
    for name, params in VARIANTS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        recipe = load_recipe("online_rl", {"scenario": demo.SCENARIO, "base_model": str(TINY), "max_steps": args.steps,
                                           "per_device_batch_size": args.batch, **params})
        snap = Snapshot.create(demo.SCENARIO, work / "data", recipe.experience(), root=work / "snaps",
                               ledger_root=work / f"ledger-{len(results)}")
        t0 = time.perf_counter()
        cand = recipe.run(snap, out_root=work / "cands", progress=False, consume=False)
        train_s = time.perf_counter() - t0
        gate = gate_metrics(cand.path, TINY, demo.SCENARIO, GateSettings(samples=args.eval_samples),
                            cand.path / "eval.json")
        if not results:
            results.append({"variant": "base model", "held_out": gate["head_success"]})
        m = cand.metrics
        row = {"variant": name, "params": params, "held_out": gate["candidate_success"], "train_s": train_s,
               "snapshot_samples": m["samples"], "train_samples": m["train_samples"],
               "zero_advantage": m["zero_advantage"], "is_truncated": m.get("is_truncated")}
        results.append(row)
        console.print(f"{name}: held-out {row['held_out']:.1%} ({m['train_samples']} of {m['samples']} samples "
                      f"with a signal, train {train_s:.0f} s)")
    table = Table(title=f"online_rl on one round of demo-add traffic ({args.chats} samples, {args.steps} steps x "
                        f"{args.batch}), held-out success (80 prompts x {args.eval_samples})")
    for col in ("variant", "samples with a signal", "held-out"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in results:
        signal = f"{r['train_samples']} / {r['snapshot_samples']}" if "train_samples" in r else "-"
        table.add_row(r["variant"], signal, f"{r['held_out']:.1%}")
    console.print(table)
    publish(args, "online_rl_sweep", table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
