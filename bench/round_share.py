"""A learning round alone on the engine and beside users, side by side: how long a round on
`--records` records takes with nobody else served and beside `--users` simulated users, and what
those users wait meanwhile (issue 35's targets: the round within 2x its time alone, the users' p50
within 1.5x of theirs without a round).

    .venv/bin/python bench/round_share.py [--example sentiment] [--users 4] [--records 16] [--repeats 2]

Each run is a fresh `reef serve` on SmolLM2-135M-Instruct in a temporary workdir with the example's
serve.yaml, the learner on with the scenario's own recipe only (exploration and the harness rung
off), `min_records` and `batch_size` both `--records`, policy approval (the round ends at the gate's
verdict; no swap is timed) and every other setting its default (`learner.round_nice`,
`learner.share`). The `beside users` arm first lets `--users` users chat without reporting for
`--idle-s` (nothing eligible: their latency without a round), then sends `--records` reported chats
(with the corrections the scenario's simulated users give), which start the round, and the users go
on until it ends; the `alone` arm sends the same reported chats (same seed) and nothing else. The
arms alternate, `--repeats` runs each; a figure is the median over an arm's runs.
Results: bench/out/round_share.json and bench/RESULTS.md (`round_share`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.live_learning import Users, console, pct, read_jsonl  # noqa: E402
from bench.results import add_flag, publish  # noqa: E402
from reef.config import DEFAULT_MODEL, DEFAULT_MODEL_NAME, resolve  # noqa: E402
from reef.scenario import get_scenario  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402
from reef.traffic.simulate import simulate_async  # noqa: E402

OUT = REPO / "bench" / "out"
ROUND_RATIO, P50_RATIO = 2.0, 1.5  # issue 35's targets
ARMS = ("alone", "beside users")


def write_config(work: Path, folder: Path, records: int) -> tuple[Path, str]:
    """The example's files in `work`, its serve.yaml with the default model pinned and the learner on
    with the scenario's own recipe only, `records` records a round; the config and the scenario."""
    for path in folder.iterdir():
        if path.is_file() and path.name != "serve.yaml":
            shutil.copy2(path, work / path.name)
    config = yaml.safe_load((folder / "serve.yaml").read_text())
    config = {"model": str((REPO / DEFAULT_MODEL).resolve()), "served_model_name": DEFAULT_MODEL_NAME,
              "store": {"flush_interval_s": 0.5}, **config}
    learner = config.setdefault("learner", {})
    learner.update(enabled=True, interval_s=1, explore={"enabled": False}, harness={"enabled": False})
    name = next(iter(config["scenarios"]))
    scenario = config["scenarios"][name]
    scenario["policy"] = "approval"
    recipe = config["recipes"][scenario["recipe"]]
    recipe.update(min_records=records, batch_size=records)
    path = work / "serve.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, name


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def run_once(arm: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    config_file, name = write_config(work, REPO / "examples" / args.example, args.records)
    config, _ = resolve(config_file=config_file)
    declared = get_scenario(name, config)
    temperature = declared.eval.temperature if declared.eval is not None else 1.0
    server = ServeProcess(work)
    console.print(f"[bold]{arm}[/bold]: starting reef serve in {work} ...")
    server.start()
    users = Users(server.url, declared, args.users, temperature) if arm == "beside users" else None
    rounds_file = server.data_dir / "learner" / "rounds.jsonl"
    try:
        if users is not None:
            users.start()
            time.sleep(args.idle_s)
        seeded_at = time.time()
        asyncio.run(simulate_async(server.url, declared, requests=args.records, concurrency=4, seed=args.seed,
                                   temperature=temperature, progress=False, corrections=True, report=True))
        deadline = time.time() + args.budget_s
        while not read_jsonl(rounds_file) and time.time() < deadline:
            time.sleep(1.0)
        ended_at = time.time()
    finally:
        if users is not None:
            users.stop()
        events = read_jsonl(server.data_dir / "learner" / name / "round-events.jsonl")
        rounds = read_jsonl(rounds_file)
        server.stop()
    out = {"arm": arm, "seeded_at": seeded_at, "ended_at": ended_at, "events": events, "rounds": rounds,
           "latencies": users.latencies if users else [], "errors": users.errors if users else 0,
           "load": os.getloadavg()[0]}
    s = figures(out)
    console.print(f"  round {s['round_s'] or '-'} s (training {s['train_s'] or '-'} s, gate {s['gate_s'] or '-'} s)"
                  + (f"; users' p50 {s['idle_p50']} s without a round, {s['round_p50']} s during it"
                     if users else ""))
    return out


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """The first round's wall time and phases, and the users' latency before it and during it."""
    entry = run["rounds"][0] if run["rounds"] else None
    phases: dict[str, float] = {}
    for event in run["events"]:
        phases.setdefault(event["state"], _at(event["at"]))
    start = entry["started_at"] if entry else phases.get("planned")
    end = start + entry["seconds"] if entry and start is not None else None
    before = [s for sent, s in run["latencies"] if start is not None and sent + s <= start]
    during = [s for sent, s in run["latencies"] if start is not None and end is not None and sent < end
              and sent + s > start]
    gate = (entry or {}).get("gate") or {}
    return {"round_s": None if end is None else round(end - start, 1),
            "train_s": round(phases["trained"] - phases["planned"], 1) if {"trained", "planned"} <= phases.keys()
            else None,
            "gate_s": round(end - phases["registered"], 1) if end is not None and "registered" in phases else None,
            "decision": gate.get("decision"), "status": entry["status"] if entry else "no round in the budget",
            "idle_p50": None if not before else round(pct(before, 50) or 0, 2),
            "round_p50": None if not during else round(pct(during, 50) or 0, 2),
            "chats_before": len(before), "chats_during": len(during)}


def _median(values: list[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return statistics.median(have) if have else None


def _f(value: float | None, spec: str = "{:.1f}") -> str:
    return "-" if value is None else spec.format(value)


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[Table | Text]:
    by_arm = {arm: [figures(r) for r in runs if r["arm"] == arm] for arm in ARMS}
    med = {arm: {k: _median([f[k] for f in fs]) for k in ("round_s", "train_s", "gate_s", "idle_p50", "round_p50")}
           for arm, fs in by_arm.items()}
    table = Table(title=f"a round of {args.example}'s own recipe on {args.records} records (SmolLM2-135M-Instruct, "
                        f"2 cores), alone and beside {args.users} users; medians over each arm's runs")
    for col in ("arm", "round s", "training s", "gate s", "round / alone", "users' p50 s without a round",
                "users' p50 s during it", "p50 during / without", "runs (gate decisions)"):
        table.add_column(col, justify="right")
    alone = med["alone"]["round_s"]
    for arm in ARMS:
        m = med[arm]
        ratio = m["round_s"] / alone if m["round_s"] and alone else None
        p50 = m["round_p50"] / m["idle_p50"] if m["round_p50"] and m["idle_p50"] else None
        table.add_row(arm, _f(m["round_s"]), _f(m["train_s"]), _f(m["gate_s"]), _f(ratio, "{:.2f}x"),
                      _f(m["idle_p50"], "{:.2f}"), _f(m["round_p50"], "{:.2f}"), _f(p50, "{:.2f}x"),
                      f"{len(by_arm[arm])} ({', '.join(str(f['decision'] or f['status']) for f in by_arm[arm])})")
    beside = med["beside users"]
    ratio = beside["round_s"] / alone if beside["round_s"] and alone else None
    p50 = beside["round_p50"] / beside["idle_p50"] if beside["round_p50"] and beside["idle_p50"] else None
    verdict = Text.from_markup(
        ("[green]ok[/green]" if ratio is not None and ratio <= ROUND_RATIO else "[red]MISSED[/red]")
        + f" a round beside {args.users} users within {ROUND_RATIO:.0f}x its time alone; "
        + ("[green]ok[/green]" if p50 is not None and p50 <= P50_RATIO else "[red]MISSED[/red]")
        + f" users' p50 during the round within {P50_RATIO}x of without")
    note = Text("Each run a fresh server; arms alternate. Load average (1 min) at each run's end: "
                + ", ".join(f"{r['load']:.1f} ({r['arm']})" for r in runs) + ". Per run: "
                + "; ".join(f"{r['arm']}: round {_f(f['round_s'])} s, users' p50 {_f(f['idle_p50'], '{:.2f}')} -> "
                            f"{_f(f['round_p50'], '{:.2f}')} s ({f['chats_before']} -> {f['chats_during']} chats)"
                            for r, f in ((r, figures(r)) for r in runs)) + ".")
    parts: list[Table | Text] = [table, verdict, note]
    for part in parts:
        console.print(part)
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", default="sentiment", help="a folder of examples/ with a serve.yaml")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--records", type=int, default=16, help="reported chats that start the round")
    parser.add_argument("--repeats", type=int, default=2, help="runs per arm, alternating")
    parser.add_argument("--idle-s", type=float, default=45.0, help="the users' chats before the round (their "
                        "latency without one)")
    parser.add_argument("--budget-s", type=float, default=900.0, help="per run, for the round to end")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=OUT / "round_share.json")
    parser.add_argument("--report-only", action="store_true", help="no run: print and publish what --out holds")
    add_flag(parser)
    args = parser.parse_args(argv)
    if args.report_only:
        publish(args, "round_share", *report(json.loads(args.out.read_text()), args))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="reef-round-share-"))
    runs: list[dict[str, Any]] = []
    try:
        for i in range(args.repeats):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                runs.append(run_once(arm, work / f"{i}-{arm.replace(' ', '-')}", args))
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(runs, default=str))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    publish(args, "round_share", *report(runs, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
