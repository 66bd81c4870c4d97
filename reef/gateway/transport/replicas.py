"""Several OpenAI-compatible engines behind one gateway (`upstream.urls`): which replica serves a call.

- **Affinity.** A call's key (its `x-reef-session`, else its transcript through the first user
  message, see `affinity_key`) orders the replicas by rendezvous hashing: the same key goes to the
  same replica, so a conversation's turns hit that engine's prefix cache; a replica that leaves
  moves only its own keys, and they come back to it when it returns.
- **Health.** A call that cannot connect, is dropped, or gets 502/503/504 marks its replica down;
  down replicas are skipped (tried last, when every replica is down) until `/health` answers 200
  again (`watch`, and every `GET /healthz`). 500 is not a replica failure: vLLM answers it for
  requests it cannot serve, on every replica alike.
- **Retries.** A call that got no answer (refused, dropped, a 502/503/504) goes to the next replica:
  nothing of it reached the client, and a generation has no side effect on an engine, so a dead
  replica fails no JSON call. A call that ran out its time is not sent again (it would take as long).
  A stream cut after its first bytes went to the client cannot move: it ends with an error event
  (what vLLM itself sends when it fails mid-stream), and its replica is marked down.

- **In step.** When releases load weights into the replicas (`sync` set, reef.serving.replica_sync),
  a replica that is out is never tried, and one whose `/health` answers again is first brought in
  step (every head and canary loaded and proved on it) and only then taken back: health alone could
  send calls to an engine that lost its adapters in a restart, or holds other full weights. Every
  replica is probed each interval then, not only those out, so a restart between two calls is seen.

One replica (`upstream.url`, or a managed engine) is the same code with nowhere else to go.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from reef.engine.replica_weights import label
from reef.gateway.transport.upstream import EngineUnavailable, Upstream, UpstreamError
from reef.gateway.wire.errors import ReefError

log = logging.getLogger("reef.replicas")
T = TypeVar("T")

_DOWN_STATUS = frozenset({502, 503, 504})  # the replica (or a proxy in front of it) cannot serve now
_FAILED = (OSError, TimeoutError)
SYNC_RETRY_S = 5.0  # after a replica could not be brought in step (each try may reload its weights)


__all__ = ["Replica", "Replicas", "affinity_key", "label"]


def affinity_key(session: str | None, messages: Sequence[dict[str, Any]], prefixes: Sequence[str]) -> str:
    """The session the client named, else the transcript through its first user message: every
    turn of one conversation resends that, so all of them find the same replica."""
    if session:
        return "s:" + session
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            return "p:" + prefixes[i]
    return "p:" + (prefixes[-1] if prefixes else "")


@dataclass
class Replica:
    url: str
    upstream: Upstream
    healthy: bool = True
    requests: int = 0  # chat calls sent to it, failed ones included
    failures: int = 0  # calls it failed: no connection, dropped, 502/503/504, a stream cut
    down_since: float | None = None
    last_error: str | None = None

    @property
    def name(self) -> str:
        return label(self.url)

    def failed(self, reason: str, others: bool) -> None:
        """Counted; taken out only when there are `others` (the one engine is never skipped)."""
        self.failures += 1
        self.last_error = reason
        if self.healthy and others:
            self.healthy, self.down_since = False, time.monotonic()
            log.warning("replica %s is down (%s): its calls go to the others", self.name, reason)

    def recovered(self) -> None:
        if not self.healthy:
            log.info("replica %s is back after %.1f s", self.name, time.monotonic() - (self.down_since or 0))
            self.healthy, self.down_since = True, None

    def describe(self) -> dict[str, Any]:
        return {"url": self.name, "healthy": self.healthy, "requests": self.requests, "failures": self.failures,
                "last_error": self.last_error}


def _score(key: str, replica: Replica) -> bytes:
    return hashlib.blake2b(f"{key}\0{replica.url}".encode(), digest_size=8).digest()


class Replicas:
    """The gateway's upstream: one or more `Upstream`s, with `Upstream`'s calls plus a key for chats."""

    def __init__(self, urls: Sequence[str], api_key: str | None = None, timeout_s: float = 600.0) -> None:
        if not urls:
            raise ValueError("no upstream URL")
        self.members = [Replica(url, Upstream(url, api_key, timeout_s)) for url in urls]
        self.cut_streams = 0
        # Brings a replica that is back in step (True: it serves what the chains name); None: health
        # alone takes a replica back (no weights are loaded into the replicas).
        self.sync: Callable[[str], Awaitable[bool]] | None = None
        self._syncing: dict[str, asyncio.Task[None]] = {}  # by URL: one at a time, the watch goes on meanwhile
        self._sync_after: dict[str, float] = {}  # by URL: not tried again before (monotonic)

    @property
    def several(self) -> bool:
        return len(self.members) > 1

    @property
    def base_url(self) -> str:
        return self.members[0].upstream.base_url

    @property
    def token_ids(self) -> bool:
        return self.members[0].upstream.token_ids

    def _order(self, key: str | None) -> list[Replica]:
        """Healthy replicas first, each group in the key's rendezvous order (no key: the one with
        the fewest calls so far)."""
        if not self.several:
            return self.members
        if key is None:
            ranked = sorted(self.members, key=lambda r: r.requests)
        else:
            ranked = sorted(self.members, key=lambda r: _score(key, r), reverse=True)
        if self.sync is not None:  # one that is out may serve other weights than the chain names
            return [r for r in ranked if r.healthy]
        return [r for r in ranked if r.healthy] + [r for r in ranked if not r.healthy]

    def in_service(self) -> list[str]:
        """The replicas that take calls now (what a release must reach before the head moves)."""
        return [r.url for r in self.members if r.healthy]

    def take_out(self, url: str, reason: str) -> None:
        """Out until it is in step again (a weight reload failed on it)."""
        next(r for r in self.members if r.url == url).failed(reason, self.several)

    def _back(self, replica: Replica) -> None:
        """A replica that is out answers `/health` again: in step first (a task: a sync waits for a
        release in progress, and the watch keeps probing meanwhile), then back."""
        if replica.healthy or replica.url in self._syncing:
            return
        if self.sync is None:
            replica.recovered()
            return
        if time.monotonic() < self._sync_after.get(replica.url, 0.0):
            return
        sync = self.sync

        async def bring_back() -> None:
            try:
                if await sync(replica.url):
                    replica.recovered()
                else:
                    replica.last_error = "back, but not in step with the releases yet (see the log)"
                    self._sync_after[replica.url] = time.monotonic() + SYNC_RETRY_S
            finally:
                self._syncing.pop(replica.url, None)

        self._syncing[replica.url] = asyncio.get_running_loop().create_task(bring_back())

    def _name(self, replica: Replica) -> str | None:
        """What a record names: nothing when there is one replica (as before replicas existed)."""
        return replica.name if self.several else None

    async def chat(self, body: dict[str, Any], key: str | None = None) -> tuple[str | None, bytes]:
        """(the replica that answered, its response body)."""
        replica, content = await self._first_answer(key, lambda upstream: upstream.chat(body))
        return self._name(replica), content

    async def stream_chat(self, body: dict[str, Any],
                          key: str | None = None) -> tuple[str | None, AsyncIterator[list[bytes]]]:
        """(the replica, its stream's lines): opened, so a replica that cannot start it is passed
        over like a JSON call's."""
        replica, lines = await self._first_answer(key, lambda upstream: upstream.stream_chat(body))
        return self._name(replica), self._watched(replica, lines)

    async def _first_answer(self, key: str | None, send: Callable[[Upstream], Awaitable[T]]) -> tuple[Replica, T]:
        """The first replica in `key`'s order that answers `send`, and its answer; a replica that
        gave no answer is passed over, the last one's failure raised."""
        order = self._order(key)
        if not order:
            raise ReefError(503, "no model server replica is in service (each is down, or being brought in step "
                            "with the releases); retry shortly", code="engine_unavailable",
                            headers={"Retry-After": "5"})
        for i, replica in enumerate(order):
            try:
                answer = await send(replica.upstream)
            except (UpstreamError, EngineUnavailable) as exc:
                if not self._moved_on(replica, exc, i == len(order) - 1):
                    raise
                continue
            replica.requests += 1
            replica.recovered()
            return replica, answer
        raise AssertionError("unreachable: the last replica's failure is raised")

    def _moved_on(self, replica: Replica, exc: UpstreamError | EngineUnavailable, last: bool) -> bool:
        """Whether the call goes on to the next replica; the failure is counted either way."""
        replica.requests += 1
        if isinstance(exc, UpstreamError):
            if exc.status not in _DOWN_STATUS:
                return False  # the engine's answer to this request: the client gets it
            replica.failed(f"answered {exc.status}", self.several)
        else:
            replica.failed(exc.message, self.several)
            if exc.timed_out:
                return False
        return not last

    async def _watched(self, replica: Replica, lines: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes]]:
        """The replica's stream; cut mid-way, it ends with an error event rather than a broken body."""
        try:
            async for batch in lines:
                yield batch
        except _FAILED as exc:
            self.cut_streams += 1
            replica.failed(f"a stream was cut: {exc or type(exc).__name__}", self.several)
            error = {"error": {"message": "the model server failed mid-stream (it dropped the connection)",
                               "type": "api_error", "code": "engine_unavailable"}}
            yield [b"data: " + orjson.dumps(error), b"data: [DONE]"]
        finally:
            await lines.aclose()  # type: ignore[attr-defined]

    async def _any(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
        order = self._order(None) or self.members
        for i, replica in enumerate(order):
            try:
                if body is None:
                    return await replica.upstream.get(path)
                return await replica.upstream.post(path, body)
            except EngineUnavailable as exc:
                replica.failed(exc.message, self.several)
                if i == len(order) - 1 or exc.timed_out:
                    raise
        raise AssertionError("unreachable")

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self._any("GET", path, None)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        return await self._any("POST", path, body)

    async def probe_token_ids(self, setting: str) -> bool:
        """Asked of each replica that answers (one that is down at start must not turn token ids off
        for all): records hold token ids only when every one of them returns them."""
        up = [r for r, ok in zip(self.members, await asyncio.gather(*(r.upstream.healthy() for r in self.members)),
                                 strict=True) if ok or setting != "auto"]
        found = [await r.upstream.probe_token_ids(setting) for r in up or self.members[:1]]
        for replica in self.members:
            replica.upstream.token_ids = all(found)
        return all(found)

    async def healthy(self) -> bool:
        """Probes every replica's `/health` (bringing recovered ones back, unless they must be
        brought in step first: `watch` does that); True when any answers (and, when they must be in
        step, is in service)."""
        states = await asyncio.gather(*(r.upstream.healthy() for r in self.members))
        for replica, ok in zip(self.members, states, strict=True):
            if ok and self.sync is None:
                replica.recovered()
            elif not ok and replica.healthy and self.several:
                replica.failed("/health did not answer 200", True)
        if self.sync is not None:
            return any(ok and r.healthy for r, ok in zip(self.members, states, strict=True))
        return any(states)

    async def watch(self, interval_s: float = 1.0) -> None:
        """Probe the replicas that are down until they answer again, and are in step (runs for the
        server's life); with `sync`, every replica, so a restart between two calls is seen too."""
        while True:
            await asyncio.sleep(interval_s)
            probed = self.members if self.sync is not None else [r for r in self.members if not r.healthy]
            if probed:
                states = await asyncio.gather(*(r.upstream.healthy() for r in probed))
                for replica, ok in zip(probed, states, strict=True):
                    if ok:
                        self._back(replica)
                    elif replica.healthy and self.several:
                        replica.failed("/health did not answer 200", True)

    def describe(self) -> list[dict[str, Any]]:
        return [r.describe() for r in self.members]

    async def aclose(self) -> None:
        for task in list(self._syncing.values()):
            task.cancel()
        for replica in self.members:
            await replica.upstream.aclose()
