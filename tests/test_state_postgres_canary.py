"""One canary, two gateways deciding it (issue 26 part 3), on a real PostgreSQL: the gateway that
started it and one restarted while it ran (so both count and decide it). The log lets one move it;
the other's view is brought in line from the log (when its transition is refused, and by the follow
loop's poll) instead of staying `running` until it restarts. Two release publishers with no engine:
the canary arm is taken as loaded (its route set by hand), and its end is a routing release."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path

import pytest

from reef.config import ServeConfig
from reef.engine.hold import EngineHold
from reef.registry.chain_pg import PgChain
from reef.registry.schema import Release, Routing
from reef.serving.canary import Canaries
from reef.serving.follow import follow_heads
from reef.serving.publisher import Publisher
from reef.serving.routing import Routes
from tests.helpers.postgres import PostgresServer, postgres  # noqa: F401 - the session's server
from tests.helpers.stand_in import fake_model

pytestmark = pytest.mark.model_free

SCENARIO = "demo"
CANDIDATE = hashlib.sha256(b"a LoRA candidate").hexdigest()
MIN_REPORTS = 5


@pytest.fixture
def url(postgres: PostgresServer) -> str:  # noqa: F811 - the fixture imported above
    return postgres.create_database(f"canary_{uuid.uuid4().hex[:12]}")


def gateway(data_dir: Path, model: Path, url: str) -> Publisher:
    config = ServeConfig.model_validate({
        "data_dir": str(data_dir), "model": str(model), "state": {"url": url, "poll_s": 0.05},
        "scenarios": {SCENARIO: {"canary": {"min_reports": MIN_REPORTS}}}})
    return Publisher(config, Routes(config.model_name), EngineHold(), None, Canaries())


async def until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def two_gateways_one_canary(data: Path, model: Path, url: str) -> tuple[Publisher, Publisher, Release]:
    """a started the canary (its routing release r1); b was restarted while it ran."""
    a, b = gateway(data, model, url), gateway(data, model, url)
    await a.start()
    await b.start()
    r0 = a.chain(SCENARIO).head()
    assert r0 is not None
    r1 = PgChain(url, SCENARIO).publish(r0.release_id, r0.content_id, r0.kind, "route", approved_by="ops",
                                        routing=Routing.canary(SCENARIO, r0.content_id, r0.kind, CANDIDATE, 0.5))
    for pub in (a, b):  # the arm loaded on both engines (there are none here)
        pub.routes.set(SCENARIO, Publisher._route(r1, pub.routes.for_scenario(SCENARIO).model, "adapter-1"))
    a.canary.on_release(SCENARIO, r1)  # what a's release call does right after its commit
    await b.canary.resume()  # what b's start does: the head's canary runs on there too
    assert a.canary.canaries.running[SCENARIO].canary_id == b.canary.canaries.running[SCENARIO].canary_id
    return a, b, r1


def reports(pub: Publisher, candidate: float, head: float) -> None:
    """Enough rewards on both arms of `pub`'s count for the rule to decide."""
    canary = pub.canary.canaries.running[SCENARIO]
    for _ in range(MIN_REPORTS):
        canary.arms["candidate"].add(candidate)
        canary.arms["head"].add(head)


def test_both_gateways_abort_one_canary_at_once(tmp_path: Path, url: str) -> None:
    async def main() -> None:
        a, b, r1 = await two_gateways_one_canary(tmp_path / "data", fake_model(tmp_path / "model"), url)
        followers = [asyncio.create_task(follow_heads(pub, 0.05)) for pub in (a, b)]
        try:
            for pub in (a, b):
                reports(pub, candidate=0.0, head=1.0)  # the candidate is worse: abort
            a.canary.schedule([SCENARIO])
            b.canary.schedule([SCENARIO])
            await until(lambda: not a.canary.canaries.running and not b.canary.canaries.running)
        finally:
            for task in followers:
                task.cancel()
        # One routing release ended it (the other's was refused by the head's compare-and-swap), the
        # log holds one end, and both gateways show it ended, neither still counting it.
        chain = PgChain(url, SCENARIO).releases()
        assert [r.operation for r in chain[r1.seq + 1:]] == ["route"] and chain[-1].split() is None
        assert [c.state for c in a.canary.log(SCENARIO).canaries()] == ["aborted"]
        for pub in (a, b):
            shown = pub.canary.describe(SCENARIO)
            assert shown is not None and shown["state"] == "aborted", shown

    asyncio.run(main())


def test_a_canary_promoted_through_another_gateway_is_followed(tmp_path: Path, url: str) -> None:
    async def main() -> None:
        a, b, r1 = await two_gateways_one_canary(tmp_path / "data", fake_model(tmp_path / "model"), url)
        reports(b, candidate=1.0, head=1.0)  # as good as the head: b would promote it too
        # a decided first: its `promoting` is in the log before b decides.
        canary_a = a.canary.canaries.running[SCENARIO]
        await asyncio.to_thread(a.canary.log(SCENARIO).append, canary_a, "promoting", "better")
        b.canary.schedule([SCENARIO])
        await until(lambda: b.canary.canaries.running[SCENARIO].state == "promoting")
        assert b.canary.canaries.running[SCENARIO].decide() is None  # b no longer decides it
        assert PgChain(url, SCENARIO).head() == r1  # and released nothing
        assert [e.state for e in a.canary.log(SCENARIO).log.events()] == ["running", "promoting"]

        # a's promotion (its release, then the canary's end): b's follow loop sees the end.
        follower = asyncio.create_task(follow_heads(b, 0.05))
        try:
            promoted = PgChain(url, SCENARIO).publish(r1.release_id, CANDIDATE, "lora", "promote", approved_by="canary")
            a.canary.on_release(SCENARIO, promoted)
            await until(lambda: not b.canary.canaries.running)
        finally:
            follower.cancel()
        shown = b.canary.describe(SCENARIO)
        assert shown is not None and (shown["state"], shown["release_id"]) == ("promoted", promoted.release_id)

    asyncio.run(main())


def test_a_release_through_a_gateway_that_has_not_seen_the_canary_end(tmp_path: Path, url: str) -> None:
    async def main() -> None:
        a, b, r1 = await two_gateways_one_canary(tmp_path / "data", fake_model(tmp_path / "model"), url)
        canary_a = a.canary.canaries.running[SCENARIO]
        await asyncio.to_thread(a.canary.log(SCENARIO).append, canary_a, "promoting", "better")
        promoted = PgChain(url, SCENARIO).publish(r1.release_id, CANDIDATE, "lora", "promote", approved_by="canary")
        a.canary.on_release(SCENARIO, promoted)
        assert b.canary.canaries.running[SCENARIO].state == "running"  # b has not polled since
        # A rollback through b, on top of the promotion: b's canary was ended by a's release, so b's
        # own end of it is refused by the log, and the rollback serves all the same.
        back, _ = await b.rollback(SCENARIO, f"{SCENARIO}@r0", promoted.release_id, approved_by="ops")
        assert b.routes.for_scenario(SCENARIO).release_id == back.release_id
        assert not b.canary.canaries.running
        shown = b.canary.describe(SCENARIO)
        assert shown is not None and shown["state"] == "promoted", shown
        assert [e.state for e in b.canary.log(SCENARIO).log.events()] == ["running", "promoting", "promoted"]

    asyncio.run(main())
