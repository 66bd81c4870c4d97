"""Several gateways, one truth (issue 26 part 3), on a real PostgreSQL: two release publishers (each
a gateway's, with no engine: the releases here change routing and harness, never weights) on one
state database and one shared data dir. Exactly one of 50 concurrent publishers spread over both
wins; a release made through one is served by the other within the poll interval; a gateway whose
database is away keeps serving what it serves. Then the same through two `reef serve` processes
over HTTP (201 once, 409 49 times; a candidate seen by both and rejected once of 20 tries over both),
and the CLI reading the chains from PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from reef.cli.main import main
from reef.config import ServeConfig
from reef.core import pg
from reef.core.pg import StateUnavailableError
from reef.engine.hold import EngineHold
from reef.gateway.routes.releases import _as_http
from reef.registry import ArtifactStore, HeadMovedError
from reef.registry.candidates import CandidateEvent, CandidateRegistry, GateResult
from reef.registry.chain_pg import PgChain
from reef.registry.state import ReleaseState
from reef.serve_process import ServeProcess
from reef.serving.canary import Canaries
from reef.serving.follow import follow_heads, moved
from reef.serving.publisher import Publisher
from reef.serving.routing import Routes
from tests.helpers.postgres import PostgresServer, postgres  # noqa: F401 - the session's server
from tests.helpers.stand_in import StandInUpstream, fake_model

pytestmark = pytest.mark.model_free

SCENARIO = "demo"


@pytest.fixture
def url(postgres: PostgresServer) -> str:  # noqa: F811 - the fixture imported above
    return postgres.create_database(f"state_{uuid.uuid4().hex[:12]}")


def gateway(data_dir: Path, model: Path, url: str) -> Publisher:
    config = ServeConfig.model_validate({"data_dir": str(data_dir), "model": str(model),
                                         "state": {"url": url, "poll_s": 0.05}})
    return Publisher(config, Routes(config.model_name), EngineHold(), None, Canaries())


def harness(data_dir: Path, text: str) -> str:
    tree = data_dir / "harness-src" / text
    tree.mkdir(parents=True)
    (tree / "system.md").write_text(text)
    return ArtifactStore.for_data_dir(data_dir).import_harness(tree).content_id


def test_two_gateways_one_truth(tmp_path: Path, url: str, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"  # shared by both gateways, as their experience partitions would be
    model = fake_model(tmp_path / "model")

    async def main() -> None:
        a, b = gateway(data, model, url), gateway(data, model, url)
        await a.start()
        await b.start()
        assert a.chain(SCENARIO).head() == b.chain(SCENARIO).head()  # r0, made once
        r0 = a.chain(SCENARIO).head()
        assert r0 is not None and r0.release_id == f"{SCENARIO}@r0"
        # r1: the base with a harness, published straight on the chain (as a third gateway would).
        h = harness(data, "Be terse.")
        PgChain(url, SCENARIO).publish(r0.release_id, r0.content_id, "full", "train", harness_id=h)
        assert await moved(a) == [SCENARIO] and await moved(b) == [SCENARIO]
        follower_a = asyncio.create_task(follow_heads(a, 0.05))
        follower_b = asyncio.create_task(follow_heads(b, 0.05))
        try:
            await until(lambda: a.routes.for_scenario(SCENARIO).release_id == b.routes.for_scenario(SCENARIO)
                        .release_id == f"{SCENARIO}@r1")
            assert b.routes.for_scenario(SCENARIO).harness_id == h

            # 50 concurrent rollbacks to r0 on the same expected parent, 25 through each gateway.
            async def one(pub: Publisher) -> str:
                try:
                    release, _ = await pub.rollback(SCENARIO, f"{SCENARIO}@r0", f"{SCENARIO}@r1", approved_by="ops")
                    return release.release_id
                except HeadMovedError:
                    return "409"

            outcomes = await asyncio.gather(*(one(a if i % 2 else b) for i in range(50)))
            assert sorted(outcomes) == ["409"] * 49 + [f"{SCENARIO}@r2"]
            assert [r.release_id for r in PgChain(url, SCENARIO).releases()] == [f"{SCENARIO}@r{i}" for i in range(3)]

            # Whichever gateway won, the other serves r2 within the bound (poll_s + its swap).
            started = time.monotonic()
            await until(lambda: {p.routes.for_scenario(SCENARIO).release_id for p in (a, b)} == {f"{SCENARIO}@r2"})
            assert time.monotonic() - started < 2.0
            assert {p.routes.for_scenario(SCENARIO).harness_id for p in (a, b)} == {None}
            # The data dir's HEAD (read by reef.experience.load) follows too.
            assert (data / "releases" / SCENARIO / "HEAD").read_text() == f"{SCENARIO}@r2\n"

            # A head these gateways cannot serve (new weights, and no engine to load them into): the
            # previous release keeps serving, the error shows, and it is not retried on every poll.
            PgChain(url, SCENARIO).publish(f"{SCENARIO}@r2", hashlib.sha256(b"new").hexdigest(), "full", "train")
            await until(lambda: all(SCENARIO in p.errors for p in (a, b)))
            await asyncio.sleep(0.3)  # six polls
            assert {p.routes.for_scenario(SCENARIO).release_id for p in (a, b)} == {f"{SCENARIO}@r2"}
            assert all("could not serve demo@r3" in p.errors[SCENARIO] for p in (a, b))
            assert sum("could not serve demo@r3" in r.message for r in caplog.records) == 2  # once each
        finally:
            follower_a.cancel()
            follower_b.cancel()

    asyncio.run(main())


def test_a_gateway_serves_on_while_the_database_is_away(tmp_path: Path, postgres: PostgresServer,  # noqa: F811
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # A database that does not answer: the follower logs once and keeps polling; nothing crashes.
    dead = f"postgresql://reef@127.0.0.1:{postgres.port + 1}/nowhere?connect_timeout=1"
    state = ReleaseState(tmp_path, dead)

    class NoCanaries:
        async def follow(self) -> None:
            pass

    class Idle:
        def __init__(self) -> None:
            self.state = state
            self.routes = Routes("m")
            self.canary = NoCanaries()
            self.follows = 0

        async def follow(self, scenario: str) -> None:
            self.follows += 1

    async def main() -> None:
        pub = Idle()
        task = asyncio.create_task(follow_heads(pub, 0.05))
        await asyncio.sleep(0.5)
        assert not task.done()
        task.cancel()
        assert pub.follows == 0

    asyncio.run(main())
    assert sum("cannot read the release heads" in r.message for r in caplog.records) == 1


def test_a_restarted_database_is_reconnected(postgres: PostgresServer, url: str,  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """While PostgreSQL is down a publish fails with nothing written (the API answers 503); once it is
    back the pooled connections it dropped are replaced, and the next publish succeeds."""
    monkeypatch.setattr(pg, "CHECK_IDLE_S", 0.0)  # a restart here takes less than the idle check's wait
    chain = PgChain(url, SCENARIO)
    r0 = chain.ensure_base(hashlib.sha256(b"base").hexdigest())
    postgres.stop()
    try:
        with pytest.raises(StateUnavailableError) as err:
            chain.publish(r0.release_id, r0.content_id, "full", "train")
        assert _as_http(err.value).status == 503
    finally:
        postgres.restart()
    r1 = chain.publish(r0.release_id, r0.content_id, "full", "train")
    assert r1.release_id == f"{SCENARIO}@r1" and [r.seq for r in PgChain(url, SCENARIO).releases()] == [0, 1]


async def until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


# --- two `reef serve` processes over HTTP ---------------------------------------------------


def test_two_reef_serve_gateways_one_postgres(tmp_path: Path, url: str) -> None:
    """Acceptance (issue 26): 50 concurrent publishers spread over two gateways on one PostgreSQL:
    one 201, 49 409; the release made through one is served by the other."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    model = fake_model(tmp_path / "model")
    env = {"REEF_STATE__URL": url, "REEF_STATE__POLL_S": "0.2", "REEF_ADMIN_TOKEN": "admin-token",
           "REEF_STORE__FSYNC": "false"}
    args = ["--upstream-url", f"http://127.0.0.1:{upstream.server_address[1]}", "--model", str(model)]
    gateways = [ServeProcess(tmp_path / name, args, env) for name in ("a", "b")]
    admin = {"Authorization": "Bearer admin-token"}
    try:
        for gw in gateways:
            gw.workdir.mkdir()
            gw.start(timeout_s=120)
        with httpx.Client(timeout=30) as http_client:
            def serving(gw: ServeProcess) -> str:
                resp = http_client.get(f"{gw.url}/reef/scenarios/{SCENARIO}/releases")
                assert resp.status_code == 200, resp.text
                return str(resp.json()["serving"]["release_id"])

            assert {serving(gw) for gw in gateways} == {f"{SCENARIO}@r0"}  # r0 made once, in PostgreSQL
            r0 = PgChain(url, SCENARIO).head()
            assert r0 is not None
            h = {harness(gw.data_dir, "Be terse.") for gw in gateways}.pop()  # each gateway's store holds it
            PgChain(url, SCENARIO).publish(r0.release_id, r0.content_id, "full", "train", harness_id=h)
            wait_for(lambda: {serving(gw) for gw in gateways} == {f"{SCENARIO}@r1"})

            def rollback(i: int) -> int:
                resp = http_client.post(f"{gateways[i % 2].url}/reef/scenarios/{SCENARIO}/rollback", headers=admin,
                                        json={"release_id": f"{SCENARIO}@r0", "expected_parent": f"{SCENARIO}@r1"})
                return resp.status_code

            with ThreadPoolExecutor(50) as pool:
                codes = list(pool.map(rollback, range(50)))
            assert sorted(codes) == [201] + [409] * 49
            started = time.monotonic()
            wait_for(lambda: {serving(gw) for gw in gateways} == {f"{SCENARIO}@r2"})
            assert time.monotonic() - started < 5.0

            # A candidate (gate-selected) in the state database: both gateways show it, and of 20
            # people rejecting it at once through both, one is answered 200, the others 409.
            cid = "c" * 64
            registry = CandidateRegistry(gateways[0].data_dir, SCENARIO, url=url)
            registry._append(CandidateEvent(candidate_id=cid, event="registered",
                                            data={"kind": "lora", "created_at": "2026-01-01T00:00:00+00:00"}))
            registry.record_gate(cid, GateResult(decision="select", reason="test", head_release_id=f"{SCENARIO}@r2"))
            for gw in gateways:
                listed = http_client.get(f"{gw.url}/reef/candidates").json()["candidates"]
                assert [(c["candidate_id"], c["status"]) for c in listed] == [(cid, "selected")]

            def reject(i: int) -> int:
                return http_client.post(f"{gateways[i % 2].url}/reef/candidates/{cid[:12]}/reject", headers=admin,
                                        json={"reason": "no", "by": f"person-{i}"}).status_code

            with ThreadPoolExecutor(20) as pool:
                codes = list(pool.map(reject, range(20)))
            assert sorted(codes) == [200] + [409] * 19
            for gw in gateways:
                assert http_client.get(f"{gw.url}/reef/candidates/{cid}").json()["status"] == "rejected"
            assert [e.event for e in registry.events()] == ["registered", "evaluated", "rejected"]
    finally:
        for gw in gateways:
            gw.kill()
        upstream.shutdown()


def test_cli_reads_the_chains_from_postgres(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    chain = PgChain(url, SCENARIO)
    r0 = chain.ensure_base(hashlib.sha256(b"base").hexdigest())
    chain.publish(r0.release_id, r0.content_id, "full", "train", approved_by="ops")
    monkeypatch.setenv("REEF_STATE__URL", url)
    assert main(["releases", "--data-dir", str(tmp_path), "--json"]) == 0
    assert [r["release_id"] for r in json.loads(capsys.readouterr().out)[SCENARIO]] == ["demo@r0", "demo@r1"]
    assert main(["lineage", f"{SCENARIO}@r1", "--data-dir", str(tmp_path), "--json"]) == 0
    assert [r["release_id"] for r in json.loads(capsys.readouterr().out)] == ["demo@r1", "demo@r0"]
    assert not (tmp_path / "releases").exists()  # nothing read from, or made in, the data dir


def wait_for(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_dashboard_reads_the_chains_and_candidates_from_postgres(tmp_path: Path, url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from dashboard import data

    monkeypatch.setenv("REEF_STATE__URL", url)
    assert data.scenarios(tmp_path) == [] and data._chain(tmp_path, SCENARIO) is None  # noqa: SLF001
    chain = PgChain(url, SCENARIO)
    r0 = chain.ensure_base(hashlib.sha256(b"base").hexdigest())
    before = data.version(tmp_path, SCENARIO)
    chain.publish(r0.release_id, r0.content_id, "full", "train", approved_by="ops")
    after = data.version(tmp_path, SCENARIO)
    assert after != before, "a publish through another gateway must show at the next rerun"
    assert data.scenarios(tmp_path) == [SCENARIO]
    assert [r["release_id"] for r in data.releases(tmp_path, SCENARIO, after)] == ["demo@r0", "demo@r1"]
    assert data.candidates(tmp_path, SCENARIO, after) == []
    assert not (tmp_path / "releases").exists()  # nothing read from, or made in, the data dir
