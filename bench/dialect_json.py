"""Each dialect's JSON call against chat's, on the gateway's own CPU: issue 36's "JSON <= 1.2x the chat row".

bench/gateway_overhead.py's JSON rows against vLLM move +-20 % from round to round (the engine
shares the 2 cores), more than the 1.2x the target allows. Here one gateway in front of a
stand-in upstream (the test suite's recorded vLLM response, its tokens repeated to 64: no engine)
answers the same prompt in every dialect (chat completions, the Responses API, Anthropic's
Messages API), 16 asyncio clients, the dialects in an order that rotates each round. A dialect's
figure is its CPU per request over its own part of the round (the gateway process's CPU clock,
all threads); `x chat` is the median of the per-round ratios, so drift in the machine's load
cancels out.

    .venv/bin/python bench/dialect_json.py [--rounds 30] [--requests-per-client 30]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gateway_overhead import _fixture_response, _stand_in  # noqa: E402
from bench.gateway_vllm import MODEL_NAME, batch, cpu_s  # noqa: E402
from bench.results import add_flag, publish  # noqa: E402
from reef.engine.supervisor import free_port  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402

DIALECTS = ["chat", "responses", "messages"]
console = Console()


def rounds_cpu(rounds: int, clients: int, per_client: int, tokens: int) -> dict[str, list[float]]:
    """CPU ms per JSON request, per round, by dialect."""
    port = free_port()
    upstream = multiprocessing.get_context("spawn").Process(
        target=_stand_in, args=(port, _fixture_response(tokens)), daemon=True)
    upstream.start()
    gateway = ServeProcess(Path(tempfile.mkdtemp(prefix="reef-bench-")), ["--upstream-url", f"http://127.0.0.1:{port}"],
                           env={"REEF_SERVED_MODEL_NAME": MODEL_NAME}).start()
    assert gateway.process is not None
    proc = psutil.Process(gateway.process.pid)
    per_round: dict[str, list[float]] = {d: [] for d in DIALECTS}
    try:
        for d in DIALECTS:  # warm-up: first calls import and build what later ones reuse
            asyncio.run(batch(gateway.url, clients, 4, False, tokens, d))
        for r in range(rounds):
            for d in DIALECTS[r % len(DIALECTS):] + DIALECTS[:r % len(DIALECTS)]:
                cpu0 = cpu_s(proc)
                served = len(asyncio.run(batch(gateway.url, clients, per_client, False, tokens, d))[1])
                per_round[d].append((cpu_s(proc) - cpu0) * 1000 / served)
            console.print(f"  round {r + 1}, CPU ms per request: "
                          + ", ".join(f"{d} {v[-1]:.3f}" for d, v in per_round.items()))
    finally:
        gateway.stop()
        upstream.terminate()
        upstream.join()
    return per_round


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64)
    add_flag(parser)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    per_round = rounds_cpu(args.rounds, args.clients, args.requests_per_client, args.tokens)
    table = Table(title=f"gateway CPU per JSON request by dialect, stand-in upstream, {args.clients} clients, "
                        f"{args.tokens} tokens, median of {args.rounds} rotating rounds \\[q1, q3]")
    for col in ("dialect", "CPU ms / request", "x chat (per-round ratios)", "target", "met"):
        table.add_column(col, justify="right")
    for d, values in per_round.items():
        q = statistics.quantiles(values, n=4)
        ratio = statistics.median(v / c for v, c in zip(values, per_round["chat"], strict=True))
        target, met = ("-", "-") if d == "chat" else ("<= 1.2x chat", "yes" if ratio <= 1.2 else "NO")
        table.add_row(d, f"{statistics.median(values):.3f} [{q[0]:.3f}, {q[2]:.3f}]", f"{ratio:.2f}x", target, met)
    console.print(table)
    machine = (f"- machine: {os.cpu_count()} cores, load average (1 min) {load_before:.1f} before, "
               f"{os.getloadavg()[0]:.1f} after")
    console.print(machine)
    publish(args, "dialect_json", table, machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
