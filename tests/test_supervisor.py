"""Engine supervision with real processes and a stand-in engine (no vLLM: seconds, not minutes).

The stand-in behaves like vLLM's API server where it matters: it answers `/health` on its port
and spawns a child ("EngineCore") into its process group, which outlives it when it is killed -9.
tests/test_serve_managed.py does the same against the real vLLM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from reef.config import ServeConfig
from reef.engine import supervisor
from reef.engine.reaper import group_alive
from reef.engine.supervisor import EngineSupervisor, free_port

pytestmark = pytest.mark.model_free

FAKE_ENGINE = textwrap.dedent("""
    import http.server, subprocess, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # stays in the group
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


class FakeEngine(EngineSupervisor):
    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "fake_engine.py"
        script.write_text(FAKE_ENGINE)
        self.script = script
        super().__init__(ServeConfig(data_dir=str(tmp_path / "data")), tmp_path / "engine.log")

    def command(self) -> list[str]:
        return [sys.executable, str(self.script), "--port", str(self.port)]


def _wait(condition, timeout_s: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _family(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def _gone(pid: int) -> bool:
    """Not running and not a zombie (reaped)."""
    try:
        psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return False


def test_a_dead_engine_is_restarted_and_its_orphans_killed(tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path)
    engine.start()
    first = engine.process.pid  # type: ignore[union-attr]
    _wait(lambda: len(_family(first)) == 2)
    core = _family(first)[1]
    recovered: list[bool] = []

    async def on_recovered() -> None:
        assert not engine.ready  # clients get 503 until the releases are applied again
        recovered.append(True)

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(engine.supervise(on_recovered))
        os.kill(first, signal.SIGKILL)  # the API server alone, as in the issue
        deadline = time.monotonic() + 30
        while not (engine.ready and recovered) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()

    try:
        asyncio.run(scenario())
        assert recovered and engine.ready and engine.restarts == 1
        assert engine.last_exit == f"exit code {-signal.SIGKILL}"
        second = engine.process.pid  # type: ignore[union-attr]
        assert second != first and engine.alive()
        assert _gone(first), "the dead API server was never reaped"
        _wait(lambda: not core.is_running() or core.status() == psutil.STATUS_ZOMBIE, 10)
        assert not group_alive(first) or all(p.status() == psutil.STATUS_ZOMBIE for p in _family_of_group(first))
        new_family = _family(second)
    finally:
        engine.stop()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in new_family)


def _family_of_group(pgid: int) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                out.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


GATEWAY = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from test_supervisor import FakeEngine
    engine = FakeEngine(Path({tmp!r}))
    engine.start()
    print(engine.pgid, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_engine_group_dies_with_the_gateway(tmp_path: Path, sig: signal.Signals) -> None:
    """However the gateway dies (kill -9 here), its reaper takes the whole engine group down."""
    code = GATEWAY.format(tests=str(Path(__file__).parent), tmp=str(tmp_path))
    gateway = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(gateway.stdout.readline())  # type: ignore[union-attr]
        members = _family_of_group(pgid)
        assert len(members) == 2, members  # the API server and its "EngineCore"
        gateway.send_signal(sig)
        gateway.wait(timeout=30)
        _wait(lambda: not group_alive(pgid) or all(
            p.status() == psutil.STATUS_ZOMBIE for p in _family_of_group(pgid)), 20)
    finally:
        if gateway.poll() is None:
            gateway.kill()


def test_tcmalloc_is_preloaded_into_vllm_when_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reef.engine.supervisor import TCMALLOC

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    on = EngineSupervisor(ServeConfig(data_dir=tmp_path), tmp_path / "vllm.log").environment()
    assert (on.get("LD_PRELOAD") == str(TCMALLOC)) == TCMALLOC.exists(), on.get("LD_PRELOAD")
    off = EngineSupervisor(ServeConfig(data_dir=tmp_path, engine={"tcmalloc": False}),  # type: ignore[arg-type]
                           tmp_path / "vllm.log").environment()
    assert "LD_PRELOAD" not in off
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")  # the user's own preload is kept
    kept = EngineSupervisor(ServeConfig(data_dir=tmp_path), tmp_path / "vllm.log").environment()
    assert kept["LD_PRELOAD"].endswith("/opt/mine.so")


def test_the_engine_leaves_a_core_to_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU the engine's OpenMP team is one core short of the machine (split among replicas), or
    what engine.cpu_threads says; the test process's own OMP_NUM_THREADS does not leak into it."""
    monkeypatch.setattr("reef.engine.supervisor._cuda_available", lambda: False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def threads(**engine: int) -> str:
        config = ServeConfig(data_dir=tmp_path, engine=engine)  # type: ignore[arg-type]
        return EngineSupervisor(config, tmp_path / "vllm.log").environment()["OMP_NUM_THREADS"]

    assert threads() == "7"
    assert threads(replicas=2) == "3"
    assert threads(cpu_threads=2) == "2"
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0})
    assert threads() == "1"


def test_the_engine_port_is_never_the_gateway_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A caller picks the gateway's port free and starts `reef serve` on it; until the gateway binds
    # it, the kernel may hand the same port out again: the engine must not take it (it did, in CI).
    handed = iter([41001, 41001, 41002])

    class Picked:
        def __enter__(self) -> Picked:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(handed)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(supervisor.socket, "socket", Picked)
    assert free_port(avoid={41001}) == 41002
    handed = iter([41001, 41003])
    engine = EngineSupervisor(ServeConfig(port=41001), tmp_path / "vllm.log")
    assert engine.port == 41003
