"""Several gateways, one truth (issue 26 part 3), on a real PostgreSQL: two release publishers (each
a gateway's, with no engine: the releases here change routing and harness, never weights) on one
state database and one shared data dir. Exactly one of 50 concurrent publishers spread over both
wins; a release made through one is served by the other within the poll interval; a gateway whose
database is away keeps serving what it serves."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path

import pytest

from reef.config import ServeConfig
from reef.engine.hold import EngineHold
from reef.registry import ArtifactStore, HeadMovedError
from reef.registry.chain_pg import PgChain
from reef.registry.state import ReleaseState
from reef.serving.canary import Canaries
from reef.serving.follow import follow_heads, moved
from reef.serving.publisher import Publisher
from reef.serving.routing import Routes
from tests.helpers.postgres import PostgresServer, postgres  # noqa: F401 - the session's server

pytestmark = pytest.mark.model_free

SCENARIO = "demo"


def fake_model(folder: Path) -> Path:
    """A base model folder: the publisher imports and hashes it, and never loads it (no engine)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(hashlib.sha256(b"weights").digest() * 64)
    return folder


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


def test_two_gateways_one_truth(tmp_path: Path, url: str) -> None:
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
        finally:
            follower_a.cancel()
            follower_b.cancel()

    asyncio.run(main())


def test_a_gateway_serves_on_while_the_database_is_away(tmp_path: Path, postgres: PostgresServer,  # noqa: F811
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # A database that does not answer: the follower logs once and keeps polling; nothing crashes.
    dead = f"postgresql://reef@127.0.0.1:{postgres.port + 1}/nowhere?connect_timeout=1"
    state = ReleaseState(tmp_path, dead)

    class Idle:
        def __init__(self) -> None:
            self.state = state
            self.routes = Routes("m")
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


async def until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
