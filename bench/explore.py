"""One exploration round (recipe `explore`) on the default model, on a scenario whose base earns no
reward: held-out success of the base and of the round's candidate, side by side, and what the
round's rollouts found.

    .venv/bin/python bench/explore.py [--example weather] [--samples 8] [--max-prompts 64] [--then grpo] [--no-results]

The example's scenario is read from its serve.yaml (examples/<name>/, declared only through the
public contract). A vLLM engine serves the default model (SmolLM2-135M-Instruct) as `reef serve`
starts it (LoRA on, the hermes tool-call parser); the round samples the base's rollouts on the
scenario's practice tasks through it, half of a tool task's samples under guided decoding, scores
them with the scenario's reward and fine-tunes a LoRA on the successes. Held-out success: every
eval task `--eval-samples` times at the eval's own temperature and length, as a client asks
(tool_choice left to the server, `auto`), the candidate loaded as an adapter; the interval is a
normal one over per-task means. `--then grpo` runs a second round of that recipe (the ladder's next
rung) from the first round's adapter and measures it the same way. Results: bench/out/explore.json
and bench/RESULTS.md (`explore`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
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
from reef.config import DEFAULT_MODEL, ServeConfig, resolve  # noqa: E402
from reef.engine.supervisor import EngineSupervisor  # noqa: E402
from reef.recipe import Candidate, Snapshot, load_recipe  # noqa: E402
from reef.sampling.engine import Arm, EngineEndpoint, EngineSession, run_session  # noqa: E402
from reef.scenario import Scenario, eval_suite, get_scenario  # noqa: E402

OUT = REPO / "bench" / "out"
SERVED = "smollm2"
console = Console(file=sys.stdout, width=140)


def held_out(engine: EngineEndpoint, scenario: Scenario, adapter: Path | None, samples: int) -> dict[str, Any]:
    """Success on the eval suite (mean of per-task means, 95 % normal interval over tasks)."""
    suite = eval_suite(scenario)

    async def body(session: EngineSession) -> list[list[str]]:
        (model,) = await session.prepare([Arm(adapter=adapter) if adapter else Arm(served=engine.model)])
        return list(await asyncio.gather(*(
            session.replies(model, dict(task), None, 1, samples=samples, max_tokens=suite.max_new_tokens,
                            temperature=suite.temperature, seed=None, as_client=True) for task in suite.tasks)))

    replies = run_session(engine, 8, body)
    scores = suite.score(replies)
    per_task = [statistics.fmean(s.value or 0.0 for s in task) for task in scores]
    mean = statistics.fmean(per_task)
    half = 1.96 * statistics.stdev(per_task) / len(per_task) ** 0.5 if len(per_task) > 1 else 0.0
    return {"success": round(mean, 4), "ci95": [round(max(0.0, mean - half), 4), round(min(1.0, mean + half), 4)],
            "replies": sum(map(len, replies)), "example": replies[0][0][:160]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="weather", help="a folder of examples/ with a serve.yaml")
    parser.add_argument("--samples", type=int, default=8, help="rollouts per practice task")
    parser.add_argument("--max-prompts", type=int, default=64, help="practice tasks the round samples")
    parser.add_argument("--eval-samples", type=int, default=4, help="replies per held-out task and model")
    parser.add_argument("--params", default="{}", help="more explore params, as JSON")
    parser.add_argument("--then", default=None, help="a second round's recipe (e.g. grpo), from the first's adapter")
    parser.add_argument("--then-params", default="{}", help="its params, as JSON")
    parser.add_argument("--candidate", type=Path, default=None,
                        help="a candidate folder an earlier run's round wrote: measured, no round run")
    add_flag(parser)
    args = parser.parse_args()

    config_file = REPO / "examples" / args.example / "serve.yaml"
    config, _ = resolve(config_file=config_file)
    scenario = get_scenario(args.example, config)
    work = Path(tempfile.mkdtemp(prefix="reef-explore-"))
    serve = ServeConfig(model=str(REPO / DEFAULT_MODEL), served_model_name=SERVED, data_dir=work / "data")
    supervisor = EngineSupervisor(serve, work / "vllm.log")
    t0 = time.monotonic()
    url = supervisor.start()
    console.print(f"engine up in {time.monotonic() - t0:.0f} s at {url} (log {work / 'vllm.log'})")
    engine = EngineEndpoint(url, SERVED)
    try:
        t0 = time.monotonic()
        base = held_out(engine, scenario, None, args.eval_samples)
        console.print(f"base held-out success {base['success']:.3f} {base['ci95']} ({time.monotonic() - t0:.0f} s); "
                      f"e.g. {base['example']!r}")
        params = {"scenario": args.example, "base_model": str(REPO / DEFAULT_MODEL), "samples": args.samples,
                  "max_prompts": args.max_prompts, "sample_seed": 0, **json.loads(args.params)}
        t0 = time.monotonic()
        if args.candidate is not None:
            candidate = Candidate.read(args.candidate)
        else:
            recipe = load_recipe("explore", params, declared=scenario)
            recipe.engine = engine
            snap = Snapshot.create(args.example, work / "no-data", recipe.experience(), root=work / "snapshots",
                                   ledger_root=work / "ledger", allow_empty=True)
            candidate = recipe.run(snap, out_root=work / "candidates", progress=False)
        console.print(f"candidate {candidate.path}")
        round_s = time.monotonic() - t0
        m = candidate.metrics
        console.print(f"round {round_s:.0f} s: {m['successes']} of {m['rollouts']} rollouts rewarded "
                      f"({m['guided_successes']} of {m['guided_rollouts']} guided), {m['train_samples']} examples")
        t0 = time.monotonic()
        after = held_out(engine, scenario, candidate.path, args.eval_samples)
        console.print(f"after held-out success {after['success']:.3f} {after['ci95']} ({time.monotonic() - t0:.0f} s);"
                      f" e.g. {after['example']!r}")
        then: dict[str, Any] | None = None
        if args.then:
            t0 = time.monotonic()
            second = load_recipe(args.then, {"scenario": args.example, "base_model": str(REPO / DEFAULT_MODEL),
                                             "init_adapter": str(candidate.path), "sample_seed": 1,
                                             **json.loads(args.then_params)}, declared=scenario)
            second.engine = engine
            snap = Snapshot.create(args.example, work / "no-data", second.experience(), root=work / "snapshots2",
                                   ledger_root=work / "ledger2", allow_empty=True)
            cand2 = second.run(snap, out_root=work / "candidates2", progress=False)
            then_s = time.monotonic() - t0
            then = {"recipe": args.then, "round_s": round(then_s, 1), "metrics": cand2.metrics,
                    **held_out(engine, scenario, cand2.path, args.eval_samples)}
            console.print(f"then {args.then} ({then_s:.0f} s): held-out success {then['success']:.3f} {then['ci95']}")
    finally:
        supervisor.stop()

    table = Table(title=f"one exploration round on {args.example} (SmolLM2-135M-Instruct, {os.cpu_count()} cores)")
    for col in ("model", "held-out success", "95 % CI", "rollouts", "rewarded", "guided rewarded", "examples",
                "round s"):
        table.add_column(col)
    table.add_row("base", f"{base['success']:.3f}", f"{base['ci95']}", "", "", "", "", "")
    table.add_row("after one round", f"{after['success']:.3f}", f"{after['ci95']}", str(m["rollouts"]),
                  str(m["successes"]), f"{m['guided_successes']} of {m['guided_rollouts']}", str(m["train_samples"]),
                  f"{round_s:.0f}" if args.candidate is None else "(earlier run)")
    if then is not None:
        t = then["metrics"]
        table.add_row(f"then one {args.then} round", f"{then['success']:.3f}", f"{then['ci95']}", str(t["rollouts"]),
                      str(t["successes"]), "-", "-", f"{then['round_s']:.0f}")
    console.print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "explore.json").write_text(json.dumps({"example": args.example, "params": params, "base": base,
                                                  "after": after, "round_s": round(round_s, 1), "metrics": m,
                                                  "then": then},
                                                 indent=2, default=str))
    publish(args, f"explore_then_{args.then}" if args.then else "explore", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
