"""Four ways to learn from rewards alone, on the same prompts and the same budget, from the base
model (SmolLM2-135M-Instruct): our exploration path, `online_rl`, our `grpo`, and plain TRL
`GRPOTrainer`; each candidate measured by the gate's held-out evaluation.

    .venv/bin/python bench/rl_compare.py [--example capitals] [--prompts 32] [--generations 8] [--seeds 1]
                                         [--arms explore,online_rl,grpo,trl_grpo] [--no-results]

Per seed s, the practice tasks (`tasks:` minus the eval suite's) are drawn as the recipes draw them
(`random.Random(s).sample`, `--prompts` of them), and every arm samples `--prompts` x
`--generations` completions of the policy at temperature 1 and the eval's max_new_tokens:
- `explore` (recipes/explore): the base's rollouts through our vLLM engine, no early stop (`enough`
  and `max_sample_s` off, so the whole budget is sampled), then SFT on the rewarded ones (expert
  iteration), at the recipe's defaults.
- `online_rl` (recipes/online_rl): the SAME rollouts as explore (read back from its candidate's
  `rollouts/`, token ids and vLLM's behaviour logprobs), grouped by task, trained from the base at
  the recipe's defaults (group baseline, TIS, 60 steps) but as a LoRA like the other arms (its
  default is a full fine-tune). In the live loop it trains on recorded traffic, which is the policy
  sampling too; here the rollouts stand in for it, so its wall time is explore's sampling plus its
  own training.
- `grpo` (recipes/grpo): TRL `GRPOTrainer` whose `rollout_func` samples the trained LoRA through
  our engine each step; `--prompts / 2` steps of 2 prompts x `--generations`.
- `trl_grpo`: plain TRL `GRPOTrainer`, TRL's own generation with transformers (no vLLM), the same
  LoRA, base, training arguments, steps and GRPO settings as `grpo` (the grpo recipe's own
  `load_model` and `training_args`): the two differ only in who generates.
Each candidate (a LoRA) is gated against the base on the scenario's eval suite, through the engine,
with the gate's seeded sampling (the same replies' seeds for every arm, one look at every task):
held-out success with a 95 % normal interval over tasks, the gain over base with the gate's
bootstrap interval, and the gate's decision. Rows per arm and seed; with several seeds, a table of
means with a 95 % t-interval over seeds. The section is written after every seed (a run cut short
keeps what finished). Results: bench/out/rl_compare.json and bench/RESULTS.md (`rl_compare`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import polars as pl  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.learning import t_interval  # noqa: E402
from bench.learning_tiny import quiet  # noqa: E402
from bench.results import add_flag, publish  # noqa: E402
from reef.config import DEFAULT_MODEL, GateSettings, ServeConfig, resolve  # noqa: E402
from reef.engine.supervisor import EngineSupervisor  # noqa: E402
from reef.gate.arms import Weights  # noqa: E402
from reef.gate.evaluate import gate_weights  # noqa: E402
from reef.recipe import Candidate, Snapshot, load_recipe  # noqa: E402
from reef.recipe.practice import practice_tasks  # noqa: E402
from reef.sampling.engine import EngineEndpoint  # noqa: E402
from reef.scenario import Scenario, eval_suite, get_scenario, reward_for  # noqa: E402

OUT = REPO / "bench" / "out"
SERVED = "smollm2"
ARMS = ("explore", "online_rl", "grpo", "trl_grpo")
PROMPTS_PER_STEP = 2  # grpo's default: a step is 2 prompts x --generations completions
console = Console(file=sys.stdout, width=150)


@dataclasses.dataclass(frozen=True)
class RolloutSnapshot(Snapshot):
    """A snapshot whose samples are an exploration round's rollouts, as online_rl reads recorded
    traffic (`samples()`: ids, behaviour logprobs, score, group)."""

    rows: pl.DataFrame = dataclasses.field(default_factory=pl.DataFrame)

    def samples(self) -> pl.DataFrame:
        return self.rows


class Bench:
    def __init__(self, args: argparse.Namespace, scenario: Scenario, engine: EngineEndpoint, work: Path) -> None:
        self.args, self.scenario, self.engine, self.work = args, scenario, engine, work
        self.base = str(REPO / DEFAULT_MODEL)
        self.suite = eval_suite(scenario)

    def params(self, seed: int, **more: Any) -> dict[str, Any]:
        """A recipe's params: the training seed; a sampling recipe also draws the seed's prompts."""
        return {"scenario": self.scenario.name, "base_model": self.base, "seed": seed, **more}

    def sampling(self, seed: int, **more: Any) -> dict[str, Any]:
        return self.params(seed, sample_seed=seed, max_prompts=self.args.prompts, **more)

    def run_recipe(self, name: str, params: dict[str, Any], folder: Path,
                   snapshot: Snapshot | None = None) -> Candidate:
        recipe = load_recipe(name, params, declared=self.scenario)
        recipe.engine = self.engine
        snap = snapshot or Snapshot.create(self.scenario.name, folder / "no-data", recipe.experience(),
                                           root=folder / "snapshots", ledger_root=folder / "ledger", allow_empty=True)
        with quiet(folder / "train.log"):
            return recipe.run(snap, out_root=folder / "candidates", progress=False)

    # --- the arms: each returns (adapter folder, samples, rewarded, train s, notes) ----------------

    def explore(self, seed: int, folder: Path) -> dict[str, Any]:
        self.rollouts: Path | None = None  # this seed's, once its round wrote them
        t0 = time.monotonic()
        cand = self.run_recipe("explore", self.sampling(seed, samples=self.args.generations, enough=None,
                                                      max_sample_s=None), folder)
        m = cand.metrics
        self.rollouts = cand.path / "rollouts" / "rollouts.parquet"
        self.sample_s = float(m["sample_s"])
        return {"adapter": cand.path, "samples": m["rollouts"], "rewarded": m["successes"],
                "train_s": time.monotonic() - t0,
                "note": f"sampling {m['sample_s']:.0f} s, SFT on {m['train_samples']} examples, "
                        f"{len(cand.training_log or [])} steps"}

    def online_rl(self, seed: int, folder: Path) -> dict[str, Any]:
        if not getattr(self, "rollouts", None):
            raise RuntimeError("online_rl trains on explore's rollouts: none this seed (see explore's row)")
        frame = pl.read_parquet(self.rollouts)
        rows = frame.select(
            pl.format("rollout-{}", pl.int_range(pl.len())).alias("record_id"),
            pl.col("task_index").cast(pl.String).alias("group"), pl.col("reward").fill_null(0.0).alias("score"),
            pl.lit(1.0).alias("weight"), "prompt_ids", "completion_ids", "logprobs", "text")
        params = self.params(seed, kind="lora")  # its default is a full fine-tune; every arm here trains a LoRA
        recipe = load_recipe("online_rl", params, declared=self.scenario)
        empty = Snapshot.create(self.scenario.name, folder / "no-data", recipe.experience(), root=folder / "snapshots",
                                ledger_root=folder / "ledger", allow_empty=True)
        manifest = {**empty.manifest, "hash": f"rollouts-{seed}-{frame.height}",
                    "record_ids": rows["record_id"].to_list()}
        snap = RolloutSnapshot(empty.path, manifest, rows)
        t0 = time.monotonic()
        cand = self.run_recipe("online_rl", params, folder, snap)
        m = cand.metrics
        return {"adapter": cand.path, "samples": frame.height, "rewarded": int(frame["success"].sum()),
                "train_s": self.sample_s + time.monotonic() - t0,
                "note": f"explore's rollouts ({self.sample_s:.0f} s of its sampling counted) + "
                        f"{time.monotonic() - t0:.0f} s training; {m['train_samples']} samples with an advantage, "
                        f"{len(cand.training_log or [])} steps"}

    def grpo(self, seed: int, folder: Path) -> dict[str, Any]:
        t0 = time.monotonic()
        cand = self.run_recipe("grpo", self.sampling(seed, **self.grpo_settings()), folder)
        m = cand.metrics
        return {"adapter": cand.path, "samples": m["rollouts"], "rewarded": m["successes"],
                "train_s": time.monotonic() - t0,
                "note": f"{len(cand.training_log or [])} steps, {m['rewarded_steps']} with a reward"}

    def grpo_settings(self) -> dict[str, Any]:
        return {"num_generations": self.args.generations, "prompts_per_step": PROMPTS_PER_STEP,
                "max_steps": max(1, self.args.prompts // PROMPTS_PER_STEP)}

    def trl_grpo(self, seed: int, folder: Path) -> dict[str, Any]:
        """Plain TRL GRPOTrainer: TRL generates with transformers; the rest as the grpo recipe sets it."""
        import datasets
        import torch
        import transformers
        from trl import GRPOConfig, GRPOTrainer

        recipe = load_recipe("grpo", self.sampling(seed, **self.grpo_settings()), declared=self.scenario)
        c = recipe.config
        tasks, _ = practice_tasks(self.scenario)
        picked = random.Random(seed).sample(range(len(tasks)), min(self.args.prompts, len(tasks)))  # as grpo draws
        dataset = datasets.Dataset.from_list([{"prompt": tasks[i]["messages"], "task_index": i} for i in picked])
        reward = reward_for(self.scenario)
        seen: list[float] = []

        def score(prompts: list[Any], completions: list[Any], task_index: list[int], **_: Any) -> list[float]:
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            values = [s.value or 0.0 for s in reward([tasks[i] for i in task_index], texts)]
            seen.extend(values)
            return values

        out = folder / "trl_grpo"
        threads = torch.get_num_threads()
        torch.set_num_threads(int(os.environ.get("REEF_TRAIN_THREADS", "1")))  # as Recipe.run trains
        try:
            transformers.set_seed(seed)
            model, tokenizer = recipe.load_model()
            args = GRPOConfig(**{**recipe.training_args(out / ".trainer"), "disable_tqdm": True, "report_to": [],
                                 "per_device_train_batch_size": c.prompts_per_step * c.num_generations},
                              num_generations=c.num_generations, max_completion_length=self.suite.max_new_tokens,
                              temperature=c.temperature, beta=c.beta, remove_unused_columns=False,
                              log_completions=False)
            trainer = GRPOTrainer(model=model, reward_funcs=[score], args=args, train_dataset=dataset,
                                  processing_class=tokenizer)
            t0 = time.monotonic()
            with quiet(folder / "train.log"):
                trainer.train()
            train_s = time.monotonic() - t0
        finally:
            torch.set_num_threads(threads)
        trainer.model.save_pretrained(out)
        steps = trainer.state.global_step
        rewarded_steps = sum(1 for row in trainer.state.log_history if row.get("reward", 0) > 0)
        return {"adapter": out, "samples": len(seen), "rewarded": int(sum(v >= 1.0 for v in seen)), "train_s": train_s,
                "note": f"{steps} steps, {rewarded_steps} with a reward; generation by transformers"}

    # --- measuring ----------------------------------------------------------------------------------

    def gate(self, adapter: Path) -> dict[str, Any]:
        """The gate's held-out comparison of `adapter` with the base, on the engine, one look at every task."""
        t0 = time.monotonic()
        result = gate_weights(Weights(Path(self.base), adapter), Weights(Path(self.base), served=SERVED), self.suite,
                              GateSettings(looks=1), engine=self.engine, head_label="base", progress=False)
        cand = [o.candidate_score for o in result.per_prompt if o.candidate_score is not None]
        head = [o.head_score for o in result.per_prompt if o.head_score is not None]
        return {"decision": result.decision, "reason": result.reason, "success": result.candidate_success,
                "ci95": normal_interval(cand), "base": result.head_success, "base_ci95": normal_interval(head),
                "delta": result.delta, "delta_ci": [result.ci_low, result.ci_high], "eval_s": time.monotonic() - t0}


def normal_interval(per_task: list[float]) -> list[float]:
    """A 95 % normal interval of the mean over tasks (as bench/explore.py reports held-out success)."""
    if len(per_task) < 2:
        return [0.0, 1.0]
    mean, half = statistics.fmean(per_task), 1.96 * statistics.stdev(per_task) / len(per_task) ** 0.5
    return [round(max(0.0, mean - half), 3), round(min(1.0, mean + half), 3)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[Table | Text]:
    budget = f"{args.prompts} prompts x {args.generations} generations"
    table = Table(title=f"{args.example}, SmolLM2-135M-Instruct from base, {budget} per arm and seed")
    for col in ("arm", "seed", "samples", "rewarded", "train wall s", "held-out success", "95 % CI", "gain over base",
                "gate's CI of the gain", "gate", "notes"):
        table.add_column(col)
    for r in rows:
        if "error" in r:
            table.add_row(r["arm"], str(r["seed"]), "-", "-", "-", "-", "-", "-", "-", "failed", r["error"][:160])
            continue
        g = r["gate"]
        table.add_row(r["arm"], str(r["seed"]), str(r["samples"]), str(r["rewarded"]), f"{r['train_s']:.0f}",
                      _pct(g["success"]), f"[{_pct(g['ci95'][0])}, {_pct(g['ci95'][1])}]",
                      f"{(g['delta'] or 0) * 100:+.1f} pts (base {_pct(g['base'])})",
                      f"[{(g['delta_ci'][0] or 0) * 100:+.1f}, {(g['delta_ci'][1] or 0) * 100:+.1f}]",
                      g["decision"], r["note"])
    parts: list[Table | Text] = [table]
    seeds = sorted({r["seed"] for r in rows})
    if len(seeds) > 1:
        over = Table(title=f"over {len(seeds)} seeds: mean with a 95 % t-interval")
        for col in ("arm", "seeds done", "held-out success", "gain over base (pts)", "rewarded samples",
                    "train wall s"):
            over.add_column(col)
        for arm in args.arms:
            done = [r for r in rows if r["arm"] == arm and "gate" in r]
            if not done:
                over.add_row(arm, "0", "-", "-", "-", "-")
                continue
            s = t_interval([r["gate"]["success"] or 0.0 for r in done])
            d = t_interval([(r["gate"]["delta"] or 0.0) * 100 for r in done])
            over.add_row(arm, str(len(done)), f"{s[0]:.1%} [{s[1]:.1%}, {s[2]:.1%}]",
                         f"{d[0]:+.1f} [{d[1]:+.1f}, {d[2]:+.1f}]",
                         f"{statistics.fmean(r['rewarded'] for r in done):.1f}",
                         f"{statistics.fmean(r['train_s'] for r in done):.0f}")
        parts.append(over)
    parts.append(Text(
        "Same prompts (the recipes' draw for the seed) and the same number of sampled completions per arm. "
        "explore and grpo sample through our vLLM engine (no users); online_rl trains on explore's rollouts, so its "
        "wall time counts explore's sampling; trl_grpo generates with transformers. Held-out: the gate against the "
        "base on the eval suite (its seeded replies, one look); the 95 % CI of success is a normal interval over "
        "tasks, the gain's is the gate's bootstrap interval. Train wall s includes sampling, not the gate. "
        f"Machine shared with other work (nice {args.nice_note})."))
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="capitals", help="a folder of examples/ with a serve.yaml (no tools)")
    parser.add_argument("--prompts", type=int, default=32, help="practice tasks per arm and seed")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--arms", type=lambda v: [a for a in v.split(",") if a], default=list(ARMS),
                        help=f"comma-separated, of {','.join(ARMS)} (online_rl needs explore)")
    add_flag(parser)
    args = parser.parse_args()
    unknown = set(args.arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    args.nice_note = os.nice(0)

    config, _ = resolve(config_file=REPO / "examples" / args.example / "serve.yaml")
    scenario = get_scenario(args.example, config)
    work = Path(tempfile.mkdtemp(prefix="reef-rlcompare-"))
    serve = ServeConfig(model=str(REPO / DEFAULT_MODEL), served_model_name=SERVED, data_dir=work / "data")
    supervisor = EngineSupervisor(serve, work / "vllm.log")
    t0 = time.monotonic()
    url = supervisor.start()
    console.print(f"engine up in {time.monotonic() - t0:.0f} s at {url}; work {work}")
    bench = Bench(args, scenario, EngineEndpoint(url, SERVED), work)
    rows: list[dict[str, Any]] = []
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for arm in args.arms:
                folder = work / f"seed{seed}" / arm
                console.print(f"seed {seed} {arm}: training ...")
                try:
                    row: dict[str, Any] = {"arm": arm, "seed": seed, **getattr(bench, arm)(seed, folder)}
                    row["gate"] = bench.gate(Path(row["adapter"]))
                except Exception as exc:  # noqa: BLE001 - an arm that fails is reported, the others still run
                    traceback.print_exc()
                    row = {"arm": arm, "seed": seed, "error": f"{type(exc).__name__}: {exc}"}
                rows.append(row)
                console.print({k: v for k, v in row.items() if k != "adapter"})
            (OUT / "rl_compare.json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items()},
                                                             "rows": rows}, indent=2, default=str))
            parts = report(rows, args)
            for part in parts:
                console.print(part)
            publish(args, "rl_compare", *parts)
    finally:
        supervisor.stop()
    return 0 if all("gate" in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
