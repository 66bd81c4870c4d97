"""`ServeProcess`: a `reef serve` running as a child process (used by the demo, tests and benches)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from reef.core.paths import DEFAULT_DATA_DIR, DataDir
from reef.engine.supervisor import free_port


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Polls `url` until it answers 200 (True), or `process` exits or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    # One client for every poll: a bare httpx.get builds a new SSL context each time (~40 ms of CPU),
    # which over a vLLM startup of a minute at 10 polls a second is most of a core.
    with httpx.Client(timeout=1.0) as http:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if http.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(interval_s)
    return False


class ServeProcess:
    def __init__(self, workdir: Path, args: list[str] | None = None, env: dict[str, str] | None = None,
                 port: int | None = None):
        self.workdir = workdir
        self.data_dir = workdir / DEFAULT_DATA_DIR
        self.args = args or []
        self.env = env or {}
        self.port = port or free_port()
        self.log_path = DataDir(self.data_dir).logs / "reef-serve.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 600.0) -> ServeProcess:
        """Starts the server and waits until `/healthz` says the engine is up."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reef.cli", "serve", "--data-dir", str(self.data_dir),
                 "--port", str(self.port), *self.args],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
            )
        if not wait_healthy(f"{self.url}/healthz", self.process, timeout_s):
            if self.process.poll() is not None:
                raise RuntimeError(f"reef serve exited:\n{self.log_path.read_text()[-3000:]}")
            self.kill()
            raise RuntimeError(f"reef serve not healthy after {timeout_s} s; see {self.log_path}")
        return self

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM, as Ctrl-C would; returns the exit code."""
        if self.process is None:
            return 0
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout_s)
        self.process = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to flush or clean up."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
