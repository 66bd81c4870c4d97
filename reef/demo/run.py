"""`make demo`: the whole loop on the embedded default model.

Builds the tiny model if missing, then starts `reef serve` (which starts vLLM) with its learner on
and the `auto` release policy. Simulated users talk to it through the OpenAI SDK and report
rewards; the learner trains rounds on that experience, the gate compares each candidate with the
head, and selected ones are hot-swapped in while traffic continues. A live table shows the success
rate release by release; at the end come a PNG of it, what was recorded, and the release chain.
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

from reef.config import DEFAULT_TINY_MODEL
from reef.demo.loop import plot, watch
from reef.demo.task import SCENARIO
from reef.experience.load import load
from reef.serve_process import ServeProcess

console = Console()


def _wait_flushed(url: str, scenario: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = httpx.get(f"{url}/reef/status").json()["scenarios"].get(scenario, {})
        if not s.get("unflushed_records") and not s.get("unflushed_reports"):
            return
        time.sleep(0.5)


def _show(data_dir: Path, scenario: str, plot_path: Path) -> None:
    frame = load(scenario, data_dir).lazy().collect()
    table = Table(title=f"recorded experience, scenario {scenario!r} ({data_dir}/experience/{scenario})")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("records", str(frame.height))
    table.add_row("records with a report", str(frame.filter(pl.col("score").is_not_null()).height))
    table.add_row("sessions", str(frame["gen_ai.conversation.id"].n_unique()))
    table.add_row("exact duplicates", str(frame["is_duplicate"].sum()))
    table.add_row("completion tokens", str(frame["gen_ai.usage.output_tokens"].sum()))
    table.add_row("mean score", f"{cast(float, frame['score'].mean()):.3f}")
    console.print(table)

    multi = frame.group_by("gen_ai.conversation.id").len().filter(pl.col("len") > 1)
    if multi.height:
        session = multi["gen_ai.conversation.id"][0]
        turns = frame.filter(pl.col("gen_ai.conversation.id") == session).sort("created_at")
        console.print(f"\n[bold]one session stitched without a session header[/bold]: {session}")
        for row in turns.iter_rows(named=True):
            console.print(f"  [dim]{row['record_id']}[/dim] score={row['score']}")
            for m in row["messages"][-1:]:
                console.print(f"    {m['role']}: {m['content']}")
            console.print(f"    assistant: {row['choices'][0]['content']}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(frame["score"].drop_nulls().to_list(), bins=20, range=(0, 1), color="#2a7fbf")
    ax.set_xlabel("reported score")
    ax.set_ylabel("records")
    ax.set_title(f"rewards recorded for scenario {scenario}")
    fig.tight_layout()
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot_path, dpi=100)
    console.print(f"\nreward histogram saved to {plot_path}")


def write_config(workdir: Path, scenario: str, min_records: int) -> None:
    """serve.yaml in the demo's workdir: the learner on, and the scenario's recipe and policy declared
    the way a user declares theirs (`recipes:` and `scenarios.<s>.recipe`)."""
    import yaml

    (workdir / "serve.yaml").write_text(yaml.safe_dump({
        "model": str(DEFAULT_TINY_MODEL.resolve()), "served_model_name": "reef-tiny",
        "store": {"flush_interval_s": 0.5},
        "learner": {"enabled": True, "interval_s": 2},
        "release": {"policy": "auto"},
        # Rejection-sampling fine-tuning on the chats users rewarded, continuing from the head.
        "recipes": {"demo-rft": {"recipe": "rft", "min_records": min_records, "params": {
            "min_score": 1.0, "kind": "full", "max_steps": 30, "learning_rate": 5e-4, "per_device_batch_size": 16,
            "seed": 0}}},
        "scenarios": {scenario: {"policy": "auto", "recipe": "demo-rft"}},
    }, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("data/demo"),
                        help="where reef serve runs; experience lands in WORKDIR/data (wiped first)")
    parser.add_argument("--rounds", type=int, default=3, help="stop after this many learning rounds")
    parser.add_argument("--max-seconds", type=float, default=480)
    parser.add_argument("--min-records", type=int, default=32, help="rewarded chats that start a round")
    parser.add_argument("--scenario", default=SCENARIO)
    args = parser.parse_args(argv)

    from reef.model.tiny import build_tiny, is_current

    if not is_current(DEFAULT_TINY_MODEL):
        console.print("building the embedded tiny model (once per corpus, a few minutes)...")
        build_tiny(DEFAULT_TINY_MODEL, seed=0)
    shutil.rmtree(args.workdir / "data", ignore_errors=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    write_config(args.workdir, args.scenario, args.min_records)
    server = ServeProcess(args.workdir.resolve())
    with console.status("starting reef serve and vLLM (30-90 s on 2 cores)..."):
        server.start()
    try:
        console.print(f"reef serve is up at {server.url}; simulated users chat and report rewards, the "
                      f"learner trains, the gate decides, and selected candidates are hot-swapped in")
        state = watch(server.url, server.data_dir, args.scenario, rounds=args.rounds, max_seconds=args.max_seconds)
        _wait_flushed(server.url, args.scenario)
    finally:
        server.stop()
    png = plot(state, args.scenario, args.workdir / "learning-loop.png")
    _show(server.data_dir, args.scenario, args.workdir / "rewards.png")
    from reef.cli import main as reef_main

    reef_main(["releases", "--scenario", args.scenario, "--data-dir", str(server.data_dir)])
    console.print(f"\nsuccess rate by release saved to {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
