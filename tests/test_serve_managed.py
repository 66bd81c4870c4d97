"""`reef serve` managing its own vLLM: starts it, serves through it, restarts it after a kill -9 of
its API server (503 with Retry-After meanwhile, no orphan, no zombie), and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from reef.engine.supervisor import free_port
from tests.helpers import MODEL_NAME

pytestmark = [pytest.mark.model_free, pytest.mark.any_model, pytest.mark.start_early(5)]


def test_managed_vllm_lifecycle(serving_model: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reef.cli", "serve", "--model", str(serving_model), "--port", str(port),
         "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env={**env, "REEF_SERVED_MODEL_NAME": MODEL_NAME},
    )
    url = f"http://127.0.0.1:{port}"
    # One client for every call: a bare httpx.get builds an SSL context each time (~40 ms of CPU).
    http = httpx.Client(base_url=url, timeout=30)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if http.get("/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        status = http.get("/reef/status").json()
        engine = status["engine"]
        assert engine["managed"] is True and engine["alive"] is True and engine["healthy"] is True
        assert not engine["url"].endswith(f":{port}"), "vLLM listens on a private port of its own"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
        reply = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
        assert reply.choices[0].message.content is not None
        vllm = psutil.Process(engine["pid"])
        family = [vllm, *vllm.children(recursive=True)]

        # The engine dies (its API server alone, as an OOM kill would): clients get a plain 503 with
        # Retry-After, the old engine's EngineCore/Worker are killed, the dead API server is reaped,
        # and the gateway serves again once the engine is back with the releases applied.
        killed_at = time.monotonic()
        os.kill(engine["pid"], signal.SIGKILL)
        while (r := http.post("/v1/chat/completions", json={
                "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
               ).status_code == 200:
            assert time.monotonic() - killed_at < 30, "the gateway never noticed the engine died"
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0, r.text
        error = r.json()["error"]
        assert error["code"] == "engine_unavailable" and "<" not in error["message"], error  # no repr
        gone, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, f"processes of the dead engine left behind: {alive}"
        assert not psutil.pid_exists(engine["pid"]), "the dead API server was never reaped"
        while http.get("/healthz", timeout=5).status_code != 200:
            assert time.monotonic() - killed_at < 400, (tmp_path / "serve.log").read_text()[-3000:]
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        engine = http.get("/reef/status").json()["engine"]
        assert engine["restarts"] == 1 and engine["alive"] is True and engine["pid"] != vllm.pid
        assert engine["last_exit"] == f"exit code {-signal.SIGKILL}"
        reply = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
        assert reply.choices[0].message.content is not None
        vllm = psutil.Process(engine["pid"])
        family = [vllm, *vllm.children(recursive=True)]
    finally:
        http.close()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0
    gone, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"vLLM processes left behind: {alive}"


def test_managed_replicas_serve_on_while_one_is_killed(serving_model: Path, tmp_path: Path) -> None:
    """`engine.replicas: 2`: two supervised engines behind the gateway's balancer. A kill -9 of one's
    API server under load fails no call (the balancer sends them to the other), its supervisor
    restarts it, it serves again, and every record names the replica that served it."""
    from reef.experience import load
    from reef.serve_process import ServeProcess
    from tests.helpers import wait_for
    from tests.helpers.gateway import wait_flushed

    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    gw = ServeProcess(tmp_path, ["--model", str(serving_model)],
                      env={**env, "REEF_SERVED_MODEL_NAME": MODEL_NAME, "REEF_ENGINE__REPLICAS": "2"}).start()
    http = httpx.Client(base_url=gw.url, timeout=60)
    failures: list[str] = []
    served = 0
    stop = threading.Event()

    def user(i: int) -> None:
        nonlocal served
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
        while not stop.is_set():
            try:
                client.chat.completions.create(model=MODEL_NAME, max_tokens=4, extra_headers={
                    "x-reef-session": f"user-{i}-{served}"}, messages=[{"role": "user", "content": "hi"}])
                served += 1
            except openai.APIError as exc:
                failures.append(repr(exc))

    try:
        engine = http.get("/reef/status").json()["engine"]
        assert len(engine["engines"]) == 2 and len(engine["replicas"]) == 2, engine
        assert all(e["alive"] and e["ready"] for e in engine["engines"]), engine
        pids = [e["pid"] for e in engine["engines"]]
        users = [threading.Thread(target=user, args=(i,)) for i in range(4)]
        for t in users:
            t.start()
        wait_for(lambda: served >= 8, timeout=120)
        os.kill(pids[1], signal.SIGKILL)

        def back() -> bool:
            now = http.get("/reef/status").json()["engine"]
            return (now["engines"][1]["restarts"] == 1 and now["engines"][1]["ready"]
                    and now["replicas"][1]["healthy"] and now["engines"][1]["pid"] != pids[1])

        wait_for(back, timeout=400)
        at_restart = served
        wait_for(lambda: served >= at_restart + 8, timeout=120)  # and it serves on, both replicas in
        stop.set()
        for t in users:
            t.join(timeout=60)
        wait_flushed(gw)
    finally:
        stop.set()
        http.close()
        gw.stop()
    assert not failures, failures[:3]
    replicas = load("default", gw.data_dir).collect()["replica"]
    assert replicas.null_count() == 0 and replicas.n_unique() == 2, replicas.value_counts()
