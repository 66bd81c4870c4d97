"""Recipe overhead: a training step of a recipe vs. the bare TRL trainer on the same batch, side by side.

    .venv/bin/python bench/recipe_overhead.py [--steps 100] [--warmup 10] [--repeats 3] [--batch 16]

Recipe arm: `rft` (its own `SFTTrainer`, built by the framework's `Recipe.run` on a snapshot of
offline demo traffic, saved as a candidate). Bare arm: an `SFTTrainer` built directly, with the
same hyperparameters, on the same pre-tokenized examples. A callback added to both trainers times
every optimizer step (data loading included); the first `--warmup` steps are dropped. Arms
alternate, `--repeats` times each, so drift on a shared machine hits both alike. Prints the
per-step overhead (median step, recipe vs. bare; target <= 10 %) and, for information, the
fixed per-run cost around the training loop (snapshot -> dataset, model load, save, candidate.json).
Both arms train with one torch thread (what `Recipe.run` sets) and must see identical losses.

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from recipes.rft.recipe import RFT  # noqa: E402
from reef.recipe import Snapshot  # noqa: E402
from reef.recipe.tokens import sft_examples  # noqa: E402
from reef.traffic.offline import record_offline_traffic  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402
from tests.helpers.tiny.task import SCENARIO  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
console = Console(file=sys.stdout, width=120)  # the real stdout: trainer log dicts are redirected


class StepTimer(TrainerCallback):
    """perf_counter() at the end of every optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.start = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter())

    def steps(self, warmup: int) -> list[float]:
        marks = [self.start, *self.ends]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)][warmup:]


class TimedRFT(RFT):
    """rft exactly as shipped, with the step timer attached to the trainer it builds."""

    timer: StepTimer

    def build_trainer(self, snapshot: Snapshot, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                      output_dir: Path) -> Any:
        trainer = super().build_trainer(snapshot, model, tokenizer, output_dir)
        trainer.add_callback(self.timer)
        return trainer


@contextlib.contextmanager
def quiet(log: Path) -> Iterator[None]:
    with log.open("a") as f, contextlib.redirect_stdout(f):
        yield


def recipe_arm(snap: Snapshot, params: dict[str, Any], out: Path, warmup: int) -> dict[str, Any]:
    recipe = TimedRFT(**params)
    recipe.timer = StepTimer()
    t0 = time.perf_counter()
    cand = recipe.run(snap, out_dir=out, progress=False, consume=False)
    wall = time.perf_counter() - t0
    loop = recipe.timer.ends[-1] - recipe.timer.start
    return {"steps": recipe.timer.steps(warmup), "wall_s": wall, "loop_s": loop,
            "train_loss": cand.metrics["train_loss"], "losses": None}


def bare_arm(examples: datasets.Dataset, params: dict[str, Any], out: Path, warmup: int) -> dict[str, Any]:
    """What you would write by hand: load, SFTTrainer on the pre-tokenized examples, train, save."""
    from trl import SFTConfig, SFTTrainer

    timer = StepTimer()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as Recipe.run does (REEF_TRAIN_THREADS)
    t0 = time.perf_counter()
    try:
        transformers.set_seed(params["seed"])
        tokenizer = AutoTokenizer.from_pretrained(TINY)
        model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
        args = SFTConfig(
            output_dir=str(out / ".trainer"), max_steps=params["max_steps"], learning_rate=params["learning_rate"],
            per_device_train_batch_size=params["per_device_batch_size"], seed=params["seed"],
            data_seed=params["seed"], use_cpu=True, bf16=False, gradient_checkpointing=False,
            logging_steps=max(1, params["max_steps"] // 10), save_strategy="no", report_to=[], disable_tqdm=True,
            dataloader_num_workers=0, lr_scheduler_type="constant_with_warmup", warmup_steps=0,
            max_length=1024, packing=False,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=examples, processing_class=tokenizer,
                             callbacks=[timer])
        result = trainer.train()
        trainer.model.save_pretrained(out)
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - t0
    return {"steps": timer.steps(warmup), "wall_s": wall, "loop_s": timer.ends[-1] - timer.start,
            "train_loss": result.training_loss, "losses": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run (after warm-up)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm, alternating")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=320, help="demo-traffic prompts (x 4 samples) to snapshot")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "recipe_overhead.json")
    add_flag(parser)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="reef-recipe-overhead-"))
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    try:
        with console.status(f"recording offline demo traffic ({args.prompts} prompts x 4 samples)..."):
            torch.set_num_threads(1)
            traffic = record_offline_traffic(TINY, work / "data", "demo-add", prompts=args.prompts, samples=4, seed=0)
        params = {"scenario": SCENARIO, "base_model": str(TINY), "max_steps": args.warmup + args.steps,
                  "per_device_batch_size": args.batch, "learning_rate": 5e-4, "seed": 0}
        probe = TimedRFT(**params)
        snap = Snapshot.create(SCENARIO, work / "data", probe.experience(), root=work / "snapshots",
                               ledger_root=work / "ledger")
        # The bare arm's batch: the same pre-tokenized examples the recipe builds from the snapshot.
        examples = sft_examples(snap.samples(), 1024).remove_columns("record_id")
        console.print(f"{traffic['records']} records, snapshot {snap.id}: {len(snap.record_ids)} records, "
                      f"{len(examples)} examples; {args.repeats} x {args.warmup}+{args.steps} steps per arm, "
                      f"batch {args.batch}")

        runs: dict[str, list[dict[str, Any]]] = {"recipe": [], "bare": []}
        log = work / "train.log"
        for r in range(args.repeats):
            order = ["recipe", "bare"] if r % 2 == 0 else ["bare", "recipe"]
            for arm in order:
                with console.status(f"repeat {r + 1}/{args.repeats}: {arm} arm..."), quiet(log):
                    if arm == "recipe":
                        res = recipe_arm(snap, params, work / f"cand-{r}", args.warmup)
                    else:
                        res = bare_arm(examples, params, work / f"bare-{r}", args.warmup)
                runs[arm].append(res)
                step_ms = 1000 * statistics.median(res["steps"])
                console.print(f"  repeat {r + 1} {arm:6}: median step {step_ms:.1f} ms, loop {res['loop_s']:.2f} s, "
                              f"run {res['wall_s']:.2f} s, train_loss {res['train_loss']:.5f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary: dict[str, dict[str, float]] = {}
    for arm, rs in runs.items():
        steps = [s for res in rs for s in res["steps"]]
        summary[arm] = {
            "median_step_ms": 1000 * statistics.median(steps),
            "mean_step_ms": 1000 * statistics.fmean(steps),
            "p90_step_ms": 1000 * statistics.quantiles(steps, n=10)[-1],
            "loop_s": statistics.median(res["loop_s"] for res in rs),
            "run_s": statistics.median(res["wall_s"] for res in rs),
            "fixed_s": statistics.median(res["wall_s"] - res["loop_s"] for res in rs),
            "train_loss": rs[0]["train_loss"],
        }
    rec, bare = summary["recipe"], summary["bare"]
    step_overhead = rec["median_step_ms"] / bare["median_step_ms"] - 1
    mean_overhead = rec["mean_step_ms"] / bare["mean_step_ms"] - 1
    run_overhead = rec["run_s"] / bare["run_s"] - 1
    same_loss = all(abs(a["train_loss"] - b["train_loss"]) < 1e-6 for a, b in zip(runs["recipe"], runs["bare"],
                                                                                   strict=True))

    table = Table(title=f"rft recipe vs. bare SFTTrainer: {args.repeats} x {args.steps} timed steps, "
                        f"batch {args.batch}")
    for col in ("", "recipe (rft)", "bare SFTTrainer", "overhead"):
        table.add_column(col, justify="right")
    table.add_row("median step ms", f"{rec['median_step_ms']:.2f}", f"{bare['median_step_ms']:.2f}",
                  f"{step_overhead:+.1%}")
    table.add_row("mean step ms", f"{rec['mean_step_ms']:.2f}", f"{bare['mean_step_ms']:.2f}", f"{mean_overhead:+.1%}")
    table.add_row("p90 step ms", f"{rec['p90_step_ms']:.2f}", f"{bare['p90_step_ms']:.2f}",
                  f"{rec['p90_step_ms'] / bare['p90_step_ms'] - 1:+.1%}")
    table.add_row(f"training loop s ({args.warmup + args.steps} steps)", f"{rec['loop_s']:.2f}",
                  f"{bare['loop_s']:.2f}", f"{rec['loop_s'] / bare['loop_s'] - 1:+.1%}")
    table.add_row("fixed cost around the loop s", f"{rec['fixed_s']:.2f}", f"{bare['fixed_s']:.2f}",
                  f"{rec['fixed_s'] - bare['fixed_s']:+.2f} s")
    table.add_row("whole run s", f"{rec['run_s']:.2f}", f"{bare['run_s']:.2f}", f"{run_overhead:+.1%}")
    table.add_row("train_loss", f"{rec['train_loss']:.5f}", f"{bare['train_loss']:.5f}",
                  "identical" if same_loss else "DIFFERENT")
    console.print(table)
    ok = step_overhead <= 0.10
    verdict = (f"per-step overhead {step_overhead:+.1%} (target <= 10 %): "
               f"{'[green]ok[/green]' if ok else '[red]MISSED[/red]'}")
    console.print(verdict)
    publish(args, "recipe_overhead", table, Text.from_markup(verdict))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                    "summary": summary, "step_overhead": step_overhead,
                                    "mean_step_overhead": mean_overhead, "run_overhead": run_overhead,
                                    "same_loss": same_loss,
                                    "runs": {a: [{k: v for k, v in res.items() if k != "losses"} for res in rs]
                                             for a, rs in runs.items()}}, indent=2) + "\n")
    console.print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
