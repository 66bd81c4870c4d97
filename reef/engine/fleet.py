"""`engine.replicas: N`: N supervised vLLM engines of one model, behind the gateway's balancer.

Each engine is an `EngineSupervisor` of its own: its own process group, reaper and loopback port
(`engine.port + i` when a port is set, else free ports), its own log (`vllm.log`, `vllm-1.log`, ...),
and on a GPU box its own share of the visible devices (`CUDA_VISIBLE_DEVICES`, the devices split
evenly, so `--tensor-parallel-size` in `engine.extra_args` may use a share's several GPUs). They
start at once, and the gateway balances them like `upstream.urls` (reef.gateway.transport.replicas).

An engine that dies is restarted by its own supervisor, as one engine is; the others keep serving
meanwhile. It is not the fleet that puts the releases back on it: the balancer takes it out when
its `/health` fails and brings it in step with every head and canary before it serves again
(reef.serving.replica_sync), the same path as a replica somebody else runs.

Why N engines rather than vLLM's `--data-parallel-size`: data parallelism needs one GPU per rank
and runs its ranks as one server, so a rank that dies takes the server down; it does not run on
CPU. N engines are N failure domains (one killed fails no call that can move, see replicas.py),
run anywhere vLLM runs, and get releases through the same path as remote replicas. On a box of
GPUs where one failure domain is fine, `--data-parallel-size` in `engine.extra_args` with
`engine.replicas: 1` is vLLM's own way, and its internal balancer then does what this one does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from reef.config import ServeConfig
from reef.engine.supervisor import EngineError, EngineSupervisor, free_port


def log_name(i: int) -> str:
    return "vllm.log" if i == 0 else f"vllm-{i}.log"


def device_shares(n: int, visible: str | None, count: int) -> list[str | None]:
    """Each engine's CUDA_VISIBLE_DEVICES: the visible devices (`visible`, else 0..count-1) split
    evenly; [None] * n without GPUs."""
    if count == 0:
        return [None] * n
    devices = visible.split(",") if visible else [str(i) for i in range(count)]
    per = len(devices) // n
    if per == 0:
        raise EngineError(f"engine.replicas: {n} needs a GPU each, and {len(devices)} are visible; "
                          "lower engine.replicas, or run engines elsewhere (upstream.urls)")
    return [",".join(devices[i * per:(i + 1) * per]) for i in range(n)]


def gpu_count() -> int:
    try:
        import torch  # as the supervisor does: no torch in the gateway where it is not installed
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


async def _nothing() -> None:
    pass


class EngineFleet:
    """N `EngineSupervisor`s, with the one engine's calls that `reef serve` makes."""

    def __init__(self, config: ServeConfig, log_dir: Path) -> None:
        n = config.engine.replicas
        shares = device_shares(n, os.environ.get("CUDA_VISIBLE_DEVICES"), gpu_count())
        taken = {config.port}
        self.engines: list[EngineSupervisor] = []
        for i in range(n):
            port = config.engine.port + i if config.engine.port else free_port(avoid=taken)
            taken.add(port)
            self.engines.append(EngineSupervisor(config, log_dir / log_name(i), port=port, devices=shares[i]))

    @property
    def urls(self) -> list[str]:
        return [engine.url for engine in self.engines]

    @property
    def ready(self) -> bool:
        """The gateway answers while any engine does (the balancer skips the others)."""
        return any(engine.ready for engine in self.engines)

    @property
    def startup_s(self) -> float | None:
        times = [e.startup_s for e in self.engines if e.startup_s is not None]
        return max(times) if times else None

    @property
    def last_exit(self) -> str | None:
        return next((e.last_exit for e in self.engines if e.last_exit), None)

    def retry_after_s(self) -> int:
        return min(engine.retry_after_s() for engine in self.engines)

    def start(self) -> list[str]:
        """Start every engine at once and wait for all of them; their base URLs."""
        try:
            for engine in self.engines:
                engine.launch()
            return [engine.wait_started() for engine in self.engines]
        except BaseException:
            self.stop()
            raise

    async def supervise(self, recovered: Callable[[], Awaitable[None]] = _nothing) -> None:
        """Restart each engine that dies (the balancer brings it in step: `recovered` is not called)."""
        await asyncio.gather(*(engine.supervise(_nothing) for engine in self.engines))

    def describe(self) -> dict[str, Any]:
        # (`replicas` in `GET /reef/status` is the balancer's view of the same engines, by URL)
        return {"managed": True, "ready": self.ready, "engines": [engine.describe() for engine in self.engines]}

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()
