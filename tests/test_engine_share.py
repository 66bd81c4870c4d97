"""Users first (reef.sampling.sharing) on the session's real vLLM behind a real gateway: while a
user's call runs through the gateway, a round's session (which asks the engine directly) keeps at
most `beside_users` of its sequences in flight (or `per_user` per user call, when more), reading the
users' count from the gateway's /metrics; without yielding it fills its concurrency."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from reef.sampling.engine import EngineEndpoint, EngineSession
from reef.sampling.engine_tokens import token_samples
from reef.sampling.sharing import gauge_value
from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway

pytestmark = [pytest.mark.vllm]

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


async def _user_request(client: httpx.AsyncClient, started: asyncio.Event) -> None:
    """A user's long streamed chat (no early stop), until it is cancelled."""
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 3000, "ignore_eos": True, "stream": True,
            "temperature": 1.0}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                started.set()


async def _load(client: httpx.AsyncClient) -> int:
    return gauge_value((await client.get("/metrics")).text)


async def _beside_a_user(url: str, gateway: str, beside_users: int | None, users: int = 1,
                         per_user: float = 0.0) -> tuple[int, int, int]:
    """Eight one-sequence samples asked while `users` users' requests run: the most of the
    session's sequences in flight meanwhile, how many samples came back, and the engine's load when
    they all had (the users still there: at least `users`)."""
    engine = EngineEndpoint(url, MODEL_NAME, beside_users=beside_users, per_user=per_user, alone=8,
                            users_url=f"{gateway}/metrics")
    session = EngineSession(engine, concurrency=8)
    most = 0
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as client:
        starts = [asyncio.Event() for _ in range(users)]
        streams = [asyncio.create_task(_user_request(client, started)) for started in starts]
        for started in starts:
            await started.wait()
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, session.share.mine)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        samples = await asyncio.gather(*(token_samples(session, MODEL_NAME, MESSAGES, n=1, max_tokens=4,
                                                       temperature=1.0) for _ in range(8)))
        done.set()
        load_after = await _load(client)
        await watcher
        for user in streams:
            user.cancel()  # the client goes away: vLLM aborts the request
            with contextlib.suppress(asyncio.CancelledError):
                await user
    await session.release()
    return most, sum(map(len, samples)), load_after


def test_a_round_yields_to_a_user_and_not_without_users_first(vllm_url: str, gateway: Gateway) -> None:
    most, got, load_after = asyncio.run(_beside_a_user(vllm_url, gateway.url, beside_users=1))
    assert got == 8
    assert load_after >= 1, "the user's request ended before the samples did: nothing was measured"
    assert most == 1, f"{most} of the round's sequences ran beside the user"

    most, got, load_after = asyncio.run(_beside_a_user(vllm_url, gateway.url, beside_users=None))
    assert got == 8 and load_after >= 1
    assert most >= 4, f"without yielding the session kept only {most} sequences in flight"


def test_the_gateway_counts_users_calls_in_flight(gateway: Gateway) -> None:
    async def main() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
            idle = await _load(client)
            started = asyncio.Event()
            user = asyncio.create_task(_user_request(client, started))
            await started.wait()
            busy = await _load(client)
            user.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await user
            return idle, busy

    idle, busy = asyncio.run(main())
    assert (idle, busy) == (0, 1)


def test_a_busy_engine_gives_a_round_a_share_per_user(vllm_url: str, gateway: Gateway) -> None:
    """Four users, half a sequence each: two of the round's, not the one `beside_users` alone allows."""
    most, got, load_after = asyncio.run(_beside_a_user(vllm_url, gateway.url, beside_users=1, users=4,
                                                       per_user=0.5))
    assert got == 8 and load_after >= 4
    assert most == 2, f"{most} of the round's sequences ran beside four users"
