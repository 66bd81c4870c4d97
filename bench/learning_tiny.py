"""The whole learning loop on the engine-mechanics model (the from-scratch tiny model the tests
use), from simulated traffic only, vs. plain TRL GRPO. The bundled examples learn on the default
model instead: bench/learning.py.

    .venv/bin/python bench/learning_tiny.py [--scenarios demo-add] [--rounds 3] [--requests 512]
                                            [--recipe rft] [--param max_steps=30]

`demo-add` is declared by the tests' helpers (single-digit addition, a task the tiny model's corpus
taught it with a systematic "+1" teacher); `--scenarios` also takes an example folder declared for the tiny model.
Per scenario, loop: start `reef serve` (managed vLLM,
the tests' tiny model) in a temporary workdir -> simulate `--requests` chats with rewards through
the OpenAI SDK -> wait until the gateway has flushed them -> one learning round with the framework
(Snapshot.create on the serve data dir, recipe.run, evaluate on the scenario's 80 held-out
prompts) -> repeat with more traffic. The served model does NOT
change between rounds (releasing candidates into the server is a later issue), so every round's
traffic comes from the base model; each round's candidate continues from the previous one
(`--no-chain`: from the base model, on that round's traffic only).
The demo has 320 train prompts and the store flags an exact repeat of an earlier record (same
prompt, same reply) as a duplicate, which rft drops: later rounds bring fewer new correct samples.

Beside them, `demo-add-next-turn` (`--no-next-turn`: off): demo-add's task, eval and users, but the
users never report; every one of them reacts to a reply instead (a doubt when it is wrong, a
thank-you when it is right, up to two reactions: reef.traffic.simulate), and the `next_turn` recipe
learns from those next turns alone (target: >= 60 % held-out).

Then, for demo-add, plain TRL `GRPOTrainer` (no vLLM: TRL generates with transformers) trains the
base model on the same number of samples (prompts x completions) as the loop recorded, with the
demo verifier as reward, and is evaluated the same way. Targets: base <= 30 % on each scenario,
best candidate >= 80 % on demo-add. Results: bench/out/learning_tiny.json and bench/out/learning_tiny.png.

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: one thread is faster (see the CPU notes)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import GateSettings, parse_overrides, resolve  # noqa: E402
from reef.learn.pipeline import gate_metrics  # noqa: E402
from reef.recipe import EmptySnapshotError, Snapshot, load_recipe  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402
from reef.traffic.simulate import simulate  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402
from tests.helpers.tiny import task as demo  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
EXAMPLES = REPO / "examples"
NEXT_TURN = "demo-add-next-turn"  # demo-add with reports off, learning from the users' next turns
TARGETS = {"demo-add": 0.80, NEXT_TURN: 0.60}  # best held-out; base <= 30 % for all
# How the next-turn arm's users behave: no reports, every user reacts (at most twice).
NEXT_TURN_USERS = {"report": False, "follow_up_share": 1.0, "reactions": 2}
DEFAULT_PARAMS: dict[str, Any] = {"max_steps": 30}
OUT = REPO / "bench" / "out"
# Base-model files that are weights or build metadata: a trained model folder writes its own.
_NOT_COPIED = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "reef-model.json"}
# Bound to the real stdout: trainers' log dicts printed during training go to a log file instead.
console = Console(file=sys.stdout, width=120)


@dataclass
class Round:
    round: int
    requests: int  # chats recorded this round (simulated users, follow-up turns included)
    traffic_mean_score: float
    samples_seen: int  # recorded samples so far (all rounds)
    snapshot_records: int
    snapshot_counts: dict[str, int]
    train_samples: int | None
    train_s: float
    eval_s: float
    candidate: str
    candidate_success: float
    head_success: float
    delta: float
    ci_low: float
    ci_high: float
    # next_turn: the replies its next turns accepted / rejected, and the hinted targets distilled
    signals: dict[str, Any] | None = None


@dataclass
class ScenarioResult:
    scenario: str
    simulate_s: float = 0.0
    rounds: list[Round] = field(default_factory=list)
    base_success: float | None = None
    grpo: dict[str, Any] | None = None


@dataclass
class Result:
    config: dict[str, Any]
    serve_start_s: float = 0.0
    scenarios: dict[str, ScenarioResult] = field(default_factory=dict)
    elapsed_s: float = 0.0


def write_serve_yaml(work: Path, scenarios: list[str]) -> Path:
    """The workdir's serve.yaml: every example scenario asked for (examples/<name>/serve.yaml, its
    files found in its own folder); demo-add (the tests' entry points) needs none; the next-turn arm
    is demo-add's declaration under another name (its own records, ledger and chain)."""
    config: dict[str, Any] = {"scenarios": {}, "recipes": {}}
    if NEXT_TURN in scenarios:
        from reef.scenario import get_scenario

        config["scenarios"][NEXT_TURN] = get_scenario(demo.SCENARIO).model_dump(mode="json", exclude={"name"})
    for name in scenarios:
        folder = EXAMPLES / name
        if (folder / "serve.yaml").is_file():
            declared = yaml.safe_load((folder / "serve.yaml").read_text())
            config["recipes"].update(declared.get("recipes") or {})
            for key, spec in declared["scenarios"].items():
                config["scenarios"][key] = {**spec, "base_dir": str(folder)}
    path = work / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_flushed(url: str, scenario: str, expected_records: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """Until the scenario's records and reports are all in parquet (and at least `expected_records`)."""
    deadline = time.monotonic() + timeout_s
    s: dict[str, Any] = {}
    while time.monotonic() < deadline:
        s = httpx.get(f"{url}/reef/status", timeout=10).json()["scenarios"].get(scenario, {})
        if (s.get("records", 0) >= expected_records and not s.get("unflushed_records")
                and not s.get("unflushed_reports")):
            return s
        time.sleep(0.25)
    raise TimeoutError(f"gateway did not flush {expected_records} records within {timeout_s} s: {s}")


def copy_model_files(base: Path, out: Path) -> None:
    """Tokenizer/config files of `base` into `out`, as a recipe's full candidate has them."""
    out.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and item.name not in _NOT_COPIED:
            shutil.copy2(item, out / item.name)


@contextlib.contextmanager
def quiet(log: Path) -> Iterator[None]:
    """Trainers print their log dicts to stdout: append them to `log`, keep the console for progress."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f, contextlib.redirect_stdout(f):
        yield


def example_params(scenario: str) -> dict[str, Any]:
    """The recipe params an example's serve.yaml gives its scenario (`recipes.<its recipe>.params`):
    what that user's learner would train with, e.g. shop's whole sessions (`trajectories`) at its own
    lr and steps. Taken where the bench's recipe has them, over DEFAULT_PARAMS (--param overrides both)."""
    path = REPO / "examples" / scenario / "serve.yaml"
    if not path.is_file():
        return {}
    config, _ = resolve(config_file=path)
    declared = config.scenarios.get(scenario)
    entry = config.recipes.get(declared.recipe) if declared is not None and declared.recipe else None
    return dict(entry.params) if entry is not None else {}


def learning_round(r: int, scenario: str, data_dir: Path, work: Path, base: Path, args: argparse.Namespace,
                   overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], float, float]:
    """Snapshot the new traffic, train a candidate on it, evaluate it on the held-out prompts."""
    from dataclasses import fields

    from reef.recipe.loading import resolve as resolve_recipe

    ref, defaults, overrides = ("next_turn", {}, parse_overrides(args.next_turn_param)) if scenario == NEXT_TURN else (
        args.recipe, DEFAULT_PARAMS, overrides)
    known = {f.name for f in fields(resolve_recipe(ref).config_class)}
    needed = {k: v for k, v in example_params(scenario).items() if k in known}
    params = {"scenario": scenario, "base_model": str(base), "seed": r, **defaults, **needed, **overrides}
    recipe = load_recipe(ref, params)
    snap = Snapshot.create(scenario, data_dir, recipe.experience(), root=work / "snapshots",
                           ledger_root=work / "ledger")
    t0 = time.perf_counter()
    what = f"{recipe.name} ({recipe.config.kind}, {recipe.config.max_steps} steps) on {len(snap.record_ids)} records"
    with console.status(f"{scenario} round {r}: training {what}..."), quiet(work / "train.log"):
        candidate = recipe.run(snap, out_root=work / "candidates", progress=False)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with console.status(f"{scenario} round {r}: evaluating on the held-out prompts..."), quiet(work / "train.log"):
        metrics = evaluate(candidate.path, scenario, args)
    return candidate.to_json() | {"snapshot": snap.manifest}, metrics, train_s, time.perf_counter() - t0


def evaluate(candidate: Path, scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    """The gate's comparison with the base model (transformers; the scenario's eval settings)."""
    return gate_metrics(candidate, TINY, scenario, GateSettings(samples=args.eval_samples), candidate / "eval.json")


def run_grpo(samples: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Plain TRL GRPOTrainer on the base model: TRL samples `samples` completions itself (with
    transformers, no vLLM), rewarded by the demo verifier."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    g, batch = args.grpo_generations, args.grpo_batch
    steps = max(1, round(samples / batch))
    tasks = demo.train_tasks(args.seed)
    by_id = {t.task_id: t for t in tasks}
    prompts = [tasks[i % len(tasks)] for i in range(steps * batch // g)]
    dataset = Dataset.from_dict({"prompt": [t.messages for t in prompts], "task_id": [t.task_id for t in prompts]})

    def reward(prompts: list[Any], completions: list[Any], task_id: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [demo.score(by_id[t], text) for text, t in zip(texts, task_id, strict=True)]

    config = GRPOConfig(
        output_dir=str(out / ".trainer"), max_steps=steps, per_device_train_batch_size=batch, num_generations=g,
        max_completion_length=16, temperature=1.0, learning_rate=args.grpo_lr, lr_scheduler_type="constant",
        warmup_steps=0, seed=args.seed, data_seed=args.seed,
        # Per the CPU notes: TRL's defaults (bf16, gradient checkpointing) only cost time on CPU.
        bf16=False, gradient_checkpointing=False, use_cpu=True,
        save_strategy="no", report_to=[], logging_steps=max(1, steps // 4), dataloader_num_workers=0,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(TINY)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer)
        t0 = time.perf_counter()
        with quiet(out.parent / "train.log"):  # the progress bar stays (stderr), the log dicts go to the file
            result = trainer.train()
        train_s = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    shutil.rmtree(out / ".trainer", ignore_errors=True)
    copy_model_files(TINY, out)
    trainer.model.save_pretrained(out)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    t0 = time.perf_counter()
    metrics = evaluate(out, demo.SCENARIO, args)
    return {
        "samples": steps * batch, "prompts": len(prompts), "num_generations": g, "steps": steps,
        "learning_rate": args.grpo_lr, "train_s": train_s, "eval_s": time.perf_counter() - t0,
        "train_loss": result.metrics.get("train_loss"), "train_reward_first": rewards[0] if rewards else None,
        "train_reward_last": rewards[-1] if rewards else None, "metrics": metrics,
        "candidate_success": metrics["candidate_success"], "path": str(out),
    }


def recipe_of(name: str, result: Result) -> str:
    return "next_turn, no reports" if name == NEXT_TURN else result.config["recipe"]


def plot(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, sr), color in zip(result.scenarios.items(), ("#2a7fbf", "#8e44ad", "#16a085", "#c0392b"), strict=False):
        xs = [0] + [r.samples_seen for r in sr.rounds]
        ys = [sr.base_success or 0.0] + [r.candidate_success for r in sr.rounds]
        ax.plot(xs, ys, "o-", color=color, label=f"{name}: Reef loop ({recipe_of(name, result)} candidates)")
        ax.axhline(sr.base_success or 0.0, color=color, ls=":", lw=0.8)
        if sr.grpo:
            ax.plot([sr.grpo["samples"]], [sr.grpo["candidate_success"]], "s", color="#d9822b", ms=9,
                    label=f"{name}: plain TRL GRPOTrainer, same samples")
    ax.set_xlabel("recorded samples per scenario (prompts x completions)")
    ax.set_ylabel("held-out success (80 prompts)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"held-out success vs. traffic; dotted: base ({result.elapsed_s:.0f} s on {os.cpu_count()} cores)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_scenario(sr: ScenarioResult, result: Result) -> Table:
    table = Table(title=f"held-out success on {sr.scenario} (80 prompts x {result.config['eval_samples']} samples, "
                        f"temperature 1)")
    # "sampled reward": mean reward of the samples trained on, as they were generated (the
    # loop's come from the served base model; GRPO's from its own policy, first -> last logged step).
    for col in ("model", "trained on", "sampled reward", "train samples", "train s", "held-out success",
                "vs. base, 95 % CI"):
        table.add_column(col, justify="right" if col != "model" else "left")
    table.add_row("base (served by vLLM)", "-", "-", "-", "-", f"{sr.base_success or 0:.1%}", "-")
    for r in sr.rounds:
        err = f" [{r.ci_low:+.1%}, {r.ci_high:+.1%}]"
        table.add_row(f"round {r.round} ({recipe_of(sr.scenario, result)})", f"{r.samples_seen} recorded",
                      f"{r.traffic_mean_score:.1%}", str(r.train_samples if r.train_samples is not None else "-"),
                      f"{r.train_s:.1f}", f"{r.candidate_success:.1%}", f"{r.delta:+.1%}{err}")
    if sr.grpo:
        g = sr.grpo
        err = f" [{g['metrics']['ci_low']:+.1%}, {g['metrics']['ci_high']:+.1%}]"
        table.add_row("TRL GRPOTrainer, no vLLM", f"{g['samples']} generated",
                      f"{g['train_reward_first']:.0%} -> {g['train_reward_last']:.0%}",
                      f"{g['prompts']} x {g['num_generations']}", f"{g['train_s']:.1f}",
                      f"{g['candidate_success']:.1%}", f"{g['metrics']['delta']:+.1%}{err}")
    console.print(table)
    return table


def report(result: Result) -> list[Table | Text]:
    """Print the tables and verdicts; returns them for the results file."""
    printed: list[Table | Text] = [report_scenario(sr, result) for sr in result.scenarios.values()]
    side = Table(title="side by side: base and best held-out success per scenario")
    for col in ("scenario", "base", "best candidate", "target", "plain TRL GRPOTrainer"):
        side.add_column(col, justify="right" if col != "scenario" else "left")
    mark = {True: "[green]ok[/green]", False: "[red]MISSED[/red]"}
    verdicts = []
    for name, sr in result.scenarios.items():
        best = max(sr.rounds, key=lambda r: r.candidate_success) if sr.rounds else None
        target = TARGETS.get(name, 0.70)
        base_ok = sr.base_success is not None and sr.base_success <= 0.30
        best_ok = best is not None and best.candidate_success >= target
        side.add_row(name, f"{sr.base_success or 0:.1%} {mark[base_ok]}",
                     f"{best.candidate_success:.1%} (round {best.round}) {mark[best_ok]}" if best else "-",
                     f"base <= 30 %, best >= {target:.0%}",
                     f"{sr.grpo['candidate_success']:.1%} ({sr.grpo['samples']} samples)" if sr.grpo else "-")
        verdicts.append(base_ok and best_ok)
    verdict = f"targets: {mark[all(verdicts)]}; elapsed {result.elapsed_s:.0f} s"
    console.print(side)
    console.print(verdict)
    console.print("[dim]note: the served model stayed the base model throughout (this bench releases nothing), "
                  "so every round's traffic was sampled from the base model.[/dim]")
    return [*printed, side, Text.from_markup(verdict)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="demo-add",
                        help="comma-separated; a name with a folder in examples/ is declared by its serve.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=512, help="simulated chats per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--recipe", default="rft", help="recipe name or module:Class")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="recipe parameter override (repeatable), e.g. max_steps=30 kind=lora")
    parser.add_argument("--no-chain", action="store_true",
                        help="train every round's candidate from the base model (default: from the previous one)")
    parser.add_argument("--eval-samples", type=int, default=8, help="samples per held-out prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-grpo", action="store_true", help="skip the plain TRL GRPOTrainer comparison (demo-add)")
    parser.add_argument("--no-next-turn", action="store_true",
                        help=f"skip {NEXT_TURN} (demo-add without reports, the next_turn recipe)")
    parser.add_argument("--next-turn-param", action="append", default=[], metavar="KEY=VALUE",
                        help="next_turn recipe parameter override for that arm (repeatable)")
    parser.add_argument("--grpo-generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--grpo-batch", type=int, default=32, help="completions per step")
    parser.add_argument("--grpo-lr", type=float, default=1e-4)
    parser.add_argument("--workdir", type=Path, help="keep the server data, snapshots and candidates here "
                                                     "(default: a temporary folder, removed afterwards)")
    parser.add_argument("--out", type=Path, default=OUT / "learning_tiny.json")
    parser.add_argument("--plot", type=Path, default=OUT / "learning_tiny.png")
    add_flag(parser)
    args = parser.parse_args(argv)
    args.out, args.plot = args.out.resolve(), args.plot.resolve()  # the bench runs from its workdir
    overrides = parse_overrides(args.param)

    if not (TINY / "config.json").is_file():
        console.print(f"[red]{TINY} is missing: build it with `make model`[/red]")
        return 2
    started = time.perf_counter()
    import datasets
    import transformers

    datasets.disable_progress_bars()  # model/dataset loading bars; the trainers' own bars stay
    transformers.utils.logging.disable_progress_bar()
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="reef-learning-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if demo.SCENARIO in scenarios and not args.no_next_turn and NEXT_TURN not in scenarios:
        scenarios.insert(scenarios.index(demo.SCENARIO) + 1, NEXT_TURN)
    # The server and this process (evaluate reads ./serve.yaml) both see the example scenarios.
    config, _ = resolve(config_file=write_serve_yaml(work, scenarios))
    os.chdir(work)
    # `reef serve` without --model serves data/models/tiny under its cwd: a copy of the repo's model.
    shutil.copytree(TINY, work / "data" / "models" / "tiny", dirs_exist_ok=True)
    # Reuse the repo's vLLM compile cache (a warm cache halves vLLM's startup).
    cache = REPO / "data" / "cache"
    env = {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    result = Result(config={**vars(args), "recipe_params": {**DEFAULT_PARAMS, **overrides}, "workdir": str(work),
                            "cpus": os.cpu_count()})
    result.config = {k: str(v) if isinstance(v, Path) else v for k, v in result.config.items()}

    server = ServeProcess(work, env=env)
    console.print(f"workdir {work}; starting reef serve with a managed vLLM (embedded tiny model)...")
    t0 = time.perf_counter()
    with console.status("starting reef serve + vLLM (30-90 s on 2 cores)..."):
        server.start()
    result.serve_start_s = time.perf_counter() - t0
    console.print(f"reef serve up at {server.url} in {result.serve_start_s:.0f} s")
    base = {name: TINY for name in scenarios}
    seen = dict.fromkeys(scenarios, 0)
    try:
        for r in range(1, args.rounds + 1):
            for name in scenarios:
                sr = result.scenarios.setdefault(name, ScenarioResult(name))
                scenario_round(r, name, sr, server, work, base, seen, config, args, overrides, started)
    finally:
        with console.status("stopping reef serve..."):
            server.stop()

    demo_seen = seen.get(demo.SCENARIO, 0)
    if not args.no_grpo and demo_seen:
        console.print(f"plain TRL GRPOTrainer on the base model, {demo_seen} samples "
                      f"({args.grpo_generations} completions per prompt), generating with transformers...")
        grpo = result.scenarios[demo.SCENARIO].grpo = run_grpo(demo_seen, work / "grpo", args)
        console.print(f"GRPOTrainer: held-out success {grpo['candidate_success']:.1%}, train {grpo['train_s']:.1f} s")
    result.elapsed_s = time.perf_counter() - started

    # Another recipe's run is another experiment: a section of its own.
    publish(args, "learning_tiny" if args.recipe == "rft" else "learning_" + re.sub(r"\W+", "_", args.recipe),
            *report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(result), indent=2, default=str) + "\n")
    plot(result, args.plot)
    console.print(f"saved {args.out} and {args.plot}; total elapsed {result.elapsed_s:.0f} s")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def scenario_round(r: int, name: str, sr: ScenarioResult, server: ServeProcess, work: Path, base: dict[str, Path],
                   seen: dict[str, int], config: Any, args: argparse.Namespace, overrides: dict[str, Any],
                   started: float) -> None:
    """One round of one scenario: simulated traffic, then a learning round on it."""
    t0 = time.perf_counter()
    users = NEXT_TURN_USERS if name == NEXT_TURN else {}
    summary = simulate(server.url, name, requests=args.requests, concurrency=args.concurrency,
                       seed=args.seed + r, config=config, **users)
    sr.simulate_s += time.perf_counter() - t0
    if summary.errors:
        console.print(f"[yellow]{summary.errors} simulated chats failed[/yellow]")
    seen[name] += summary.requests
    with console.status("waiting for the gateway to flush..."):
        wait_flushed(server.url, name, seen[name])
    console.print(f"{name} round {r}: {summary.requests} chats recorded in {time.perf_counter() - t0:.1f} s "
                  f"(mean reward {summary.mean_score:.3f}), {seen[name]} so far")
    try:
        cand, metrics, train_s, eval_s = learning_round(r, name, server.data_dir, work / name, base[name], args,
                                                        overrides)
    except (EmptySnapshotError, ValueError) as exc:  # e.g. online_rl: no group with a reward spread yet
        console.print(f"[yellow]{name} round {r}: nothing to train on yet ({exc}); the records wait for the "
                      f"next round[/yellow]")
        return
    sr.base_success = metrics["head_success"]
    sr.rounds.append(Round(
        round=r, requests=summary.requests, traffic_mean_score=summary.mean_score, samples_seen=seen[name],
        snapshot_records=len(cand["snapshot"]["record_ids"]), snapshot_counts=cand["snapshot"]["counts"],
        train_samples=cand["metrics"].get("train_samples"), train_s=train_s, eval_s=eval_s,
        candidate=cand["path"], candidate_success=metrics["candidate_success"],
        head_success=metrics["head_success"], delta=metrics["delta"],
        ci_low=metrics["ci_low"], ci_high=metrics["ci_high"],
        signals={k: v for k, v in cand["metrics"].items()
                 if k in ("accepted", "rejected", "next_turn_unread", "distil_recorded_targets",
                          "distil_fresh_targets", "rl_samples")} or None,
    ))
    if sr.rounds[-1].signals:
        console.print(f"{name} round {r}: next-turn signals {sr.rounds[-1].signals}")
    console.print(f"{name} round {r}: candidate {Path(cand['path']).name}: held-out success "
                  f"{metrics['candidate_success']:.1%} (base {metrics['head_success']:.1%}), "
                  f"train {train_s:.1f} s, eval {eval_s:.1f} s; elapsed {time.perf_counter() - started:.0f} s")
    if not args.no_chain and cand["kind"] == "full":
        base[name] = Path(cand["path"])


if __name__ == "__main__":
    sys.exit(main())
