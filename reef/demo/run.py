"""`make demo`: the main job on the embedded default model.

Builds the tiny model if missing, starts `reef serve` (which starts vLLM), plays a few hundred
simulated users with rewards through the OpenAI SDK, then shows what was recorded: counts, the
reward histogram (also saved as a PNG) and one session stitched together without a session header.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx
import polars as pl
from rich.console import Console
from rich.table import Table

from reef.config import DEFAULT_TINY_MODEL
from reef.demo.simulate import SimulationSummary, simulate
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


def _show(data_dir: Path, scenario: str, summary: SimulationSummary, plot_path: Path) -> None:
    frame = load(scenario, data_dir).lazy().collect()
    table = Table(title=f"recorded experience, scenario {scenario!r} ({data_dir}/experience/{scenario})")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("records", str(frame.height))
    table.add_row("records with a report", str(frame.filter(pl.col("score").is_not_null()).height))
    table.add_row("sessions", str(frame["gen_ai.conversation.id"].n_unique()))
    table.add_row("exact duplicates", str(frame["is_duplicate"].sum()))
    table.add_row("completion tokens", str(frame["gen_ai.usage.output_tokens"].sum()))
    table.add_row("mean score", f"{frame['score'].mean():.3f}")
    console.print(table)
    console.print(summary.render())

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("."),
                        help="where reef serve runs; experience lands in WORKDIR/data")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--scenario", default=SCENARIO)
    args = parser.parse_args(argv)

    if not (DEFAULT_TINY_MODEL / "config.json").exists():
        from reef.model.tiny import build_tiny

        console.print("building the embedded tiny model (once, a few minutes)...")
        build_tiny(DEFAULT_TINY_MODEL, seed=0)
    server = ServeProcess(args.workdir)
    with console.status("starting reef serve and vLLM (30-90 s on 2 cores)..."):
        server.start()
    try:
        console.print(f"reef serve is up at {server.url}; simulating {args.requests} chats with rewards")
        summary = simulate(server.url, scenario=args.scenario, requests=args.requests, concurrency=16)
        _wait_flushed(server.url, args.scenario)
    finally:
        server.stop()
    _show(server.data_dir, args.scenario, summary, server.data_dir / "demo" / "rewards.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
