"""The stream rows of bench/gateway_overhead.py against a stand-in upstream, beside the floor of any SSE relay.

The gateway's CPU per stream against vLLM moves with everything else on the machine (vLLM's own
work most of all). Here the upstream is a stand-in replaying one recorded vLLM stream (as the
gateway asks for it: logprobs, token ids, usage) one event per write, `GAP_S` apart, as an engine
sends tokens; rounds alternate the gateway (each dialect) with a bare relay: uvicorn as `reef
serve` runs it and Reef's upstream transport (`reef.gateway.transport.http1`), relaying each read
as one write, with nothing parsed, recorded or translated. The relay is the floor of relaying an
SSE stream event by event through a Python ASGI server on this machine at that moment (a socket
read, a write and a wake-up of the event loop per event); gateway minus relay is what Reef adds.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

GAP_S = 0.002  # between events: each arrives in a read of its own, as an engine's tokens do
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm_samples" / "stream.txt"


def recorded_stream(vllm_url: str, body: dict[str, object]) -> list[bytes]:
    """One real vLLM stream: its SSE events (`data: ...\\n\\n`), `[DONE]` included."""
    with httpx.stream("POST", f"{vllm_url}/v1/chat/completions", json=body, timeout=120) as resp:
        resp.raise_for_status()
        raw = resp.read()
    return [line + b"\n\n" for line in raw.split(b"\n") if line.startswith(b"data:")]


def fixture_stream(tokens: int) -> list[bytes]:
    """Without vLLM: the test suite's recorded stream, its token events repeated to `tokens`."""
    events = [line + b"\n\n" for line in FIXTURE.read_bytes().split(b"\n") if line.startswith(b"data:")]
    head, middle, tail = events[:1], events[1:-3], events[-3:]  # tail: the finish, the usage, [DONE]
    return head + [middle[i % len(middle)] for i in range(tokens)] + tail


def _stand_in(port: int, events: list[bytes]) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(event)
            await asyncio.sleep(GAP_S)
        await resp.write_eof()
        return resp

    serve_upstream(port, chat, "reef-tiny")


def serve_upstream(port: int, chat: Callable[..., Any], model: str) -> None:
    """A stand-in vLLM on `port` (aiohttp): `chat` answers chat completions, `/v1/models` lists
    `model`, `/health` answers."""
    from aiohttp import web

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def _relay(port: int, upstream: str) -> None:
    """The floor: uvicorn (uvloop, httptools, no access log) and Reef's upstream transport, each read
    of the upstream's body written to the client as it came."""
    import uvicorn

    from reef.gateway.transport.http1 import ConnectionPool

    pools: list[ConnectionPool] = []

    async def app(scope: dict, receive, send) -> None:  # noqa: ANN001
        if not pools:
            pools.append(ConnectionPool(upstream, {}, 600.0))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        conn = await pools[0].request("POST", "/v1/chat/completions", body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        try:
            async for data in conn.chunks():
                await send({"type": "http.response.body", "body": data, "more_body": True})
        finally:
            pools[0].release(conn)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off",
                loop="uvloop", http="httptools")


def stream_cpu(events: list[bytes], rounds: int, dialects: list[str],
               gateway: Callable[[str], tuple[str, psutil.Process, Callable[[], None]]],
               load: Callable[[str, str], int], cpu_s: Callable[[psutil.Process], float],
               free_port: Callable[[], int], log: Callable[[str], None],
               baseline: Callable[[str], tuple[str, psutil.Process, Callable[[], None]]] | None = None,
               ) -> dict[str, list[float]]:
    """CPU ms per stream, per round, of the relay and of the gateway for each dialect, in front of
    the stand-in, arms rotating each round. `gateway(upstream_url)` starts one (url, process, stop);
    `load(url, dialect)` runs one round of streams and returns how many were served. `baseline`
    starts another checkout's gateway: its arms (`base <dialect>`) run in the same rounds."""
    spawn = multiprocessing.get_context("spawn")
    port, relay_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{port}"
    stand_in = spawn.Process(target=_stand_in, args=(port, events), daemon=True)
    relay = spawn.Process(target=_relay, args=(relay_port, upstream), daemon=True)
    stand_in.start()
    relay.start()
    gw_url, gw_proc, stop = gateway(upstream)
    stops = [stop]
    try:
        relay_url = f"http://127.0.0.1:{relay_port}"
        _wait_up(relay_url)
        assert relay.pid is not None
        arms: dict[str, tuple[str, psutil.Process, str]] = {"relay": (relay_url, psutil.Process(relay.pid), "chat")}
        arms |= {d: (gw_url, gw_proc, d) for d in dialects}
        if baseline is not None:
            base_url, base_proc, base_stop = baseline(upstream)
            stops.append(base_stop)
            arms |= {f"base {d}": (base_url, base_proc, d) for d in dialects}
        for url, _, dialect in arms.values():
            load(url, dialect)  # warm-up
        per_round: dict[str, list[float]] = {arm: [] for arm in arms}
        names = list(arms)
        for r in range(rounds):
            for arm in names[r % len(names):] + names[:r % len(names)]:
                url, proc, dialect = arms[arm]
                cpu0 = cpu_s(proc)
                served = load(url, dialect)
                per_round[arm].append((cpu_s(proc) - cpu0) * 1000 / served)
            log(f"  stand-in stream round {r + 1}, CPU ms per stream: "
                + ", ".join(f"{arm} {per_round[arm][-1]:.2f}" for arm in names))
        return per_round
    finally:
        for halt in stops:
            halt()
        for p in (stand_in, relay):
            p.terminate()
            p.join()


def _wait_up(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as http:
        while True:
            try:
                http.get(url)
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def stream_rows(per_round: dict[str, list[float]]) -> dict[str, dict[str, float | list[float]]]:
    """Per dialect: the median CPU per stream [q1, q3], the relay's in the same rounds, and what
    Reef adds above it (per round)."""
    relay = per_round["relay"]
    out: dict[str, dict[str, float | list[float]]] = {}
    for arm, cpu in per_round.items():
        if arm == "relay" or arm.startswith("base "):
            continue
        q = statistics.quantiles(cpu, n=4) if len(cpu) > 1 else cpu * 3
        out[arm] = {"gateway_cpu_ms_per_request": statistics.median(cpu), "gateway_cpu_ms_per_request_q1": q[0],
                    "gateway_cpu_ms_per_request_q3": q[2], "gateway_cpu_ms_per_request_rounds": cpu,
                    "relay_cpu_ms_per_stream": statistics.median(relay), "relay_rounds": relay,
                    "reef_added_cpu_ms_per_stream": statistics.median(g - b for g, b in zip(cpu, relay, strict=True))}
        base = per_round.get(f"base {arm}")
        if base is not None:  # per round, so drift in the machine's load cancels out
            out[arm] |= {"baseline_cpu_ms_per_stream": statistics.median(base), "baseline_rounds": base,
                         "change_vs_baseline": statistics.median(g / b - 1 for g, b in zip(cpu, base, strict=True))}
    return out


def describe(rows: dict[str, dict[str, float | list[float]]], tokens: int) -> str:
    relay = next(iter(rows.values()))["relay_cpu_ms_per_stream"]
    return (f"stand-in upstream, {tokens}-token streams: a bare SSE relay (uvicorn + Reef's upstream transport, "
            f"nothing parsed or recorded) costs {relay:.2f} ms CPU per stream in the same rounds; Reef adds "
            + ", ".join(f"{r['reef_added_cpu_ms_per_stream']:.2f} ms ({d})" for d, r in rows.items())
            + " above it" + "".join(
                f"; {d} against the baseline checkout in the same rounds: {r['baseline_cpu_ms_per_stream']:.2f} -> "
                f"{r['gateway_cpu_ms_per_request']:.2f} ms ({100 * r['change_vs_baseline']:+.1f} %)"
                for d, r in rows.items() if "baseline_cpu_ms_per_stream" in r))
