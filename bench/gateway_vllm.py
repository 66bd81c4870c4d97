"""bench/gateway_overhead.py's vLLM rounds: each dialect, JSON and stream, straight to vLLM and through the gateway.

Also the load it drives (16 asyncio httpx clients, the same prompt in each dialect) and the
gateway's CPU clock, which the stand-in rows share. With `--stream-interval N` the same stream rows
run once more against an engine that sends N tokens per event (vLLM's `--stream-interval`, Reef's
`engine.stream_interval`), as rows of their own: the target rows stay at the engine's default of
one token per event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from reef.config import ServeConfig
from reef.engine.supervisor import EngineSupervisor
from reef.serve_process import ServeProcess

MODEL_NAME = "reef-tiny"

# The gateway's dialects: path, the stream's content-delta marker, the JSON answer's token count.
DIALECTS = {
    "chat": ("/v1/chat/completions", ('"delta"', '"content"'), lambda r: r["usage"]["completion_tokens"]),
    "responses": ("/v1/responses", ('"response.output_text.delta"',), lambda r: r["usage"]["output_tokens"]),
    "messages": ("/v1/messages", ('"text_delta"',), lambda r: r["usage"]["output_tokens"]),
}


async def batch(url: str, clients: int, per_client: int, stream: bool, tokens: int,
                 dialect: str = "chat", capture: bool = False) -> tuple[float, list[float], int]:
    body = request_body(tokens, stream, dialect, capture)
    path, marks, count = DIALECTS[dialect]
    latencies: list[float] = []
    produced = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal produced
        for _ in range(per_client):
            t0 = time.perf_counter()
            if stream:
                async with http.stream("POST", path, json=body) as resp:
                    resp.raise_for_status()
                    async for line in resp.aiter_lines():
                        if line.startswith("data:") and all(m in line for m in marks):
                            produced += 1
            else:
                resp = await http.post(path, json=body)
                resp.raise_for_status()
                produced += count(resp.json())
            latencies.append((time.perf_counter() - t0) * 1000)

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=64)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return wall, latencies, produced



def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of a process so far, all its threads (ended ones too). On Linux the
    process's CPU clock, to the nanosecond; psutil's figure comes in 10 ms ticks, a third of the
    gateway's CPU over a round of 64 JSON requests."""
    try:
        return time.clock_gettime(((~proc.pid) << 3) | 2)  # the kernel's MAKE_PROCESS_CPUCLOCK(pid, SCHED)
    except OSError:
        times = proc.cpu_times()
        return times.user + times.system



def request_body(tokens: int, stream: bool = False, dialect: str = "chat", capture: bool = False) -> dict[str, object]:
    """The same prompt and sampling in each dialect (`ignore_eos`: vLLM's, passed on by all three).
    `capture`: also what the gateway adds upstream for its records (logprobs, token ids, usage)."""
    ask = "What is 3 + 4?"
    common = {"model": MODEL_NAME, "ignore_eos": True, "temperature": 1.0, "stream": stream}
    if dialect == "responses":
        return {**common, "input": ask, "max_output_tokens": tokens, "store": False}
    messages = [{"role": "user", "content": ask}]
    body = {**common, "messages": messages, "max_tokens": tokens}
    if capture:
        body |= {"logprobs": True, "return_token_ids": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
    return body



def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def latency(direct: list[float], gateway: list[float]) -> dict[str, float]:
    out = {}
    for q in (50, 99):
        out[f"direct_p{q}_ms"], out[f"gateway_p{q}_ms"] = pct(direct, q), pct(gateway, q)
        out[f"added_p{q}_ms"] = out[f"gateway_p{q}_ms"] - out[f"direct_p{q}_ms"]
    return out


def modes(dialects: list[str], interval: int = 1,
          kinds: tuple[bool, ...] = (False, True)) -> list[tuple[str, str, bool]]:
    """The rows: (name, dialect, stream) for each dialect, JSON and stream. Chat keeps its rows' old
    names; rows with an engine streaming `interval` tokens per event say so."""
    suffix = f", stream_interval {interval}" if interval != 1 else ""
    return [((("stream" if stream else "json") if d == "chat" else f"{d} {'stream' if stream else 'json'}") + suffix,
             d, stream) for d in dialects for stream in kinds]


Rows = dict[str, dict[str, float | list[float]]]


def vllm_rounds(args: argparse.Namespace, vllm_url: str, gw_url: str, proc: psutil.Process, idle_cpu: float,
                log: Callable[[str], None], interval: int = 1,
                kinds: tuple[bool, ...] = (False, True)) -> tuple[Rows, list[float]]:
    """Every dialect's JSON and stream rows, side by side: in each round, for JSON and then stream
    (the other way round every other round), one batch straight to vLLM (chat completions, as a
    client would ask), one asking vLLM what the gateway asks it (`--capture-arm`: logprobs, token
    ids, usage) and one through the gateway per dialect, in an order that rotates each round. So
    the six rows share their rounds, their direct arm and the machine's drift; ratios are per round.
    `interval`: the engine's `--stream-interval` (rows named for it when not 1); `kinds`: JSON
    (False) and stream (True) rows, or one of them.
    Returns the rows and the machine's 1-minute load average at each round's start."""
    dialects = args.dialects.split(",")
    capture_arm = args.capture_arm and interval == 1
    direct_arms = ["direct", "direct+capture"] if capture_arm else ["direct"]
    arms = direct_arms + dialects
    runs: dict[tuple[str, bool], dict[str, list[float]]] = {
        (arm, stream): {"wall": [], "lat": [], "tok": [], "cpu": [], "net": []}
        for arm in arms for stream in kinds}

    def one(arm: str, stream: bool, per_client: int) -> tuple[float, list[float], int]:
        if arm in direct_arms:  # direct is always chat completions: a dialect's cost against the engine
            return asyncio.run(batch(vllm_url, args.clients, per_client, stream, args.tokens,
                                      capture=arm == "direct+capture"))
        return asyncio.run(batch(gw_url, args.clients, per_client, stream, args.tokens, arm))

    for arm in arms:
        for stream in kinds:
            one(arm, stream, 1)  # warm-up: connections, code paths, vLLM's prefix cache
    loads: list[float] = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for stream in kinds if r % 2 == 0 else kinds[::-1]:
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                cpu0 = cpu_s(proc)
                wall, lat, tok = one(arm, stream, args.requests_per_client)
                if interval > 1:  # an event holds up to `interval` tokens: count the streams' tokens
                    tok = len(lat) * args.tokens
                cpu_ms = (cpu_s(proc) - cpu0) * 1000
                run = runs[(arm, stream)]
                run["wall"].append(wall)
                run["lat"].extend(lat)
                run["tok"].append(tok)
                run["cpu"].append(cpu_ms / len(lat))
                run["net"].append((cpu_ms - idle_cpu * wall) / len(lat))
                log(f"  round {r + 1} {'stream' if stream else 'json':6} {arm:14}: {tok / wall:7.0f} tok/s"
                              + ("" if arm in direct_arms else f", gateway CPU {cpu_ms / len(lat):.2f} ms per request"))

    def tok_s(arm: str, stream: bool) -> list[float]:
        run = runs[(arm, stream)]
        return [t / w for t, w in zip(run["tok"], run["wall"], strict=True)]

    results: dict[str, dict[str, float | list[float]]] = {}
    for mode, dialect, stream in modes(dialects, interval, kinds):
        run = runs[(dialect, stream)]
        cpu = run["cpu"]
        ratios = [g / d for g, d in zip(tok_s(dialect, stream), tok_s("direct", stream), strict=True)]
        ratio_q = quartiles(ratios)
        cpu_q = quartiles(cpu)
        row: dict[str, float | list[float]] = {
            "gateway_cpu_ms_per_request": statistics.median(cpu),
            "gateway_cpu_ms_per_request_q1": cpu_q[0], "gateway_cpu_ms_per_request_q3": cpu_q[2],
            "gateway_cpu_ms_per_request_rounds": cpu,
            "gateway_cpu_ms_per_request_net_of_idle": statistics.median(run["net"]),
            # Per round, against the chat row of the same kind in the same round.
            "cpu_vs_chat": statistics.median(c / base for c, base in zip(cpu, runs[("chat", stream)]["cpu"],
                                                                          strict=True))
            if "chat" in dialects else 1.0,
            "direct_tok_s": statistics.median(tok_s("direct", stream)),
            "gateway_tok_s": statistics.median(tok_s(dialect, stream)),
            "throughput_ratio": statistics.median(ratios),
            "throughput_ratio_q1": ratio_q[0], "throughput_ratio_q3": ratio_q[2],
            "throughput_ratios": ratios,
            **latency(runs[("direct", stream)]["lat"], run["lat"]),
        }
        if capture_arm:
            row["direct_capture_tok_s"] = statistics.median(tok_s("direct+capture", stream))
            row["throughput_ratio_vs_capture"] = statistics.median(
                g / d for g, d in zip(tok_s(dialect, stream), tok_s("direct+capture", stream), strict=True))
        results[mode] = row
    return results, loads


def quartiles(values: list[float]) -> list[float]:
    return statistics.quantiles(values, n=4) if len(values) > 1 else values * 3


def recorded_response(vllm_url: str, tokens: int) -> bytes:
    """One real vLLM response: `tokens` tokens with their ids and logprobs."""
    recorded = httpx.post(f"{vllm_url}/v1/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "What is 3 + 4?"}], "max_tokens": tokens,
        "ignore_eos": True, "logprobs": True, "return_token_ids": True})
    recorded.raise_for_status()
    return recorded.content


def interval_rows(args: argparse.Namespace, model: Path, data_dir: Path, idle_cpu: float,
                  log: Callable[[str], None]) -> Rows:
    """The stream rows again, against a second engine started with `--stream-interval` N and a
    gateway in front of it (`args.stream_interval` rounds each; the first engine idles meanwhile)."""
    n = args.stream_interval
    config = ServeConfig(model=str(model), served_model_name=MODEL_NAME, data_dir=data_dir,
                         engine={"stream_interval": n})  # type: ignore[arg-type]
    engine = EngineSupervisor(config, data_dir / "logs" / f"bench-vllm-interval-{n}.log")
    log(f"starting vLLM with --stream-interval {n}...")
    url = engine.start()
    gw = ServeProcess(Path(tempfile.mkdtemp(prefix="reef-bench-")), ["--upstream-url", url],
                      env={"REEF_SERVED_MODEL_NAME": MODEL_NAME}).start()
    try:
        assert gw.process is not None
        rows, _ = vllm_rounds(args, url, gw.url, psutil.Process(gw.process.pid), idle_cpu, log, interval=n,
                              kinds=(True,))
        return rows
    finally:
        gw.stop()
        engine.stop()
