"""(c) learning: LoRA (r=16, all linear projections, fp32) on one task, then held-out success.

Recipes
  rft        sample --samples replies per train prompt at T=1.0 with the plain (base) prompt, keep the
             rewarded ones, SFT on them with the plain prompt.
  coldstart  sample with the few-shot harness prompt (format system prompt + shots), keep the rewarded
             ones, SFT on them WITHOUT the harness (distil the harness into weights).
  hindsight  no sampling: SFT on the verifier's expected reply (demonstrations) with the plain prompt.

    cd /work/rm/bench/smollm2_probe && OMP_NUM_THREADS=2 nice -n 10 /work/main/.venv/bin/python \
        rft.py --task demo --recipe hindsight --steps 30 --lr 3e-4
Writes results/rft_<task>_<recipe>_<tag>.json.
"""

import argparse
import json
import os
import time

from common import TASKS, add_lora, evaluate, load, render, sft

MAX_NEW = {"demo": 12, "reviews": 12, "rules": 20, "shop": 40}

ap = argparse.ArgumentParser()
ap.add_argument("--task", required=True)
ap.add_argument("--recipe", default="rft", choices=["rft", "coldstart", "hindsight"])
ap.add_argument("--prompts", type=int, default=64, help="train prompts to sample on / train on")
ap.add_argument("--samples", type=int, default=4)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--lr", type=float, default=3e-4)
ap.add_argument("--bs", type=int, default=8)
ap.add_argument("--r", type=int, default=16)
ap.add_argument("--n", type=int, default=48, help="held-out items")
ap.add_argument("--eval-every", type=int, default=0)
ap.add_argument("--train-mode", default="base", help="prompt rendering used for training & eval")
ap.add_argument("--tag", default="")
args = ap.parse_args()
os.makedirs("results", exist_ok=True)
log = lambda s: print(s, flush=True)  # noqa: E731

task = TASKS[args.task](n_heldout=args.n)
tok, model = load()
mx = MAX_NEW[args.task]
train = task.train[: args.prompts]
res: dict = {"args": vars(args), "curve": []}

t0 = time.time()
if args.recipe == "hindsight":
    examples = [(render(tok, task, it, args.train_mode), it.target) for it in train]
    res["sampling"] = {"wall_s": 0.0, "kept": len(examples), "drawn": 0}
else:
    mode = "base" if args.recipe == "rft" else "fewshot"
    prompts = [render(tok, task, it, mode) for it in train for _ in range(args.samples)]
    items = [it for it in train for _ in range(args.samples)]
    from common import generate
    replies = generate(tok, model, prompts, 1.0, mx, seed=1)
    kept = {}
    for it, rep in zip(items, replies, strict=False):
        if task.verify(rep, it):
            kept[(it.user, rep.strip())] = (render(tok, task, it, args.train_mode), rep.strip())
    examples = list(kept.values())
    res["sampling"] = {"wall_s": time.time() - t0, "drawn": len(replies), "kept": len(examples),
                       "reward_rate": sum(task.verify(r, i) for r, i in zip(replies, items, strict=False)) / len(items)}
log(f"{args.task}/{args.recipe}: {len(examples)} training examples "
    f"(sampling {res['sampling']['wall_s']:.1f}s, {res['sampling']})")
if not examples:
    log("no rewarded samples: nothing to train on")
    json.dump(res, open(f"results/rft_{args.task}_{args.recipe}{args.tag}.json", "w"), indent=1)
    raise SystemExit(0)

model = add_lora(model, r=args.r, alpha=2 * args.r)


eval_time = [0.0]


def ev(step: int) -> None:
    e0 = time.time()
    g, reps, dt = evaluate(tok, model, task, args.train_mode, 0.0, mx)
    res["curve"].append({"step": step, "greedy": g, "train_wall_s": e0 - t1 - eval_time[0]})
    eval_time[0] += time.time() - e0
    log(f"  [eval step {step}] held-out greedy {g:.3f} (train wall so far "
        f"{res['curve'][-1]['train_wall_s']:.1f}s) e.g. {reps[0]!r}")


t1 = time.time()
stats = sft(tok, model, examples, args.steps, args.lr, bs=args.bs, log=log,
            eval_cb=ev if args.eval_every else None, eval_every=args.eval_every)
train_wall = time.time() - t1 - eval_time[0]

g, reps_g, dtg = evaluate(tok, model, task, args.train_mode, 0.0, mx)
t, reps_t, dtt = evaluate(tok, model, task, args.train_mode, 1.0, mx)
steps_wall = [s["wall_s"] for s in stats]
res.update({
    "train_wall_s": train_wall, "step_wall_mean_s": sum(steps_wall) / len(steps_wall),
    "step_cpu_mean_s": sum(s["cpu_s"] for s in stats) / len(stats),
    "tok_per_s_mean": sum(s["tokens"] for s in stats) / sum(steps_wall),
    "final_loss": stats[-1]["loss"], "heldout_greedy": g, "heldout_t1": t,
    "samples_greedy": reps_g[:6], "samples_t1": reps_t[:6], "total_wall_s": time.time() - t0,
})
log(f"RESULT {args.task}/{args.recipe}{args.tag}: steps {args.steps} lr {args.lr} -> held-out greedy "
    f"{g:.3f}, T=1 {t:.3f}; train {train_wall:.1f}s ({res['step_wall_mean_s']:.2f}s/step wall, "
    f"{res['step_cpu_mean_s']:.2f}s/step cpu, {res['tok_per_s_mean']:.0f} tok/s); e.g. {reps_g[:2]!r}")
json.dump(res, open(f"results/rft_{args.task}_{args.recipe}{args.tag}.json", "w"), indent=1)
