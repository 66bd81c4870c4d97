"""`upstream.urls`: one `reef serve` in front of two engine replicas (issue 26 part 1).

The replicas are stand-in processes (tests/helpers/replica_stand_in.py: every answer names its
replica), so a test can `kill -9` one under load; the client is the real openai SDK. Checked: the
same session (header or conversation) stays on one replica, sessions spread over both, a killed
replica fails no JSON call and is shown down, it takes calls again once restarted, a stream cut
mid-way ends with an error event, and every record names the replica that served it.

Without a model (part 2's rules, with in-process engines): an adapter loads on every replica or on
none, a replica whose weight reload failed is out until it is brought in step, and an out replica is
never tried meanwhile; `engine.replicas: N`'s ports, logs and device shares. Releases through two
real vLLM replicas: tests/test_replica_releases.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from aiohttp import web

from reef.config import ConfigError, resolve
from reef.engine.fleet import EngineFleet, device_shares
from reef.engine.hold import EngineHold
from reef.engine.replica_weights import ReplicaWeights
from reef.engine.supervisor import EngineError, free_port
from reef.engine.weights import EngineWeightsError
from reef.gateway.transport import replicas as replicas_module
from reef.gateway.transport.replicas import Replicas, affinity_key, label
from reef.gateway.transport.upstream import UpstreamError
from reef.serve_process import ServeProcess
from reef.serving.canary import Canaries
from reef.serving.publisher import Publisher, SwapFailedError
from reef.serving.routing import Routes
from tests.helpers import replica_stand_in, wait_for

pytestmark = pytest.mark.model_free


class Pair:
    """Two stand-in replicas, `a` and `b`, each restartable on its own port."""

    def __init__(self) -> None:
        self.ports = {"a": free_port(), "b": free_port()}
        self.processes: dict[str, subprocess.Popen[bytes] | None] = {}

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str) -> None:
        self.processes[name] = replica_stand_in.start(self.ports[name], name)

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        assert process is not None
        process.kill()  # SIGKILL: its connections drop with whatever was in flight
        process.wait()

    def close(self) -> None:
        for process in self.processes.values():
            if process is not None:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pair, ServeProcess]]:
    pair = Pair()
    gw: ServeProcess | None = None
    try:
        pair.start("a")
        pair.start("b")
        gw = ServeProcess(tmp_path_factory.mktemp("replicas"), [], {
            "REEF_UPSTREAM__URLS": json.dumps([pair.url("a"), pair.url("b")]),
            "REEF_UPSTREAM__HEALTH_INTERVAL_S": "0.2", "REEF_STORE__FLUSH_INTERVAL_S": "0.2"}).start(120)
        yield pair, gw
    finally:
        if gw is not None:
            gw.stop()
        pair.close()


def _client(gw: ServeProcess, session: str | None = None) -> openai.OpenAI:
    headers = {"x-reef-scenario": "replicas"}
    if session:
        headers["x-reef-session"] = session
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, default_headers=headers)


def _ask(client: openai.OpenAI, text: str) -> tuple[str, str]:
    """(the replica that answered, the record id)."""
    raw = client.chat.completions.with_raw_response.create(model="stand-in",
                                                           messages=[{"role": "user", "content": text}])
    content = raw.parse().choices[0].message.content or ""
    return content.removeprefix("served by "), raw.headers["x-reef-agent-record-id"]


def _replicas(gw: ServeProcess) -> dict[str, dict]:
    rows = httpx.get(f"{gw.url}/reef/status").json()["engine"]["replicas"]
    return {row["url"]: row for row in rows}


def test_affinity_and_balance(setup: tuple[Pair, ServeProcess]) -> None:
    pair, gw = setup
    for session in ("ses-one", "ses-two", "ses-three"):
        client = _client(gw, session)
        served = {_ask(client, f"question {i}")[0] for i in range(4)}
        assert len(served) == 1, f"session {session} moved between replicas: {served}"
    # No session header: a conversation's later turn resends its opening, and finds the same replica.
    client = _client(gw)
    first = client.chat.completions.create(model="stand-in", messages=[{"role": "user", "content": "hello"}])
    turn = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "and then?"}]
    later = client.chat.completions.create(model="stand-in", messages=turn)
    assert later.choices[0].message.content == first.choices[0].message.content
    spread = Counter(_ask(_client(gw, f"spread-{i}"), "hi")[0] for i in range(40))
    assert set(spread) == {"a", "b"} and min(spread.values()) >= 8, spread


def test_kill_one_replica_under_load(setup: tuple[Pair, ServeProcess]) -> None:
    pair, gw = setup
    answers: list[tuple[str, str, float]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                replica, record_id = _ask(_client(gw, f"load-{worker}-{i % 6}"), f"call {i}")
                answers.append((replica, record_id, time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - counted: the test's point is that there are none
                failures.append(exc)
            i += 1

    threads = [threading.Thread(target=load, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: {r for r, _, _ in answers} == {"a", "b"} or failures, timeout=30)  # both under load
        time.sleep(0.3)
        killed_at = time.monotonic()
        pair.kill("a")
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not failures, f"{len(failures)} JSON calls failed: {failures[:3]}"
    # A margin for a thread of this loaded machine that got its answer from `a` just before the kill.
    after = [r for r, _, at in answers if at > killed_at + 1.0]
    assert after and set(after) == {"b"}, Counter(after)
    rows = _replicas(gw)
    assert rows[label(pair.url("a"))]["healthy"] is False and rows[label(pair.url("a"))]["failures"] >= 1
    assert rows[label(pair.url("b"))]["healthy"] is True
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert f'reef_replica_healthy{{replica="{label(pair.url("a"))}"}} 0.0' in metrics

    # Back on its port: the health probe brings it back, and its sessions return to it.
    pair.start("a")
    wait_for(lambda: _replicas(gw)[label(pair.url("a"))]["healthy"], timeout=10)
    spread = Counter(_ask(_client(gw, f"back-{i}"), "hi")[0] for i in range(20))
    assert spread["a"] >= 3, spread

    # Every record names the replica that answered it.
    for replica, record_id, _ in answers[:: max(1, len(answers) // 15)]:
        record = httpx.get(f"{gw.url}/reef/records/{record_id}").json()
        assert record["replica"] == label(pair.url(replica)), record_id


def test_stream_cut_mid_way_ends_with_an_error_event(setup: tuple[Pair, ServeProcess]) -> None:
    pair, gw = setup
    # A session that lands on `a` (b is killed for no other reason than to be sure of it).
    session = next(f"cut-{i}" for i in range(200)
                   if _order_first(pair, f"s:cut-{i}") == pair.url("a"))
    stream = _client(gw, session).chat.completions.create(
        model="stand-in", stream=True, messages=[{"role": "user", "content": "a long answer"}])
    got: list[str] = []
    with pytest.raises(openai.APIError, match="mid-stream"):
        for chunk in stream:
            if chunk.choices:
                got.append(chunk.choices[0].delta.content or "")
                if len(got) == 3:
                    pair.kill("a")
    assert got[0] == "served by a" and len(got) < replica_stand_in.STREAM_CHUNKS
    assert httpx.get(f"{gw.url}/reef/status").json()["engine"]["cut_streams"] >= 1
    # A new stream of that session goes to the live replica, whole.
    chunks = list(_client(gw, session).chat.completions.create(
        model="stand-in", stream=True, messages=[{"role": "user", "content": "again"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("served by b")
    pair.start("a")
    wait_for(lambda: _replicas(gw)[label(pair.url("a"))]["healthy"], timeout=10)


def _order_first(pair: Pair, key: str) -> str:
    replicas = Replicas([pair.url("a"), pair.url("b")])
    return replicas._order(key)[0].url


def test_rendezvous_moves_only_the_missing_replicas_keys() -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(4)]
    full, less = Replicas(urls), Replicas(urls)
    less.members[2].healthy = False
    for i in range(200):
        key = affinity_key(f"s{i}", [], [])
        before, after = full._order(key)[0].url, less._order(key)[0].url
        assert after == before or before == urls[2]
    assert label("http://user:secret@host:1/v1/") == "http://host:1/v1"


def test_several_replicas_config() -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    # Releases reach every replica as one step (tests/test_replica_releases.py): the learner may run.
    config, _ = resolve({"upstream.urls": urls, "learner.enabled": True}, environ={})
    assert config.learner.enabled and config.upstream.replica_urls == urls
    with pytest.raises(ConfigError, match="not both"):
        resolve({"upstream.urls": urls, "upstream.url": "http://127.0.0.1:3"}, environ={})
    config, _ = resolve({"upstream.urls": urls[:1]}, environ={})
    assert config.upstream.url == urls[0], "one replica is the one-upstream setup"


def test_weight_release_refused_without_weights(tmp_path: Path) -> None:
    """A publisher given no engine weights says why it loads none."""
    config, _ = resolve({"upstream.urls": ["http://127.0.0.1:1", "http://127.0.0.1:2"],
                         "data_dir": str(tmp_path)}, environ={})
    publisher = Publisher(config, Routes(config.model_name), EngineHold(), None, Canaries())
    publisher.unmanaged = "balances 2 upstream replicas"
    with pytest.raises(SwapFailedError, match="balances 2 upstream replicas"):
        asyncio.run(publisher._load("s", "0" * 64, "lora"))


async def _ok(_: web.Request) -> web.Response:
    return web.Response()


async def _engines(refuse: str) -> tuple[list[web.AppRunner], dict[str, str], dict[str, list[str]]]:
    """Two in-process engines, `a` and `b`, with vLLM's adapter and reload endpoints; `refuse`
    answers 400 to a load. Returns (runners, name -> url, name -> the calls each got)."""
    runners, urls, calls = [], {}, {}
    for name in ("a", "b"):
        got: list[str] = []

        async def endpoint(request: web.Request, name: str = name, got: list[str] = got) -> web.Response:
            body = await request.json() if request.can_read_body else {}
            got.append(f"{request.path} {body.get('lora_name', '')}".strip())
            if name == refuse and request.path in ("/v1/load_lora_adapter", "/collective_rpc"):
                return web.json_response({"error": {"message": f"{name} says no"}}, status=400)
            return web.json_response({"success": True})

        app = web.Application()
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/pause", "/collective_rpc",
                     "/reset_prefix_cache", "/resume"):
            app.router.add_post(path, endpoint)
        app.router.add_get("/health", _ok)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls[name], calls[name] = f"http://127.0.0.1:{port}", got
    return runners, urls, calls


def test_an_adapter_loads_on_every_replica_or_on_none(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        runners, urls, calls = await _engines(refuse="b")
        replicas = Replicas([urls["a"], urls["b"]])
        weights = ReplicaWeights([urls["a"], urls["b"]], replicas)
        try:
            with pytest.raises(EngineWeightsError, match=f"replica {label(urls['b'])}: loading adapter x"):
                await weights.load_lora("x", Path("/adapters/x"))
            assert calls["a"] == ["/v1/load_lora_adapter x", "/v1/unload_lora_adapter x"], "a took it back"
            assert replicas.in_service() == [urls["a"], urls["b"]], "a refusal leaves the replica in"
            # A failed full-weight reload leaves weights nobody knows: that replica is out until in step.
            with pytest.raises(EngineWeightsError, match=f"replica {label(urls['b'])}: reloading weights"):
                await weights.reload_full(Path("/weights/new"))
            assert replicas.in_service() == [urls["a"]]
            replicas.sync = None  # (just the order: no sync hook) an out replica is still tried last
            assert [r.url for r in replicas._order("k")][-1] == urls["b"]

            async def refuse_then_accept(url: str) -> bool:
                synced.append(url)
                return len(synced) > 1

            synced: list[str] = []
            replicas.sync = refuse_then_accept
            monkeypatch.setattr(replicas_module, "SYNC_RETRY_S", 0.1)
            assert [r.url for r in replicas._order("k")] == [urls["a"]], "an out replica is never tried"
            watching = asyncio.get_running_loop().create_task(replicas.watch(0.05))
            await asyncio.sleep(0.5)
            watching.cancel()
            assert synced[:2] == [urls["b"], urls["b"]] and replicas.in_service() == [urls["a"], urls["b"]]
        finally:
            await weights.close()
            await replicas.aclose()
            for runner in runners:
                await runner.cleanup()

    asyncio.run(run())


def test_busy_replica_is_passed_over_and_an_engine_error_is_not() -> None:
    """502/503/504 take a replica out and the call goes on; a 500 is the engine's answer to the call."""

    async def run() -> None:
        statuses = {"busy": 503, "broken": 500}
        runners = []
        urls = {}
        for name, status in statuses.items():
            async def chat(_: web.Request, status: int = status) -> web.Response:
                return web.json_response({"error": {"message": "no"}}, status=status)
            app = web.Application()
            app.router.add_post("/v1/chat/completions", chat)
            runner = web.AppRunner(app)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            urls[name] = f"http://127.0.0.1:{port}"
        ok_port = free_port()

        async def answer(_: web.Request) -> web.Response:
            return web.json_response({"choices": []})

        ok = web.Application()
        ok.router.add_post("/v1/chat/completions", answer)
        ok_runner = web.AppRunner(ok)
        await ok_runner.setup()
        await web.TCPSite(ok_runner, "127.0.0.1", ok_port).start()
        runners.append(ok_runner)
        try:
            replicas = Replicas([urls["busy"], f"http://127.0.0.1:{ok_port}"])
            for i in range(6):
                replica, content = await replicas.chat({"model": "m", "messages": []}, f"k{i}")
                assert replica == f"http://127.0.0.1:{ok_port}" and content == b'{"choices": []}'
            busy = replicas.members[0]
            assert not busy.healthy and busy.failures >= 1 and busy.last_error == "answered 503"
            await replicas.aclose()
            replicas = Replicas([urls["broken"], f"http://127.0.0.1:{ok_port}"])
            replicas.members[1].healthy = False  # so the call goes to `broken` first
            with pytest.raises(UpstreamError):
                await replicas.chat({"model": "m", "messages": []}, "k")
            assert replicas.members[0].healthy, "a 500 leaves its replica in"
            await replicas.aclose()
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(run())


def test_engine_replicas_fleet(tmp_path: Path) -> None:
    """`engine.replicas: N`: N supervisors, each its own port and log, and on GPUs its devices."""
    config, _ = resolve({"engine.replicas": 3, "engine.port": 41000, "data_dir": str(tmp_path)}, environ={})
    fleet = EngineFleet(config, tmp_path / "logs")
    assert [e.port for e in fleet.engines] == [41000, 41001, 41002]
    assert [e.log_path.name for e in fleet.engines] == ["vllm.log", "vllm-1.log", "vllm-2.log"]
    assert fleet.urls == [f"http://127.0.0.1:{p}" for p in (41000, 41001, 41002)]
    config, _ = resolve({"engine.replicas": 2, "data_dir": str(tmp_path)}, environ={})
    ports = [e.port for e in EngineFleet(config, tmp_path / "logs").engines]
    assert len(set(ports)) == 2 and config.port not in ports
    assert device_shares(2, None, 0) == [None, None]  # CPU: no devices to split
    assert device_shares(2, None, 4) == ["0,1", "2,3"] and device_shares(2, "5,7", 2) == ["5", "7"]
    with pytest.raises(EngineError, match="needs a GPU each"):
        device_shares(3, None, 2)
    with pytest.raises(ConfigError, match="engine.replicas"):
        resolve({"engine.replicas": 2, "upstream.url": "http://127.0.0.1:1"}, environ={})
