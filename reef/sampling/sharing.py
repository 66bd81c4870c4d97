"""Users first: how many of a learning round's sequences (rollouts, the gate's replies) the engine
holds beside the users' requests.

On CPU the engine decodes every running sequence in one batch, and a step costs about as much more
as the batch is bigger (SmolLM2 on one core: ~18 tokens/s for one stream, ~4 per stream at 16), so
a round that fills the batch with its own samples slows every user's reply by the same factor.
vLLM's priority scheduling does not help: it orders the waiting queue, and a batch that has room
runs everything. So the round holds back instead: while the engine serves anyone else, at most
`beside_users` of its sequences are in flight, or `per_user` for each user call in flight when that
is more (a fixed few would starve a round beside a busy engine: 1 sequence beside 16 users decodes at
a 17th of the batch's pace, and a gate of 200 replies then takes longer than the users' patience
for a release; half a sequence per user keeps the round at most a third of the batch); while it
serves no one, `alone` (a user who arrives then waits behind those until they finish, so it is
kept small too). The session's own bound on
requests in flight (a recipe's or the gate's `concurrency`) holds either way.

Who else is served comes from the recording gateway, which serves every user call: its Prometheus
gauge `reef_requests_in_flight` at `users_url` (the learner passes its own gateway's /metrics).
The engine's own gauges cannot tell users from the round: a request the API server is still
preparing, or one done at the engine and not yet read back, is counted by one side only. A gap
between a user's calls is no reason to fill the batch (they come back within seconds), so users
count as present for `memory_s` after any read that saw one. An unreadable count means no
yielding, with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

log = logging.getLogger("reef.sampling")

USERS_GAUGE = "reef_requests_in_flight"


def gauge_value(metrics: str, name: str = USERS_GAUGE) -> int:
    """A gauge's value summed over its labels, from Prometheus' text format (0 when absent)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return int(round(total))


class EngineShare:
    """A session's admission of its own requests: at most `concurrency` requests in flight, and, when
    yielding, at most `beside_users` sequences while the engine serves anyone else and `alone` while
    it does not (a request asks for its `n`; None: no bound of that kind).

    `per_user`: beside users, this many sequences per user call in flight when that is more than
    `beside_users`. `beside_users` None: no yielding, `concurrency` requests whatever users do (a
    gate or check run from the command line, with no users to protect). A request bigger than the allowance still
    runs when nothing else of this session does, so nothing waits forever."""

    def __init__(self, http: httpx.AsyncClient, concurrency: int, beside_users: int | None = None,
                 alone: int | None = None, users_url: str | None = None, per_user: float = 0.0,
                 poll_s: float = 0.25, memory_s: float = 2.0) -> None:
        self.http = http
        self.users_url = users_url
        self.concurrency = concurrency
        self.beside_users = beside_users
        self.alone = alone
        self.per_user = per_user
        self.poll_s = poll_s
        self.memory_s = memory_s
        self.requests = 0  # this session's requests in flight
        self.mine = 0  # and their sequences
        self.others = 0  # users' calls in flight at the last read
        self._others_recent, self._recent_at = 0, -float("inf")  # the most seen lately: calls come and go
        self._others_seen_at = -float("inf")
        self.held_s = 0.0  # time requests spent held back for users (what yielding costs a round)
        self._read_at = 0.0
        self._no_metrics = False
        self._reading = False
        self._freed = asyncio.Condition()

    @property
    def yielding(self) -> bool:
        return self.beside_users is not None and self.users_url is not None and not self._no_metrics

    async def _read_others(self) -> None:
        """Read the users' count, at most every `poll_s`, one read at a time (the others wait for it)."""
        now = time.monotonic()
        if not self.yielding or self._reading or now - self._read_at < self.poll_s:
            return
        self._reading, self._read_at = True, now
        try:
            assert self.users_url is not None
            response = await self.http.get(self.users_url)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("users' count at %s unreadable (%r): this round does not yield to users", self.users_url, exc)
            self._no_metrics, self.others = True, 0
            return
        finally:
            self._reading = False
        self.others = gauge_value(response.text)
        now = time.monotonic()
        if self.others:
            self._others_seen_at = now
        if self.others >= self._others_recent or now - self._recent_at >= self.memory_s:
            self._others_recent, self._recent_at = self.others, now
        async with self._freed:
            self._freed.notify_all()

    @property
    def users_present(self) -> bool:
        return time.monotonic() - self._others_seen_at < self.memory_s

    def _admits(self, n: int) -> bool:
        if self.requests >= self.concurrency:
            return False
        if self.mine == 0 or not self.yielding:
            return True
        allowed = self.allowance()
        return allowed is None or self.mine + n <= allowed

    def allowance(self) -> int | None:
        """Sequences this session may keep in flight now, when yielding (None: no bound of that kind)."""
        if not self.users_present:
            return self.alone
        assert self.beside_users is not None
        return max(self.beside_users, int(self.per_user * self._others_recent))

    @asynccontextmanager
    async def slot(self, n: int = 1) -> AsyncIterator[None]:
        """Hold one request of `n` sequences for the body. The counts change only between awaits
        (one event loop), so a finished request is let go at once, never behind a /metrics read."""
        held_from: float | None = None
        while True:
            await self._read_others()
            if not self._reading and self._admits(n):  # never on a load another request is reading now
                break
            if held_from is None and self.requests < self.concurrency:
                held_from = time.monotonic()  # held for users, not by the session's own bound
            async with self._freed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), self.poll_s)
        self.requests += 1
        self.mine += n
        if held_from is not None:
            self.held_s += time.monotonic() - held_from
        try:
            yield
        finally:
            self.requests -= 1
            self.mine -= n
            async with self._freed:
                self._freed.notify_all()
