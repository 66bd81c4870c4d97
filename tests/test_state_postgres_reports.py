"""Reports' idempotency keys (issue 26 part 3), in files and in a real PostgreSQL: a retried report is
answered as the first one was, through whichever gateway it comes (with PostgreSQL, two gateways
apps with their own experience stores on one database; with files, the one gateway); the same id with
other content is 409; of concurrent retries exactly one stores the report; a claim whose storing
failed, or whose process was killed, gives the id back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from reef.config import ServeConfig
from reef.experience import report_keys_pg
from reef.experience.report_keys import PgReportKeys, StoreReportKeys
from reef.experience.store import ExperienceStore
from reef.experience.wal import WalError
from reef.gateway.app import create_app
from reef.gateway.state import GatewayState
from reef.gateway.transport.replicas import Replicas
from reef.serving.routing import Routes
from tests.helpers.postgres import PostgresServer, postgres  # noqa: F401 - the session's server
from tests.helpers.records import MANUAL, make_record

pytestmark = pytest.mark.model_free

REPO = Path(__file__).resolve().parents[1]
SCENARIO = "demo"
RECORD = make_record(1).record_id


@pytest.fixture(params=["files", "postgres"])
def state_url(request: pytest.FixtureRequest) -> str | None:
    """None: the file backend (one gateway); else a fresh database on the session's server."""
    if request.param == "files":
        return None
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database(f"keys_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:  # noqa: F811 - the fixture imported above
    return postgres.create_database(f"keys_{uuid.uuid4().hex[:12]}")


class Gateway:
    """A gateway's app in this process (no engine, no upstream: reports need neither), with its own store."""

    def __init__(self, data_dir: Path, url: str | None, report_wait_s: float = 5.0) -> None:
        config = ServeConfig.model_validate({"data_dir": str(data_dir), "model": "stand-in", "state": {"url": url},
                                             "report_wait_s": report_wait_s})
        self.store = ExperienceStore(data_dir, MANUAL).open()
        self.store.append_records_sync([make_record(1)])
        self.state = GatewayState(config=config, store=self.store, upstream=Replicas(["http://127.0.0.1:9"]),
                                  routes=Routes("stand-in"))
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(self.state)),
                                      base_url="http://gateway")

    async def report(self, **body: object) -> httpx.Response:
        return await self.http.post("/reef/report", json={"agent_record_id": RECORD, "score": 1.0, **body},
                                    headers={"x-reef-scenario": SCENARIO})

    def stored(self, report_id: str) -> int:
        return int(self.store.report_index(report_id) is not None)


@asynccontextmanager
async def gateways(tmp_path: Path, url: str | None, **kw: float) -> AsyncIterator[list[Gateway]]:
    """Two gateways on one database; with files, the one gateway twice (its data dir is its own)."""
    first = Gateway(tmp_path / "a", url, **kw)
    both = [first, Gateway(tmp_path / "b", url, **kw) if url else first]
    try:
        yield both
    finally:
        for gw in dict.fromkeys(both):
            await gw.http.aclose()
            gw.store.close()


def test_the_backend_is_chosen_by_the_url(tmp_path: Path, state_url: str | None) -> None:
    async def main() -> None:
        async with gateways(tmp_path, state_url) as (a, _):
            assert isinstance(a.state.report_keys, PgReportKeys if state_url else StoreReportKeys)

    asyncio.run(main())


def test_a_retry_through_either_gateway_is_answered_as_the_first(tmp_path: Path, state_url: str | None) -> None:
    async def main() -> None:
        async with gateways(tmp_path, state_url) as (a, b):
            first = await a.report(report_id="rep-retry-1", feedback="good")
            assert first.status_code == 200, first.text
            assert first.json() == {"report_id": "rep-retry-1", "agent_record_ids": [RECORD], "duplicate": False}
            again = await b.report(report_id="rep-retry-1", feedback="good")
            assert again.status_code == 200, again.text
            assert again.json() == {**first.json(), "duplicate": True}
            other = await b.report(report_id="rep-retry-1", feedback="bad")
            assert other.status_code == 409 and other.json()["error"]["param"] == "report_id"
            # Another scenario's report under the same id is other content too.
            elsewhere = await b.http.post("/reef/report", json={"agent_record_id": RECORD, "score": 1.0,
                                                                "report_id": "rep-retry-1", "feedback": "good"},
                                          headers={"x-reef-scenario": "other"})
            assert elsewhere.status_code == 409
            assert sum(gw.stored("rep-retry-1") for gw in {a, b}) == 1
            # A report without an id is never a retry.
            fresh = [await gw.report() for gw in (a, b)]
            assert [r.json()["duplicate"] for r in fresh] == [False, False]
            assert fresh[0].json()["report_id"] != fresh[1].json()["report_id"]

    asyncio.run(main())


def test_concurrent_retries_store_one_report(tmp_path: Path, state_url: str | None) -> None:
    async def main() -> None:
        async with gateways(tmp_path, state_url) as (a, b):
            answers = await asyncio.gather(*((a if i % 2 else b).report(report_id="rep-burst", score=0.5)
                                             for i in range(20)))
            assert {r.status_code for r in answers} == {200}, [r.text for r in answers]
            assert sorted(r.json()["duplicate"] for r in answers) == [False] + [True] * 19
            assert sum(gw.stored("rep-burst") for gw in {a, b}) == 1

    asyncio.run(main())


def test_a_report_that_was_not_stored_gives_its_id_back(tmp_path: Path, state_url: str | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with gateways(tmp_path, state_url) as (a, b):
            async def refuse(_: object) -> None:
                raise WalError("disk full")

            with monkeypatch.context() as m:
                m.setattr(a.store, "append_report", refuse)
                failed = await a.report(report_id="rep-refused")
                assert failed.status_code >= 500
            assert sum(gw.stored("rep-refused") for gw in {a, b}) == 0
            stored = await b.report(report_id="rep-refused")
            assert stored.status_code == 200 and stored.json()["duplicate"] is False

    asyncio.run(main())


def test_a_claim_held_elsewhere_is_waited_for(tmp_path: Path, pg_url: str) -> None:
    """A claim in flight through another gateway: a retry waits for it (report_wait_s), then is 503;
    once that claim is rolled back the retry stores the report."""
    db = report_keys_pg.open_database(pg_url)

    async def main() -> None:
        async with gateways(tmp_path, pg_url, report_wait_s=0.3) as (_, b):
            held = report_keys_pg.claim(db, "rep-held", SCENARIO, "other-gateway", [RECORD], 1.0)
            assert await asyncio.to_thread(held.__enter__) is None
            busy = await b.report(report_id="rep-held")
            assert busy.status_code == 503, busy.text
            await asyncio.to_thread(held.__exit__, RuntimeError, RuntimeError("its store failed"), None)
            stored = await b.report(report_id="rep-held")
            assert stored.status_code == 200 and stored.json()["duplicate"] is False

    asyncio.run(main())


@pytest.fixture
def killed_claim(pg_url: str) -> Iterator[subprocess.Popen[str]]:
    """A process that claimed "rep-killed" and stays inside its claim (as a gateway mid-fsync)."""
    code = textwrap.dedent(f"""
        import sys, time
        from reef.experience import report_keys_pg
        db = report_keys_pg.open_database({pg_url!r})
        with report_keys_pg.claim(db, "rep-killed", {SCENARIO!r}, "dead-gateway", [], 1.0) as row:
            print("claimed" if row is None else "taken", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_gateway_gives_its_claim_back(tmp_path: Path, pg_url: str,
                                               killed_claim: subprocess.Popen[str]) -> None:
    assert killed_claim.stdout is not None and killed_claim.stdout.readline().strip() == "claimed"
    killed_claim.kill()  # SIGKILL: PostgreSQL drops its connection and rolls its transaction back
    killed_claim.wait()

    async def main() -> None:
        async with gateways(tmp_path, pg_url) as (a, _):
            stored = await a.report(report_id="rep-killed")
            assert stored.status_code == 200 and stored.json()["duplicate"] is False

    asyncio.run(main())
