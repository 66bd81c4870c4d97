"""The live loop on the default model from rewards only: how soon the learner releases something
better, and what users wait while it learns, with the round process at the server's CPU priority
and below it (learner.round_nice), side by side.

    .venv/bin/python bench/live_learning.py [--example weather] [--users 4] [--budget-s 1200] [--nice 10,0]

For each `--nice` arm: `reef serve` on SmolLM2-135M-Instruct in a temporary workdir with the
example's serve.yaml (examples/<name>/, its files beside it), the learner on (exploration on,
`round_nice` the arm's) and every scenario under `policy: auto`; `--users` simulated users, each
one chat after the other at the scenario's eval temperature, scoring replies with its reward and
reporting the score, never a correction (reef.traffic.simulate, `corrections=False`), after
`--idle-s` of chats without reports (no round can start: the idle latency's baseline). The arm
stops at the first release or `--budget-s` after the first reported chat.

Figures: held-out success of what served before and of the first release (the gate's numbers), the
minutes from the first reported chat to that release, the rounds (exploration or the scenario's own recipe)
and their wall time, and the users' latency (p50/p95 of a whole chat completion as the client waited
for it) while no round runs against while one runs (a chat that overlaps a round's process counts
as during it; a round's phases come from its round-events log). Targets (issue 35): a gain of at
least 15 points within 20 minutes from a base without reward, p50 during a round within 1.5x of idle.
Results: bench/out/live_learning.json and bench/RESULTS.md (`live_learning`; another example than
weather: `live_learning_<example>`); `--report-only` publishes what the json holds.
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
import threading  # noqa: E402
import time  # noqa: E402
from datetime import datetime  # noqa: E402
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
from reef.config import DEFAULT_MODEL, DEFAULT_MODEL_NAME, resolve  # noqa: E402
from reef.scenario import Scenario, get_scenario  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402
from reef.traffic.simulate import simulate_async  # noqa: E402

OUT = REPO / "bench" / "out"
CHATS_PER_CALL = 4  # chats one user sends per simulate call (a fresh client each call)
GAIN, WITHIN_S, P50_RATIO = 0.15, 1200.0, 1.5  # issue 35's targets
console = Console(file=sys.stdout, width=160)


def write_config(work: Path, folder: Path, nice: int) -> tuple[Path, str]:
    """The example's files in `work` and its serve.yaml with the default model pinned, the learner on
    (exploration on, the arm's round_nice) and every scenario under policy auto; the config file
    and the (first) scenario's name."""
    for path in folder.iterdir():
        if path.is_file() and path.name != "serve.yaml":
            shutil.copy2(path, work / path.name)
    config = yaml.safe_load((folder / "serve.yaml").read_text())
    config = {"model": str((REPO / DEFAULT_MODEL).resolve()), "served_model_name": DEFAULT_MODEL_NAME,
              "store": {"flush_interval_s": 0.5}, **config}
    learner = config.setdefault("learner", {})
    explore = learner.get("explore", {})
    learner.update(enabled=True, interval_s=2, round_nice=nice,
                   explore={**({"enabled": explore} if isinstance(explore, bool) else explore), "enabled": True})
    for scenario in config.get("scenarios", {}).values():
        scenario["policy"] = "auto"
    path = work / "serve.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, next(iter(config["scenarios"]))


class Users:
    """`n` simulated users in a thread of their own, each sending one chat after the other until stopped."""

    def __init__(self, url: str, scenario: Scenario, n: int, temperature: float):
        self.url, self.scenario, self.n, self.temperature = url, scenario, n, temperature
        self.latencies: list[tuple[float, float]] = []  # (sent, seconds)
        self.scores: list[tuple[float, float]] = []  # (time the call ended, score)
        self.errors = 0
        self.reporting = threading.Event()  # until set, users score replies but report nothing: no round starts
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._all()), name="users", daemon=True)

    def start(self) -> Users:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        self.stopping.set()
        self.thread.join(timeout_s)

    async def _all(self) -> None:
        await asyncio.gather(*(self._user(i) for i in range(self.n)))

    async def _user(self, i: int) -> None:
        call = 0
        while not self.stopping.is_set():
            try:
                summary = await simulate_async(self.url, self.scenario, requests=CHATS_PER_CALL, concurrency=1,
                                               seed=10_007 * i + call, temperature=self.temperature, progress=False,
                                               corrections=False, report=self.reporting.is_set())
            except (httpx.HTTPError, OSError):
                self.errors += 1
                await asyncio.sleep(1.0)
                continue
            call += 1
            self.latencies += summary.latencies
            self.errors += summary.errors
            self.scores += [(time.time(), s) for s in summary.scores]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run_arm(example: str, nice: int, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One arm: serve, users, polls of the learner's status until the first release or the budget."""
    work.mkdir(parents=True, exist_ok=True)
    config_file, name = write_config(work, REPO / "examples" / example, nice)
    config, _ = resolve(config_file=config_file)
    declared = get_scenario(name, config)
    temperature = declared.eval.temperature if declared.eval is not None else 1.0
    server = ServeProcess(work)
    t0 = time.perf_counter()
    console.print(f"[bold]arm nice {nice}[/bold]: starting reef serve in {work} ...")
    server.start()
    serve_start_s = time.perf_counter() - t0
    console.print(f"reef serve up at {server.url} in {serve_start_s:.0f} s; {args.users} users on {name}")
    rounds_file = server.data_dir / "learner" / "rounds.jsonl"
    polls: list[dict[str, Any]] = []
    users = Users(server.url, declared, args.users, temperature).start()
    baseline_from = time.time()
    if args.idle_s > 0:
        console.print(f"  {args.idle_s:.0f} s of chats without reports first: the idle latency, no round can start")
        time.sleep(args.idle_s)
    users.reporting.set()
    first_chat = time.time()
    stopped_by = "budget"
    try:
        with httpx.Client(base_url=server.url, timeout=15.0) as http:
            while time.time() - first_chat < args.budget_s:
                if time.time() > args.deadline:
                    stopped_by = "total-s"
                    break
                time.sleep(2.0)
                try:
                    status = http.get("/reef/status").json()
                except httpx.HTTPError:
                    continue
                mine = (status.get("learner", {}).get("scenarios") or {}).get(name, {})
                polls.append({"at": time.time(), "running": bool(mine.get("running")),
                              "exploring": mine.get("exploring"), "rounds": mine.get("rounds", 0),
                              "waiting": mine.get("waiting"), "load": os.getloadavg()[0],
                              "head": (status["scenarios"].get(name) or {}).get("serving_release")})
                if len(polls) % 15 == 0:
                    live = [s for at, s in users.scores if at > time.time() - 60]
                    doing = (("exploration " if mine.get("exploring") else "") + "round running" if mine.get("running")
                             else mine.get("waiting") or "idle")
                    console.print(f"  {time.time() - first_chat:5.0f} s: {len(users.latencies)} chats, "
                                  f"{len(live)} scored in the last minute ({sum(live):.0f} rewarded); {doing}; "
                                  f"rounds {mine.get('rounds', 0)}")
                if any(r.get("release") for r in read_jsonl(rounds_file)):
                    stopped_by = "release"
                    break
    finally:
        stopped_at = time.time()
        users.stop()
        events = read_jsonl(server.data_dir / "learner" / name / "round-events.jsonl")
        rounds = read_jsonl(rounds_file)
        server.stop()
    return {"example": example, "scenario": name, "nice": nice, "users": args.users, "temperature": temperature,
            "baseline_from": baseline_from, "loadavg": [p["load"] for p in polls],
            "budget_s": args.budget_s, "serve_start_s": round(serve_start_s, 1), "first_chat": first_chat,
            "stopped_at": stopped_at, "stopped_by": stopped_by, "latencies": users.latencies, "scores": users.scores,
            "errors": users.errors, "polls": polls, "rounds": rounds, "events": events}


# ---- what the figures say -------------------------------------------------------------------------------


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def round_spans(arm: dict[str, Any]) -> list[dict[str, Any]]:
    """Each round process the learner ran: its kind, wall time, phases and gate; a round still running
    when the arm stopped is taken from the status polls."""
    by_round: dict[str, dict[str, float]] = {}
    for event in arm["events"]:
        by_round.setdefault(event["round_id"], {}).setdefault(event["state"], _at(event["at"]))
    spans = []
    for entry in arm["rounds"]:
        start, end = entry["started_at"], entry["started_at"] + entry["seconds"]
        lineage = ((entry.get("candidate") or {}).get("lineage") or {}).get("recipe") or ""
        polled = [p for p in arm["polls"] if start <= p["at"] <= end and p["running"]]
        explored = "explore" in lineage or (not lineage and any(p["exploring"] for p in polled))
        phases = by_round.get(entry.get("round") or "", {})
        gate = entry.get("gate") or {}
        metrics = entry.get("metrics") or {}
        spans.append({
            "kind": "regate" if entry["status"] == "regated" else "exploration" if explored else "own recipe",
            "status": entry["status"], "start": start, "end": end, "seconds": entry["seconds"],
            "train": (start, phases.get("trained", end)), "gate_phase": (phases.get("registered", end), end),
            "train_runtime": metrics.get("train_runtime"), "rollouts": metrics.get("rollouts"),
            "rewarded_rollouts": metrics.get("successes"), "examples": metrics.get("train_samples"),
            "decision": gate.get("decision"), "head": gate.get("head_success"),
            "candidate": gate.get("candidate_success"), "release": entry.get("release")})
    running = [p for p in arm["polls"] if p["running"] and not any(s["start"] <= p["at"] <= s["end"] for s in spans)]
    if running:
        # It ran on until the server stopped, after the users' last chats.
        start, end = running[0]["at"], max([arm["stopped_at"], *(sent + s for sent, s in arm["latencies"])])
        spans.append({"kind": "exploration" if any(p["exploring"] for p in running) else "own recipe",
                      "status": "running when stopped", "start": start, "end": end,
                      "seconds": arm["stopped_at"] - start, "train": (start, end),
                      "gate_phase": (end, end), "train_runtime": None, "rollouts": None,
                      "rewarded_rollouts": None, "examples": None, "decision": None, "head": None, "candidate": None,
                      "release": None})
    return spans


def _overlaps(sent: float, seconds: float, span: tuple[float, float]) -> bool:
    return sent < span[1] and sent + seconds > span[0]


def latency_classes(arm: dict[str, Any], spans: list[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"idle": [], "idle, before any report": [], "round": [],
                                   "round: sampling + training": [], "round: gate": []}
    for sent, seconds in arm["latencies"]:
        during = [s for s in spans if _overlaps(sent, seconds, (s["start"], s["end"]))]
        if not during:
            out["idle"].append(seconds)
            if sent + seconds <= arm["first_chat"]:
                out["idle, before any report"].append(seconds)
            continue
        out["round"].append(seconds)
        if any(_overlaps(sent, seconds, s["gate_phase"]) for s in during):
            out["round: gate"].append(seconds)
        elif any(_overlaps(sent, seconds, s["train"]) for s in during):
            out["round: sampling + training"].append(seconds)
    return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def summary(arm: dict[str, Any]) -> dict[str, Any]:
    spans = round_spans(arm)
    classes = latency_classes(arm, spans)
    gated = [s for s in spans if s["head"] is not None]
    released = next((s for s in spans if s["release"]), None)
    before = gated[0]["head"] if gated else None
    after = released["candidate"] if released else None
    idle50, round50 = pct(classes["idle"], 50), pct(classes["round"], 50)
    idle95, round95 = pct(classes["idle"], 95), pct(classes["round"], 95)
    release_s = released["end"] - arm["first_chat"] if released else None
    live = [s for _, s in arm["scores"]]
    stats = {k: {"n": len(v), "p50": pct(v, 50), "p95": pct(v, 95)} for k, v in classes.items()}
    return {"spans": spans, "classes": stats,
            "before": before, "after": after, "best_candidate": max((s["candidate"] for s in gated), default=None),
            "release_s": release_s, "p50_ratio": round50 / idle50 if idle50 and round50 else None,
            "p95_ratio": round95 / idle95 if idle95 and round95 else None,
            "live": {"chats": len(arm["latencies"]), "scored": len(live), "rewarded": sum(1 for s in live if s >= 1.0)},
            "gain_ok": before is not None and after is not None and after - before >= GAIN
            and release_s is not None and release_s <= WITHIN_S,
            "latency_ok": idle50 is not None and round50 is not None and round50 <= P50_RATIO * idle50}


def _f(value: float | None, spec: str = "{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def report(arms: list[dict[str, Any]]) -> list[Table | Text]:
    sums = [summary(arm) for arm in arms]
    first = arms[0]
    side = Table(title=f"the live loop on {first['example']} (SmolLM2-135M-Instruct, {first['users']} users, rewards "
                       f"only, policy auto), per round_nice")
    for col in ("round_nice", "p50 round/idle", "p95 round/idle", "idle p50/p95 s", "round p50/p95 s",
                "held-out before", "held-out after", "first release after", "rounds (kinds)", "round wall s",
                "live chats (rewarded)"):
        side.add_column(col, justify="right")
    verdicts: list[Text] = []
    for arm, s in zip(arms, sums, strict=True):
        kinds: dict[str, int] = {}
        for span in s["spans"]:
            kinds[span["kind"]] = kinds.get(span["kind"], 0) + 1
        idle, rnd = s["classes"]["idle"], s["classes"]["round"]
        release = (f"{s['release_s'] / 60:.1f} min" if s["release_s"] is not None
                   else f"none in {(arm['stopped_at'] - arm['first_chat']) / 60:.1f} min"
                   + (" (cut by --total-s)" if arm["stopped_by"] == "total-s" else ""))
        verdicts.append(Text.from_markup(
            f"round_nice {arm['nice']}: " + ("[green]ok[/green]" if s["gain_ok"] else "[red]MISSED[/red]")
            + f" held-out +{100 * GAIN:.0f} points released within {WITHIN_S / 60:.0f} min; "
            + ("[green]ok[/green]" if s["latency_ok"] else "[red]MISSED[/red]") + f" users' p50 during a round "
            f"<= {P50_RATIO}x idle"))
        side.add_row(str(arm["nice"]), _f(s["p50_ratio"], "{:.2f}x"), _f(s["p95_ratio"], "{:.2f}x"),
                     f"{_f(idle['p50'])} / {_f(idle['p95'])}", f"{_f(rnd['p50'])} / {_f(rnd['p95'])}",
                     _f(s["before"], "{:.1%}"),
                     _f(s["after"], "{:.1%}") if s["after"] is not None
                     else f"- (best candidate {_f(s['best_candidate'], '{:.1%}')})",
                     release, ", ".join(f"{n} {k}" for k, n in kinds.items()) or "0",
                     ", ".join(f"{span['seconds']:.0f}" for span in s["spans"]) or "-",
                     f"{s['live']['chats']} ({s['live']['rewarded']})")
    parts: list[Table | Text] = [side, *verdicts]
    for arm, s in zip(arms, sums, strict=True):
        detail = Table(title=f"round_nice {arm['nice']}: each round (minutes from the first reported chat)")
        for col in ("kind", "status", "started", "wall s", "train s", "rollouts rewarded", "examples", "gate",
                    "head held-out", "candidate held-out", "released"):
            detail.add_column(col, justify="right")
        for span in s["spans"]:
            detail.add_row(span["kind"], span["status"], f"{(span['start'] - arm['first_chat']) / 60:.1f}",
                           f"{span['seconds']:.0f}", _f(span["train_runtime"], "{:.0f}"),
                           "-" if span["rollouts"] is None else f"{span['rewarded_rollouts']} of {span['rollouts']}",
                           _f(span["examples"], "{}"), span["decision"] or "-", _f(span["head"], "{:.1%}"),
                           _f(span["candidate"], "{:.1%}"), span["release"] or "-")
        parts.append(detail)
        lat = Table(title=f"round_nice {arm['nice']}: users' chat latency by what the learner was doing")
        for col in ("while", "chats", "p50 s", "p95 s", "p50 / idle"):
            lat.add_column(col, justify="right")
        idle50 = s["classes"]["idle"]["p50"]
        for what, c in s["classes"].items():
            lat.add_row(what, str(c["n"]), _f(c["p50"]), _f(c["p95"]),
                        _f(c["p50"] / idle50 if c["p50"] is not None and idle50 else None, "{:.2f}x"))
        parts.append(lat)
    note = Text(f"Stopped at the first release or the budget ({first['budget_s']:.0f} s after the first reported chat, "
                f"after {first['first_chat'] - first['baseline_from']:.0f} s of chats without reports: the idle "
                f"baseline); load average (1 min) while it ran: "
                + ", ".join(f"{statistics.fmean(a['loadavg']):.1f} mean, {max(a['loadavg']):.1f} max (nice {a['nice']})"
                            for a in arms if a["loadavg"]) + "; "
                "held-out figures are the gate's (head before, the released candidate after); a chat that overlaps "
                "a round process counts as during it. Serve start: "
                + ", ".join(f"{a['serve_start_s']:.0f} s (nice {a['nice']})" for a in arms) + ".")
    parts.append(note)
    for part in parts:
        console.print(part)
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", default="weather", help="a folder of examples/ with a serve.yaml")
    parser.add_argument("--users", type=int, default=4, help="simulated users, each one chat after the other")
    parser.add_argument("--budget-s", type=float, default=1200.0, help="per arm, from the first chat")
    parser.add_argument("--nice", default="10,0", help="comma-separated learner.round_nice arms, run in this order")
    parser.add_argument("--idle-s", type=float, default=90.0, help="chats without reports first (no round can "
                        "start): the idle latency's baseline; the budget and the release time count from their end")
    parser.add_argument("--total-s", type=float, default=None, help="wall limit for all arms together: an arm still "
                        "running then stops, marked as cut (default: none)")
    parser.add_argument("--workdir", type=Path, help="keep each arm's server data here (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=OUT / "live_learning.json")
    parser.add_argument("--remark", default=None, help="a sentence published above the figures (what the run shared "
                        "the machine with)")
    parser.add_argument("--report-only", action="store_true", help="no run: print and publish what --out holds")
    add_flag(parser)
    args = parser.parse_args(argv)
    # Another example's run is a section of its own: it leaves the default example's figures standing.
    section = "live_learning" if args.example == "weather" else f"live_learning_{args.example}"
    if args.report_only:
        remark = [Text(args.remark, style="italic")] if args.remark else []
        publish(args, section, *remark, *report(json.loads(args.out.read_text())))
        return 0
    # A SIGTERM (or a SIGINT where the shell ignores it) stops the arm's server through the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.deadline = time.time() + args.total_s if args.total_s else float("inf")
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="reef-live-learning-"))).resolve()
    arms = []
    try:
        for nice in (int(n) for n in args.nice.split(",") if n.strip()):
            if time.time() > args.deadline - 300:
                console.print(f"[yellow]arm nice {nice} not run: under 5 minutes of --total-s left[/yellow]")
                continue
            arms.append(run_arm(args.example, nice, work / f"nice{nice}", args))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(arms, default=str))  # each arm saved as soon as it ends
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    publish(args, section, *report(arms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
