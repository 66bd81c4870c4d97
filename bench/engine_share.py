"""Users first: what a round's rollouts cost the users they share the engine with, and what yielding
(learner.share, reef.sampling.sharing) costs the round, side by side in one run.

    .venv/bin/python bench/engine_share.py [--example weather] [--users 4] [--rounds 3] [--phase-s 45]

`reef serve` on the default model (SmolLM2-135M-Instruct, its own vLLM) with the example's
scenario; `--users` simulated users chat through it one chat after the other for the whole run (no
reports: no learner). Each round runs every arm for `--phase-s`, in turn: no rollouts (the users'
idle baseline), and the explore recipe's sampling straight to the engine (reef.recipe.rollouts with
ExploreConfig's defaults: the scenario's practice tasks, half of a tool task's samples under
`tool_choice: "required"`, one choice per request) with no yielding and with `beside_users` 1 and
2 (`alone` 8), users counted at the gateway's /metrics as the learner does.
Figures, medians over rounds: the users' p50 and p95 chat latency (chats sent in the phase) and
its ratio to the same round's baseline, and the rollouts finished per minute. Results:
bench/out/engine_share.json and bench/RESULTS.md (`engine_share`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from recipes.explore.recipe import ExploreConfig  # noqa: E402
from reef.config import DEFAULT_MODEL, DEFAULT_MODEL_NAME, resolve  # noqa: E402
from reef.recipe.practice import practice_tasks  # noqa: E402
from reef.recipe.rollouts import RolloutPlan, sample_rollouts  # noqa: E402
from reef.sampling.engine import Arm, EngineEndpoint  # noqa: E402
from reef.scenario import Scenario, get_scenario  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402
from reef.traffic.simulate import simulate_async  # noqa: E402

OUT = REPO / "bench" / "out"
ARMS: dict[str, int | None | str] = {"users alone": "none", "no yielding": None, "beside_users 1": 1,
                                     "beside_users 2": 2}
console = Console(file=sys.stdout, width=150)


class Users:
    """`n` users in a thread of their own, one chat after the other until stopped: (sent, seconds)."""

    def __init__(self, url: str, scenario: Scenario, n: int, temperature: float):
        self.url, self.scenario, self.n, self.temperature = url, scenario, n, temperature
        self.latencies: list[tuple[float, float]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._all()), daemon=True)

    async def _all(self) -> None:
        async def user(i: int) -> None:
            call = 0
            while not self.stopping.is_set():
                try:
                    summary = await simulate_async(self.url, self.scenario, requests=2, concurrency=1,
                                                   seed=10_007 * i + call, temperature=self.temperature,
                                                   progress=False, corrections=False, report=False)
                    self.latencies += summary.latencies
                except (httpx.HTTPError, OSError):
                    await asyncio.sleep(1.0)
                call += 1

        await asyncio.gather(*(user(i) for i in range(self.n)))


def rollouts(engine: EngineEndpoint, scenario: Scenario, max_tokens: int, seconds: float) -> tuple[int, float]:
    """The explore recipe's sampling (reef.recipe.rollouts, its defaults) on the practice tasks, over
    and over, for `seconds`: the rollouts finished, and the time requests were held back for users."""
    tasks, _ = practice_tasks(scenario)
    cycle = {k: tasks[k % len(tasks)] for k in range(100_000)}
    defaults = ExploreConfig(scenario=scenario.name)
    plan = RolloutPlan(samples=defaults.samples, temperature=1.0, max_tokens=max_tokens,
                       concurrency=defaults.concurrency, per_request=defaults.per_request, max_s=seconds)
    run = sample_rollouts(engine, Arm(served=engine.model), cycle, plan, lambda ts, replies: [None] * len(replies))
    return len(run.rollouts), run.held_s


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else (values[0] if values else 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="weather", help="a folder of examples/ with a serve.yaml")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=45.0)
    parser.add_argument("--out", type=Path, default=OUT / "engine_share.json")
    add_flag(parser)
    args = parser.parse_args()

    folder = REPO / "examples" / args.example
    work = Path(tempfile.mkdtemp(prefix="reef-share-"))
    for path in folder.iterdir():
        if path.is_file():
            shutil.copy2(path, work / path.name)
    config = yaml.safe_load((folder / "serve.yaml").read_text())
    config = {**config, "model": str((REPO / DEFAULT_MODEL).resolve()), "served_model_name": DEFAULT_MODEL_NAME,
              "learner": {"enabled": False}}
    (work / "serve.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    resolved, _ = resolve(config_file=work / "serve.yaml")
    name = next(iter(config["scenarios"]))
    scenario = get_scenario(name, resolved)
    temperature = scenario.eval.temperature if scenario.eval is not None else 1.0
    max_tokens = scenario.eval.max_new_tokens if scenario.eval is not None else 64
    server = ServeProcess(work, ["--config", str(work / "serve.yaml")]).start()
    engine_url = json.loads(httpx.get(f"{server.url}/reef/status", timeout=30).text).get("engine", {}).get("url")
    console.print(f"reef serve up at {server.url} (engine {engine_url}); {args.users} users on {name}")
    users = Users(server.url, scenario, args.users, temperature)
    users.thread.start()
    time.sleep(args.phase_s / 3)  # the users' first chats warm the engine up
    phases: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for arm, beside in ARMS.items():
                start = time.monotonic()
                wall_start = time.time()
                finished, held = 0, 0.0
                if beside == "none":
                    time.sleep(args.phase_s)
                else:
                    engine = EngineEndpoint(engine_url, DEFAULT_MODEL_NAME,
                                            beside_users=beside if isinstance(beside, int) else None, alone=8,
                                            users_url=f"{server.url}/metrics")
                    finished, held = rollouts(engine, scenario, max_tokens, args.phase_s)
                lat = [s for sent, s in list(users.latencies) if wall_start <= sent < wall_start + args.phase_s]
                phases.append({"round": r, "arm": arm, "chats": len(lat),
                               "p50": round(statistics.median(lat), 3) if lat else None,
                               "p95": round(percentile(lat, 95), 3) if lat else None,
                               "rollouts_per_min": round(finished * 60 / (time.monotonic() - start), 1),
                               "held_s": round(held, 1)})
                console.print(f"round {r} {arm:>15}: {phases[-1]}")
    finally:
        users.stopping.set()
        users.thread.join(120)
        server.stop()

    table = Table(title=f"a round's rollouts beside {args.users} users on {name} (SmolLM2-135M-Instruct, "
                        f"{os.cpu_count()} cores), medians over {args.rounds} rounds of {args.phase_s:.0f} s phases")
    for col in ("arm", "users' p50 s", "p50 / users alone", "users' p95 s", "p95 / users alone", "rollouts / min",
                "chats"):
        table.add_column(col, justify="right")
    summary = {}
    for arm in ARMS:
        rows = [p for p in phases if p["arm"] == arm and p["p50"] is not None]
        base = {p["round"]: p for p in phases if p["arm"] == "users alone" and p["p50"]}
        ratio50 = [p["p50"] / base[p["round"]]["p50"] for p in rows if p["round"] in base]
        ratio95 = [p["p95"] / base[p["round"]]["p95"] for p in rows if p["round"] in base]
        summary[arm] = {
            "p50": statistics.median(p["p50"] for p in rows) if rows else None,
            "p95": statistics.median(p["p95"] for p in rows) if rows else None,
            "p50_ratio": round(statistics.median(ratio50), 2) if ratio50 else None,
            "p95_ratio": round(statistics.median(ratio95), 2) if ratio95 else None,
            "rollouts_per_min": statistics.median(p["rollouts_per_min"] for p in rows) if rows else None,
            "chats": sum(p["chats"] for p in rows)}
        s = summary[arm]
        table.add_row(arm, f"{s['p50']:.2f}" if s["p50"] else "-", f"{s['p50_ratio']:.2f}x" if s["p50_ratio"] else "-",
                      f"{s['p95']:.2f}" if s["p95"] else "-", f"{s['p95_ratio']:.2f}x" if s["p95_ratio"] else "-",
                      f"{s['rollouts_per_min']:.0f}" if arm != "users alone" else "-", str(s["chats"]))
    console.print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"example": args.example, "users": args.users, "phase_s": args.phase_s,
                                    "phases": phases, "summary": summary}, indent=2))
    publish(args, "engine_share", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
