"""Gateway overhead: the same load straight to vLLM and through `reef serve`, side by side in one run.

Leads with the gateway's own CPU time per request (its process's user + system time over a round,
all threads, from psutil, divided by the requests in it), the median of the rounds with its
quartiles: unlike throughput it holds steady on shared cores. Target: <= 1 ms per JSON request. The
gateway's idle CPU (ms per second with no requests) and the machine's load average are printed with
it: on a busy machine every figure here grows, the CPU time per request included.

The steadiest of these figures comes first: the same JSON request through a second gateway whose
upstream is a stand-in that answers every call at once with one real vLLM response, recorded from
the engine at the start (64 tokens, token ids and logprobs). With no engine to wait for, rounds are
short and vLLM does not compete for the cores, so it is the gateway's own cost per request. Its
rounds alternate with a bare uvicorn server (no Reef code: it answers the same load with the same
bytes at once), the floor of any ASGI server under this client on this machine at that moment: on a
shared machine both grow with the load, and gateway minus floor is what Reef itself adds.
That row is measured twice, under two load generators: wrk (C, 16 connections; `make bench`
installs Debian's wrk), the lead figure, and then this script's own httpx client (16 asyncio
clients), which shares the 2 cores with what it measures and costs more CPU per request than the
servers do: under it every server's CPU per request grows (the bare server's about 5x), so the
httpx row is the gateway beside a busy Python neighbour, and the figure earlier runs quoted.

Then every dialect (chat completions, the Responses API, Anthropic's Messages API), JSON and stream,
16 concurrent clients, 64 completion tokens each (`ignore_eos`), all six rows in the same rounds: each
round runs JSON then stream (the other way round every other round), and within each one batch
straight to vLLM, one asking vLLM what the gateway asks it for its records (logprobs, token ids,
usage: the engine's share of the cost) and one through the gateway per dialect, in an order that
rotates each round, so drift on a shared machine hits every arm alike. Figures are medians of the
per-round values (>= 10 rounds: three swung from 0.40 to 2.0 here): the gateway's CPU per request
(targets: <= 2 ms per stream, JSON <= 1.2x the chat row of the same rounds), the throughput ratio
gateway / direct (target >= 0.9), the added p50/p99 latency (those rounds: bench/gateway_vllm.py).
Last, with the first engine stopped, the stream rows once more against an engine started with
`--stream-interval 4` (Reef's `engine.stream_interval`: 4 tokens per event), as extra rows named for
it: not target rows, which stay at the engine's default of one token per event.

    .venv/bin/python bench/gateway_overhead.py [--rounds 10] [--requests-per-client 4] [--remark 'a CI run beside it']
    .venv/bin/python bench/gateway_overhead.py --stand-in-only   # the stand-in rows alone, no vLLM needed
    git worktree add /tmp/base REV && .venv/bin/python bench/gateway_overhead.py --stand-in-only --baseline /tmp/base
                                                                 # a change against REV, in the same rounds

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
from rich.console import Console
from rich.table import Table
from rich.text import Text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import stream_stand_in  # noqa: E402
from bench.gateway_vllm import (  # noqa: E402
    MODEL_NAME,
    batch,
    cpu_s,
    interval_rows,
    latency,
    modes,
    recorded_response,
    request_body,
    vllm_rounds,
)
from bench.results import add_flag, publish  # noqa: E402
from reef.config import ServeConfig  # noqa: E402
from reef.engine.supervisor import EngineSupervisor, free_port  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
FIXTURE = REPO / "tests" / "fixtures" / "vllm_samples" / "nonstream.json"

console = Console()


def _idle_cpu_ms_per_s(proc: psutil.Process, seconds: float = 5.0) -> float:
    """What the gateway burns with no requests (uvicorn's ticks, the store's flusher): a cost per
    second, not per request, so a slow engine makes every request look dearer by it."""
    cpu0 = cpu_s(proc)
    time.sleep(seconds)
    return (cpu_s(proc) - cpu0) * 1000 / seconds


def _stand_in(port: int, response: bytes) -> None:
    """An upstream that answers every chat call with `response` (a vLLM response recorded once)."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=response, content_type="application/json")

    stream_stand_in.serve_upstream(port, chat, MODEL_NAME)


def _fixture_response(tokens: int) -> bytes:
    """Without vLLM: the test suite's recorded vLLM response, its 5 tokens repeated to `tokens`."""
    response = json.loads(FIXTURE.read_text())
    choice = response["choices"][0]
    per_token = choice["logprobs"]["content"]
    choice["logprobs"]["content"] = [per_token[i % len(per_token)] for i in range(tokens)]
    choice["token_ids"] = [choice["token_ids"][i % len(per_token)] for i in range(tokens)]
    choice["message"]["content"] = "".join(t["token"] for t in choice["logprobs"]["content"])
    choice["finish_reason"] = "length"
    response["usage"]["completion_tokens"] = tokens
    return json.dumps(response).encode()


def _bare_server(port: int, response: bytes) -> None:
    """The floor: uvicorn alone, run as `reef serve` runs it (uvloop, httptools, no access log),
    answering every request with `response` at once: no upstream call, no record, no Reef code."""
    import uvicorn

    async def app(scope: dict, receive, send) -> None:  # noqa: ANN001
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": response})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off",
                loop="uvloop", http="httptools")


def _wrk(url: str, seconds: float, connections: int, script: Path) -> int:
    """One round of wrk (C, one thread) posting the chat body: the requests answered. Any non-2xx
    answer or socket error fails the bench: CPU per request is only meaningful for served ones."""
    done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script),
                           f"{url}/v1/chat/completions"], capture_output=True, text=True, check=True)
    if "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        raise RuntimeError(f"wrk saw failed requests:\n{done.stdout}")
    match = re.search(r"(\d+) requests in", done.stdout)
    if match is None:
        raise RuntimeError(f"unexpected wrk output:\n{done.stdout}")
    return int(match.group(1))


def _stand_in_cpu(response: bytes, rounds: int, clients: int, tokens: int,
                  load: str, baseline: Path | None = None) -> dict[str, list[float]]:
    """CPU ms per JSON request, per round: the gateway in front of the stand-in upstream, and a bare
    uvicorn server answering the same load, rounds alternating. The bare server is the floor of any
    ASGI server under this client on this machine right now: it grows with the load as the gateway's
    figure does, so gateway minus floor (per round) is what Reef adds, steadier than either alone.

    `load`: `wrk` (C, one thread, `clients` connections, 4 s a round) or `httpx` (this process's
    asyncio client, `clients` x 60 requests a round: CPU times come in 10 ms ticks). On 2 cores the
    load generator shares the machine with what it measures: httpx burns more CPU per request than
    the servers it drives, and every process's CPU per request grows under that contention (the bare
    server's about 5x).

    `baseline`: another checkout of Reef (`git worktree add /tmp/base <rev>`), whose gateway runs in
    front of the same stand-in as a third arm of the same rounds: a change measured side by side,
    under the same load at the same moments. Returns CPU ms per request per round, by arm."""
    import tempfile

    spawn = multiprocessing.get_context("spawn")
    port, bare_port = free_port(), free_port()
    stand_in = spawn.Process(target=_stand_in, args=(port, response), daemon=True)
    stand_in.start()
    bare = spawn.Process(target=_bare_server, args=(bare_port, response), daemon=True)
    bare.start()
    work = Path(tempfile.mkdtemp(prefix="reef-bench-"))
    script = work / "chat.lua"
    script.write_text(f"wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
                      f"wrk.body = {json.dumps(json.dumps(request_body(tokens)))}\n")
    gateways = {"gateway": ServeProcess(work / "gateway", ["--upstream-url", f"http://127.0.0.1:{port}"],
                                        env={"REEF_SERVED_MODEL_NAME": MODEL_NAME})}
    if baseline is not None:
        # Run from its own folder with the baseline first on the path: it imports its own `reef`.
        gateways["baseline"] = ServeProcess(work / "baseline", ["--upstream-url", f"http://127.0.0.1:{port}"],
                                            env={"PYTHONPATH": str(baseline.resolve()),
                                                 "REEF_SERVED_MODEL_NAME": MODEL_NAME})
    try:
        for gw in gateways.values():
            gw.start()
        assert bare.pid is not None
        bare_url = f"http://127.0.0.1:{bare_port}"
        with httpx.Client(timeout=1.0) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    http.get(bare_url)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        arms = {name: (gw.url, psutil.Process(gw.process.pid))  # type: ignore[union-attr]
                for name, gw in gateways.items()}
        arms["bare"] = (bare_url, psutil.Process(bare.pid))

        def one_round(url: str, warm_up: bool = False) -> int:
            if load == "wrk":
                return _wrk(url, 1 if warm_up else 4, clients, script)
            return len(asyncio.run(batch(url, clients, 4 if warm_up else 60, False, tokens))[1])

        for url, _ in arms.values():
            one_round(url, warm_up=True)
        per_round: dict[str, list[float]] = {arm: [] for arm in arms}
        names = list(arms)
        for r in range(rounds):
            # Each process's CPU over the whole set of rounds, not just its own: what a gateway
            # defers (the shard flush of its records) may run during another arm's round.
            cpu0 = {arm: cpu_s(proc) for arm, (_, proc) in arms.items()}
            served = {}
            for arm in names[r % len(names):] + names[:r % len(names)]:  # each arm first in turn
                served[arm] = one_round(arms[arm][0])
            for arm, (_, proc) in arms.items():
                per_round[arm].append((cpu_s(proc) - cpu0[arm]) * 1000 / served[arm])
            console.print(f"  stand-in round {r + 1} ({load}), CPU ms per request: " + ", ".join(
                f"{arm} {per_round[arm][-1]:.3f}" for arm in names))
        return per_round
    finally:
        for gw in gateways.values():
            gw.stop()
        for p in (stand_in, bare):
            p.terminate()
            p.join()


# The stand-in rows, by load generator: wrk leads (the gateway's own cost), httpx follows (the
# figure earlier READMEs quote, and what a Python client on the same 2 cores sees).
STAND_IN = {"wrk": "stand-in, wrk", "httpx": "stand-in, httpx"}


def _stream_stand_in(args: argparse.Namespace, events: list[bytes]) -> dict[str, dict[str, float | list[float]]]:
    """The stream rows against a stand-in upstream, beside a bare relay's (bench/stream_stand_in.py)."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="reef-bench-"))

    def gateway(upstream: str, checkout: Path | None = None) -> tuple[str, psutil.Process, Callable[[], None]]:
        env = {"REEF_SERVED_MODEL_NAME": MODEL_NAME}
        if checkout is not None:  # from its own folder, with the checkout first on the path: its own `reef`
            env["PYTHONPATH"] = str(checkout.resolve())
        gw = ServeProcess(work / ("gateway" if checkout is None else "baseline"), ["--upstream-url", upstream],
                          env=env)
        gw.start()
        assert gw.process is not None

        def stop() -> None:
            gw.stop()

        return gw.url, psutil.Process(gw.process.pid), stop

    def load(url: str, dialect: str) -> int:
        return len(asyncio.run(batch(url, args.clients, args.requests_per_client, True, args.tokens, dialect))[1])

    dialects = args.dialects.split(",")
    baseline = args.baseline
    per_round = stream_stand_in.stream_cpu(events, args.rounds, dialects, gateway, load, cpu_s, free_port,
                                           console.print,
                                           None if baseline is None else lambda up: gateway(up, baseline))
    return stream_stand_in.stream_rows(per_round)


def _stream_modes(rows: dict[str, dict[str, float | list[float]]]) -> dict[str, dict[str, float | list[float]]]:
    """The stand-in stream rows by dialect, named as results rows."""
    return {f"{'' if d == 'chat' else d + ' '}{STREAM_STAND_IN}": row for d, row in rows.items()}


STREAM_STAND_IN = "stream, stand-in"


def _loads() -> list[str]:
    if shutil.which("wrk"):
        return ["wrk", "httpx"]
    console.print("[yellow]wrk is not installed (`make bench` installs Debian's wrk): only the httpx rows, whose "
                  "client shares the cores with the gateway and inflates its CPU per request[/]")
    return ["httpx"]


def _stand_in_results(per_round: dict[str, list[float]]) -> dict[str, float | list[float]]:
    gateway, bare = per_round["gateway"], per_round["bare"]
    q = statistics.quantiles(gateway, n=4)
    added = [g - b for g, b in zip(gateway, bare, strict=True)]
    out: dict[str, float | list[float]] = {
        "gateway_cpu_ms_per_request": statistics.median(gateway),
        "gateway_cpu_ms_per_request_q1": q[0], "gateway_cpu_ms_per_request_q3": q[2],
        "gateway_cpu_ms_per_request_rounds": gateway,
        "bare_uvicorn_cpu_ms_per_request": statistics.median(bare), "bare_uvicorn_rounds": bare,
        "reef_added_cpu_ms_per_request": statistics.median(added)}
    if "baseline" in per_round:
        base = per_round["baseline"]
        out |= {"baseline_cpu_ms_per_request": statistics.median(base), "baseline_rounds": base,
                # Per round, so drift in the machine's load cancels out.
                "change_vs_baseline": statistics.median(g / b - 1 for g, b in zip(gateway, base, strict=True))}
    return out


def _print_baseline(mode: str, r: dict[str, float | list[float]]) -> list[str]:
    """The line printed (none without a baseline), for the results file."""
    if "baseline_cpu_ms_per_request" not in r:
        return []
    line = (f"baseline ({mode}, the same rounds): {r['baseline_cpu_ms_per_request']:.3f} ms CPU per request "
            f"against {r['gateway_cpu_ms_per_request']:.3f} ms for this checkout: "
            f"[bold]{100 * r['change_vs_baseline']:+.1f} %[/] (median of the per-round ratios)")
    console.print(line)
    return [line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dialects", default="chat,responses,messages",
                        help="the gateway's APIs to measure against direct vLLM (chat completions, the Responses "
                             "API, Anthropic's Messages API), JSON and stream each")
    parser.add_argument("--no-capture-arm", dest="capture_arm", action="store_false",
                        help="leave out the arm asking vLLM directly for what the gateway asks it (logprobs, token "
                             "ids, usage), which tells the engine's share of a throughput ratio from the gateway's")
    parser.add_argument("--remark", default="",
                        help="a line for the results file: what else ran on the machine meanwhile")
    parser.add_argument("--stream-interval", type=int, default=4, metavar="N",
                        help="also the stream rows against an engine sending N tokens per event (vLLM's "
                             "--stream-interval), as extra rows; 1: none")
    parser.add_argument("--upstream", help="use this running vLLM (serving reef-tiny) instead of starting one")
    parser.add_argument("--stand-in-only", action="store_true",
                        help="only the stand-in row, with no vLLM at all (its response from the test fixtures)")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="another checkout of Reef (`git worktree add /tmp/base REV`): its gateway is a third "
                             "arm of the stand-in rounds (and a `base <dialect>` arm of each stand-in stream row's), "
                             "so a change is measured side by side")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "gateway_overhead.json")
    add_flag(parser)
    args = parser.parse_args()
    if args.stand_in_only:
        return _stand_in_only(args)

    engine = None
    if args.upstream:
        vllm_url = args.upstream
    else:
        config = ServeConfig(model=str(TINY), served_model_name=MODEL_NAME, data_dir=REPO / "data")
        engine = EngineSupervisor(config, REPO / "data" / "logs" / "bench-vllm.log")
        with console.status("starting vLLM..."):
            vllm_url = engine.start()
    import tempfile

    gw = ServeProcess(Path(tempfile.mkdtemp(prefix="reef-bench-")), ["--upstream-url", vllm_url],
                      env={"REEF_SERVED_MODEL_NAME": MODEL_NAME}).start()
    assert gw.process is not None
    proc = psutil.Process(gw.process.pid)
    results: dict[str, dict[str, float | list[float]]] = {}
    load_before = os.getloadavg()
    try:
        recorded = recorded_response(vllm_url, args.tokens)
        for load in _loads():
            results[STAND_IN[load]] = _stand_in_results(_stand_in_cpu(recorded, args.rounds, args.clients,
                                                                      args.tokens, load, args.baseline))
        by_dialect = _stream_stand_in(args, stream_stand_in.recorded_stream(
            vllm_url, request_body(args.tokens, stream=True, capture=True)))
        stream_rows = _stream_modes(by_dialect)
        results |= stream_rows
        idle_cpu = _idle_cpu_ms_per_s(proc)
        rows, round_loads = vllm_rounds(args, vllm_url, gw.url, proc, idle_cpu, console.print)
        results |= rows
        # Added latency without queueing: one client at a time, short replies.
        lat: dict[str, list[float]] = {"direct": [], "gateway": []}
        for r in range(args.rounds):
            order = [("direct", vllm_url), ("gateway", gw.url)]
            for arm, url in order if r % 2 == 0 else order[::-1]:
                lat[arm].extend(asyncio.run(batch(url, 1, 16, False, 8))[1])
        results["1 client"] = latency(lat["direct"], lat["gateway"])
    finally:
        gw.stop()
        if engine is not None:
            engine.stop()
    interval = {}
    if args.stream_interval > 1:  # after the first engine stopped: never two engines at once
        interval = interval_rows(args, TINY, REPO / "data", idle_cpu, console.print)
        results |= interval
    load_after = os.getloadavg()
    machine = {"cores": os.cpu_count(), "load_avg_1m_before": load_before[0], "load_avg_1m_after": load_after[0],
               "load_avg_1m_rounds_median": statistics.median(round_loads),
               "gateway_idle_cpu_ms_per_s": idle_cpu, "remark": args.remark}
    rows_shown = [m for m, _, _ in modes(args.dialects.split(","))] + list(interval)

    cpu = Table(title=f"gateway CPU per request (its process's user + system time / requests), median of "
                      f"{args.rounds} rounds \\[q1, q3]")
    for col in ("mode", "CPU ms / request", "min - max", "net of idle", "x chat (same rounds)", "target", "met"):
        cpu.add_column(col, justify="right")
    for mode in [*(m for m in STAND_IN.values() if m in results), *stream_rows, *rows_shown]:
        r = results[mode]
        per_round = r["gateway_cpu_ms_per_request_rounds"]
        assert isinstance(per_round, list)
        where = (mode.replace("stand-in", "json, stand-in upstream") if mode in STAND_IN.values()
                 else f"{mode} upstream" if mode in stream_rows else f"{mode}, vLLM")
        ms, vs_chat = float(r["gateway_cpu_ms_per_request"]), r.get("cpu_vs_chat")  # type: ignore[arg-type]
        if "stream_interval" in mode:  # not a target row: the engine's default is one token per event
            target, met = "- (extra row)", None
        elif "stream" in mode:
            target, met = "<= 2 ms", ms <= 2.0
        elif mode in ("json", *STAND_IN.values()):
            target, met = "<= 1 ms", ms <= 1.0
        else:
            target, met = "<= 1.2x chat", vs_chat is not None and float(vs_chat) <= 1.2  # type: ignore[arg-type]
        cpu.add_row(f"{where}, {args.tokens} tok", f"{ms:.2f} "
                    f"[{r['gateway_cpu_ms_per_request_q1']:.2f}, {r['gateway_cpu_ms_per_request_q3']:.2f}]",
                    f"{min(per_round):.2f} - {max(per_round):.2f}",
                    f"{r.get('gateway_cpu_ms_per_request_net_of_idle', ms):.2f}",
                    "-" if vs_chat is None else f"{vs_chat:.2f}x", target, {None: "-", True: "yes", False: "NO"}[met])
    console.print(cpu)
    lines = []
    for mode in [m for m in STAND_IN.values() if m in results]:
        floor = results[mode]
        lines.append(f"bare uvicorn ({mode}: the floor of any ASGI server here, alternating with those rounds): "
                     f"{floor['bare_uvicorn_cpu_ms_per_request']:.2f} ms CPU per request; Reef adds "
                     f"{floor['reef_added_cpu_ms_per_request']:.2f} ms above it")
        console.print(lines[-1])
        lines += _print_baseline(mode, floor)
    lines.append(stream_stand_in.describe(by_dialect, args.tokens))
    console.print(lines[-1])
    lines.append(f"gateway idle: {idle_cpu:.2f} ms CPU per second (uvicorn's 0.1 s tick; 'net of idle' takes it "
                 f"out of each round); machine: {os.cpu_count()} cores, load average (1 min) "
                 f"{load_before[0]:.1f} before, {statistics.median(round_loads):.1f} median over the rounds, "
                 f"{load_after[0]:.1f} after")
    console.print(lines[-1])
    if args.remark:
        lines.append(f"remark: {args.remark}")
        console.print(lines[-1])
    table = Table(title=f"gateway overhead: {args.clients} clients x {args.tokens} tokens, "
                        f"median of {args.rounds} alternating rounds (direct: chat completions straight to vLLM)")
    columns = ["mode", "direct tok/s", "gateway tok/s", "ratio (>= 0.9) \\[q1, q3]"]
    if args.capture_arm:
        columns += ["direct+capture tok/s", "ratio to it"]
    for col in (*columns, "added p50 ms", "added p99 ms"):
        table.add_column(col, justify="right")
    for mode in [*rows_shown, "1 client"]:
        r = results[mode]
        if "throughput_ratio" in r:
            cells = [mode, f"{r['direct_tok_s']:.0f}", f"{r['gateway_tok_s']:.0f}",
                     f"{r['throughput_ratio']:.3f} [{r['throughput_ratio_q1']:.2f}, {r['throughput_ratio_q3']:.2f}]"]
            if args.capture_arm:
                cells += ([f"{r['direct_capture_tok_s']:.0f}", f"{r['throughput_ratio_vs_capture']:.3f}"]
                          if "direct_capture_tok_s" in r else ["-", "-"])
        else:
            cells = [f"{mode}, 8 tok", "-", "-", "-"] + (["-", "-"] if args.capture_arm else [])
        table.add_row(*cells, f"{r['added_p50_ms']:.1f}", f"{r['added_p99_ms']:.1f}")
    console.print(table)
    if interval:
        n = args.stream_interval
        lines.append(f"stream_interval {n} rows: a second vLLM started with --stream-interval {n} (Reef's "
                     f"engine.stream_interval), {n} tokens per event, its own direct arm, after the rounds above; "
                     "not target rows (the engine's default is 1 token per event)")
    if args.capture_arm:
        lines.append("direct+capture: vLLM asked directly for what the gateway asks it for every call (logprobs, "
                     "token ids, usage; the records need them): 'ratio to it' is the gateway's own share of the "
                     "throughput ratio, the rest is the engine's extra work")
    publish(args, "gateway_overhead", cpu, "\n".join(f"- {Text.from_markup(line).plain}" for line in lines), table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**results, "machine": machine}, indent=2))
    return 0


def _stand_in_only(args: argparse.Namespace) -> int:
    out: dict[str, dict[str, float | list[float]]] = {}
    lines = []
    for load in _loads():
        load_before = os.getloadavg()[0]
        per_round = _stand_in_cpu(_fixture_response(args.tokens), args.rounds, args.clients, args.tokens, load,
                                  args.baseline)
        rounds = per_round["gateway"]
        r = out[STAND_IN[load]] = _stand_in_results(per_round)
        # `\\[`: a literal bracket, not rich markup (rich drops an unknown tag such as "[q1 ...]").
        lines.append(f"gateway CPU per JSON request, stand-in upstream, {load} load, {args.tokens} tok, median of "
                     f"{args.rounds} rounds: [bold]{r['gateway_cpu_ms_per_request']:.2f} ms[/] "
                     f"\\[q1 {r['gateway_cpu_ms_per_request_q1']:.2f}, q3 {r['gateway_cpu_ms_per_request_q3']:.2f}], "
                     f"min - max {min(rounds):.2f} - {max(rounds):.2f} (target <= 1 ms); bare uvicorn under "
                     f"the same load {r['bare_uvicorn_cpu_ms_per_request']:.2f} ms, so Reef adds "
                     f"{r['reef_added_cpu_ms_per_request']:.2f} ms; machine: {os.cpu_count()} cores, "
                     f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
        console.print(lines[-1])
        lines += _print_baseline(STAND_IN[load], r)
    rows = _stream_stand_in(args, stream_stand_in.fixture_stream(args.tokens))
    out |= _stream_modes(rows)
    lines.append(stream_stand_in.describe(rows, args.tokens) + "; gateway CPU per stream " + ", ".join(
        f"{d} {r['gateway_cpu_ms_per_request']:.2f} ms" for d, r in rows.items()) + " (target <= 2 ms)")
    console.print(lines[-1])
    publish(args, "gateway_overhead_stand_in", "\n".join(f"- {Text.from_markup(line).plain}" for line in lines))
    path = args.out.with_stem(args.out.stem + "_stand_in")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
