"""Hot-swap cost: how fast a release becomes visible, and what repeated swaps do to request latency.

One `reef serve` (managed vLLM, tiny model), two gate-selected LoRA candidates and one full one.
1. Visible: from the release call until a request's answer comes from the new release (its record
   carries the new release id), for LoRA and full-weight swaps; target LoRA <= 500 ms.
2. Latency: 8 clients at temperature 0, `--seconds` with no swaps, then as long with a swap
   (alternating rollbacks between the two LoRA releases) every `--every` seconds, side by side;
   target p99 during swaps <= 1.5x baseline.

    .venv/bin/python bench/swap.py [--seconds 20] [--every 1.0]

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.client import ReefClient  # noqa: E402
from reef.config import GateSettings  # noqa: E402
from reef.gate.evaluate import evaluate_candidate  # noqa: E402
from reef.recipe import Snapshot, load_recipe  # noqa: E402
from reef.registry.candidates import register_candidate  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402
from reef.traffic.offline import record_offline_traffic  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402
from tests.helpers.tiny import task as demo  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
TOKEN = "bench"
S = demo.SCENARIO
console = Console()
SWAP_MS: list[float] = []


def candidates(work: Path, data: Path) -> dict[str, str]:
    """Train, register and gate: name -> candidate id."""
    record_offline_traffic(TINY, work / "traffic", "demo-add", prompts=64, samples=4, seed=1)
    specs = {"lora-a": {"kind": "lora", "learning_rate": 5e-3, "seed": 0},
             "lora-b": {"kind": "lora", "learning_rate": 5e-3, "seed": 1},
             "full": {"kind": "full", "learning_rate": 5e-4, "seed": 0}}
    out = {}
    for name, params in specs.items():
        rft = load_recipe("rft", {"scenario": S, "base_model": str(TINY), "max_steps": 30,
                                  "per_device_batch_size": 16, "min_score": 1.0, **params})
        snap = Snapshot.create(S, work / "traffic", rft.experience(), root=work / "snapshots",
                               ledger_root=work / "ledger")
        cand = rft.run(snap, out_root=work / "candidates" / name, progress=False, consume=False)
        view = register_candidate(data, cand.path)
        result = evaluate_candidate(data, view.candidate_id, GateSettings(samples=2), progress=False)
        assert result.decision == "select", result.reason
        out[name] = view.candidate_id
    return out


def ask(http: httpx.Client) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = http.post("/v1/chat/completions", json={
        "model": "reef-tiny", "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "temperature": 0, "max_tokens": 8})
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1000, r.headers["x-reef-agent-record-id"]


def visible_ms(api: ReefClient, http: httpx.Client, do: callable) -> float:  # type: ignore[valid-type]
    """From the release call until an answer recorded under the new release arrives."""
    t0 = time.perf_counter()
    new = do()["release"]["release_id"]
    while True:
        _, record_id = ask(http)
        if http.get(f"/reef/records/{record_id}").json()["release_id"] == new:
            return (time.perf_counter() - t0) * 1000


def latencies(url: str, seconds: float, swap: callable | None, every: float) -> tuple[list[float], int, int]:  # type: ignore[valid-type]
    stop = threading.Event()
    lat: list[float] = []
    errors = 0

    def client() -> None:
        nonlocal errors
        with httpx.Client(base_url=url, timeout=60, headers={"x-reef-scenario": S}) as http:
            while not stop.is_set():
                try:
                    lat.append(ask(http)[0])
                except httpx.HTTPError:
                    errors += 1

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    swaps = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(every)
        if swap is not None:
            t0 = time.perf_counter()
            swap()
            SWAP_MS.append((time.perf_counter() - t0) * 1000)
            swaps += 1
    stop.set()
    for t in threads:
        t.join()
    return lat, errors, swaps


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 100 else max(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "swap.json")
    add_flag(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="reef-swap-"))
    (work / "serve.yaml").write_text(f"admin_token: {TOKEN}\nserved_model_name: reef-tiny\n")
    with console.status("training and gating three candidates..."):
        ids = candidates(work, work / "data")
    server = ServeProcess(work, ["--model", str(TINY)])
    with console.status("starting reef serve and vLLM..."):
        server.start()
    try:
        api = ReefClient(server.url, admin_token=TOKEN)
        http = httpx.Client(base_url=server.url, timeout=60, headers={"x-reef-scenario": S})
        ask(http)
        def serve(content: str) -> dict:
            """Release the candidate the first time, then roll back to the release that served it."""
            head = api.head(S)
            if api.candidate(content)["status"] == "selected":
                return api.release(S, content, head)
            earlier = [r["release_id"] for r in api.releases(S)["releases"] if r["content_id"] == content]
            return api.rollback(S, earlier[-1], head)

        rows: dict[str, list[float]] = {"lora": [], "full": []}
        for _ in range(3):
            for kind, name in (("lora", "lora-a"), ("full", "full")):
                rows[kind].append(visible_ms(api, http, lambda n=name: serve(ids[n])))
                api.rollback(S, f"{S}@r0", api.head(S))
        serve(ids["lora-b"])
        lora_releases = [next(r["release_id"] for r in api.releases(S)["releases"] if r["content_id"] == ids[n])
                         for n in ("lora-a", "lora-b")]

        def swap() -> None:
            releases = api.releases(S)
            current = releases["head"]["content_id"]
            target = lora_releases[0] if current == ids["lora-b"] else lora_releases[1]
            api.rollback(S, target, releases["head"]["release_id"])

        with console.status(f"latency without swaps ({args.seconds:.0f} s)..."):
            base, base_err, _ = latencies(server.url, args.seconds, None, args.every)
        with console.status(f"latency with a swap every {args.every} s ({args.seconds:.0f} s)..."):
            during, during_err, swaps = latencies(server.url, args.seconds, swap, args.every)
    finally:
        server.stop()
    result = {
        "lora_visible_ms": {"median": statistics.median(rows["lora"]), "max": max(rows["lora"])},
        "full_visible_ms": {"median": statistics.median(rows["full"]), "max": max(rows["full"])},
        "baseline": {"requests": len(base), "errors": base_err, "p50_ms": statistics.median(base),
                     "p99_ms": p(base, 99)},
        "swapping": {"requests": len(during), "errors": during_err, "swaps": swaps,
                     "p50_ms": statistics.median(during), "p99_ms": p(during, 99)},
    }
    result["swap_call_ms"] = {"median": statistics.median(SWAP_MS), "max": max(SWAP_MS)}
    result["p99_ratio"] = result["swapping"]["p99_ms"] / result["baseline"]["p99_ms"]
    table = Table(title="hot-swap (tiny model, 2 CPU cores)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("LoRA release visible, median / max", f"{result['lora_visible_ms']['median']:.0f} / "
                  f"{result['lora_visible_ms']['max']:.0f} ms", "<= 500 ms")
    table.add_row("full release visible, median / max", f"{result['full_visible_ms']['median']:.0f} / "
                  f"{result['full_visible_ms']['max']:.0f} ms", "")
    table.add_row("p99 without swaps", f"{result['baseline']['p99_ms']:.1f} ms ({len(base)} requests)", "")
    table.add_row(f"p99 with {swaps} LoRA swaps", f"{result['swapping']['p99_ms']:.1f} ms ({len(during)} requests)", "")
    table.add_row("swap call (API), median / max", f"{result['swap_call_ms']['median']:.0f} / "
                  f"{result['swap_call_ms']['max']:.0f} ms", "")
    table.add_row("p99 ratio", f"{result['p99_ratio']:.2f}x", "<= 1.5x")
    table.add_row("failed requests", f"{base_err} / {during_err}", "0")
    console.print(table)
    publish(args, "swap", table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
