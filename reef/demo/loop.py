"""The learning loop of `make demo`, watched live: simulated users talk to `reef serve`, its learner
trains on what they reported, the gate selects, the server hot-swaps, and the success rate climbs
release by release.

`watch()` plays traffic in waves and, after each wave, reads the recorded experience (success rate
per release on live traffic, from the reports) and the server's status (learner round, gate
decision, head, and the held-out success the gate measured for the head and the candidate), and
shows them in a live table. `plot()` draws the same as a PNG.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import polars as pl
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from reef.experience.load import load
from reef.scenario import Scenario
from reef.traffic.simulate import simulate


@dataclass
class Wave:
    index: int
    at_s: float
    head: str
    success: float
    requests: int


@dataclass
class LoopState:
    waves: list[Wave] = field(default_factory=list)
    by_release: pl.DataFrame | None = None
    learner: dict[str, Any] = field(default_factory=dict)
    head: str = "?"
    events: list[str] = field(default_factory=list)
    # release id -> held-out success the gate measured for it (the head's when it judged a
    # candidate against it, a released candidate's own)
    held_out: dict[str, float] = field(default_factory=dict)

    def held_out_summary(self) -> str:
        if not self.held_out:
            return "no gate ran"
        first, last = next(iter(self.held_out.items())), list(self.held_out.items())[-1]
        return (f"{first[0]} {first[1]:.1%} -> {last[0]} {last[1]:.1%} "
                f"({100 * (last[1] - first[1]):+.0f} points)")


def per_release(data_dir: Path, scenario: str) -> pl.DataFrame:
    """Success rate of each release over the reported records it answered, in release order."""
    frame = load(scenario, data_dir).lazy().filter(pl.col("score").is_not_null()).collect()
    if frame.is_empty():
        return pl.DataFrame(schema={"release_id": pl.String, "records": pl.UInt32, "success": pl.Float64})
    return (frame.group_by("release_id").agg(pl.len().alias("records"), pl.col("score").mean().alias("success"))
            .with_columns(pl.col("release_id").str.extract(r"@r(\d+)$").cast(pl.Int64).alias("seq"))
            .sort("seq").drop("seq"))


def _render(state: LoopState, scenario: str) -> Group:
    table = Table(title=f"success rate by release, scenario {scenario} (head: {state.head})")
    table.add_column("release")
    table.add_column("reported chats", justify="right")
    table.add_column("success on live traffic", justify="right")
    table.add_column("")
    table.add_column("held-out success (gate)", justify="right")
    if state.by_release is not None:
        for row in state.by_release.iter_rows(named=True):
            bar = "#" * round(30 * row["success"])
            held = state.held_out.get(row["release_id"])
            table.add_row(row["release_id"], str(row["records"]), f"{row['success']:.1%}", bar,
                          "-" if held is None else f"{held:.1%}")
    learner = state.learner
    last = learner.get("last_round") or {}
    gate = last.get("gate") or {}
    status = Text(f"learner: {'training a round' if learner.get('running') else 'waiting for experience'}"
                  f" | rounds {learner.get('rounds', 0)} | pending {(learner.get('pending') or {}).get('records', '-')}"
                  f" | last gate: {gate.get('decision') or '-'}")
    return Group(table, status, *[Text(e, style="dim") for e in state.events[-6:]])


def watch(url: str, data_dir: Path, scenario: str | Scenario, *, rounds: int, max_seconds: float, wave: int = 64,
          concurrency: int = 16, idle_seconds: float = 120.0, corrections: bool = True, seed: int = 0) -> LoopState:
    """Waves of simulated users until `rounds` learning rounds finished (and one wave more, on what
    they released), `max_seconds` passed, or,
    after a first round, the learner found too little new experience for `idle_seconds` (a good
    model mostly repeats replies it was already trained on, and duplicates are not trained twice).
    `corrections`: the users correct a rejected reply with the task's reference (else rewards only);
    `seed`: where the waves' seeds start (wave i draws with seed + i)."""
    declared, scenario = scenario, scenario.name if isinstance(scenario, Scenario) else scenario
    state = LoopState()
    state.head = httpx.get(f"{url}/reef/status", timeout=30).json()["scenarios"].get(scenario, {}).get(
        "serving_release", "?")
    started = time.monotonic()
    seen_rounds = 0
    closing = False
    busy_at = started
    with Live(_render(state, scenario), refresh_per_second=2, transient=False) as live:
        i = 0
        while time.monotonic() - started < max_seconds:
            summary = simulate(url, scenario=declared, requests=wave, concurrency=concurrency, seed=seed + i,
                               corrections=corrections, progress=False)
            status = httpx.get(f"{url}/reef/status", timeout=30).json()
            state.learner = (status.get("learner", {}).get("scenarios") or {}).get(scenario, {})
            judged_head, state.head = state.head, status["scenarios"].get(scenario, {}).get("serving_release", "?")
            # A wave is labelled with the head it started under: a swap lands at most at its end.
            state.waves.append(Wave(i, time.monotonic() - started, judged_head, summary.mean_score,
                                    summary.requests))
            if state.learner.get("rounds", 0) > seen_rounds:
                seen_rounds = state.learner["rounds"]
                last = state.learner.get("last_round") or {}
                gate = last.get("gate") or {}
                released = last.get("release")
                if gate.get("head_success") is not None:
                    state.held_out.setdefault(judged_head, gate["head_success"])
                if released and gate.get("candidate_success") is not None:
                    state.held_out[released] = gate["candidate_success"]
                state.events.append(f"round {seen_rounds}: gate {gate.get('decision')}: {gate.get('reason')}"
                                    + (f" -> released {released}" if released else ""))
            state.by_release = per_release(data_dir, scenario)
            live.update(_render(state, scenario))
            i += 1
            if closing:
                break  # a round the learner started meanwhile dies with the server: the demo has shown its rounds
            closing = seen_rounds >= rounds  # then one more wave, served by what the last round released
            if state.learner.get("running"):
                busy_at = time.monotonic()
            elif seen_rounds and time.monotonic() - busy_at > idle_seconds:
                state.events.append(f"no round for {idle_seconds:.0f} s: too few new rewarded chats that are not "
                                    "duplicates of what was trained on; stopping")
                live.update(_render(state, scenario))
                break
    return state


def plot(state: LoopState, scenario: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    releases = list(dict.fromkeys(w.head for w in state.waves))
    colours = plt.get_cmap("viridis")([i / max(1, len(releases) - 1) for i in range(len(releases))])
    for release, colour in zip(releases, colours, strict=True):
        waves = [w for w in state.waves if w.head == release]
        left.plot([w.at_s for w in waves], [w.success for w in waves], "o-", color=colour, label=release)
    left.set_xlabel("seconds since the demo started")
    left.set_ylabel("success rate of a wave of chats")
    left.set_ylim(0, 1)
    left.set_title("live success rate, coloured by the head release")
    left.legend(fontsize=8)
    if state.by_release is not None and not state.by_release.is_empty():
        names = state.by_release["release_id"].to_list()
        xs = range(len(names))
        live = right.bar([x - 0.2 for x in xs], state.by_release["success"].to_list(), width=0.4, color="#2a7fbf",
                         label="live traffic (all its reported chats)")
        judged = [state.held_out.get(n) for n in names]
        held = right.bar([x + 0.2 for x in xs], [v or 0.0 for v in judged], width=0.4,
                         color="#e07b39", label="held-out suite (the gate's measure)")
        right.bar_label(live, fmt="{:.0%}", fontsize=8)
        right.bar_label(held, labels=["-" if v is None else f"{v:.0%}" for v in judged], fontsize=8)
        right.set_xticks(list(xs), [n.split("@")[-1] for n in names])
        right.set_ylim(0, 1)
        right.set_xlabel("release")
        right.set_title("success rate of each release")
        right.legend(fontsize=8)
    fig.suptitle(f"Reef learning loop on SmolLM2-135M-Instruct, scenario {scenario}: "
                 f"held-out {state.held_out_summary()}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
