"""(a) base success and (b) harness-only success on the held-out split.

    cd /work/rm/bench/smollm2_probe && OMP_NUM_THREADS=2 nice -n 10 \
        /work/main/.venv/bin/python baseline.py [--tasks demo,reviews,rules,shop] [--n 64]
Writes results/baseline_<task>.json (rates + a few sample replies).
"""

import argparse
import json
import os

from common import TASKS, evaluate, load

MAX_NEW = {"demo": 12, "reviews": 12, "rules": 20, "shop": 40}

ap = argparse.ArgumentParser()
ap.add_argument("--tasks", default="demo,reviews,rules,shop")
ap.add_argument("--modes", default="base,system,shots,fewshot")
ap.add_argument("--n", type=int, default=64)
ap.add_argument("--temps", default="1.0,0.0")
args = ap.parse_args()
os.makedirs("results", exist_ok=True)
tok, model = load()
for name in args.tasks.split(","):
    task = TASKS[name](n_heldout=args.n)
    res = {"task": name, "n": len(task.heldout), "max_new": MAX_NEW[name], "rows": []}
    for mode in args.modes.split(","):
        for temp in [float(x) for x in args.temps.split(",")]:
            rate, replies, dt = evaluate(tok, model, task, mode, temp, MAX_NEW[name])
            print(f"{name:8s} {mode:8s} T={temp} success {rate:.3f}  ({dt:.1f}s)  e.g. "
                  f"{replies[0]!r} | {replies[1]!r}", flush=True)
            res["rows"].append({"mode": mode, "temperature": temp, "success": rate, "wall_s": dt,
                                "samples": replies[:6]})
    json.dump(res, open(f"results/baseline_{name}.json", "w"), indent=1)
