"""How a gateway serves the releases made through another gateway on the same state database
(serve.yaml `state.url`): it polls.

Every `state.poll_s` (1 s by default) one query reads every scenario's head
(reef.registry.chain_pg.heads); a scenario whose head is not the release this gateway routes to is
handed to `Publisher.follow`, which loads the head's content (and canary arm), proves it with the
canary request, and switches the route, as for a release made here.

Polling rather than LISTEN/NOTIFY, because:
- a notification sent while the listener's connection is down (a gateway restart, a database
  failover, a network blip) is lost, so a listener must poll to catch up anyway: polling alone is
  one mechanism with one bound, and nothing to reconcile;
- LISTEN holds a session-mode connection, which transaction-pooling proxies (pgbouncer, most managed
  databases' poolers) do not give;
- the cost is one indexed read of one row per scenario per gateway per interval, while releases
  are minutes apart and a swap takes longer than the interval.

The bound: a release committed through gateway A serves on gateway B within `poll_s` plus B's own
swap (the load and its canary request). Until then B serves the previous release, and its records
say so (each carries the release that answered it): no request is answered by a release the chain
does not name.

Canaries the same way: each poll reads again the log of every canary running on this gateway (a
canary is counted by the gateway that started it, or one restarted while it ran), so that one
another gateway decided (promoting) or ended is seen here within `poll_s`, not at the next restart.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from reef.registry.schema import Release
from reef.registry.state import ReleaseState
from reef.serving.routing import Routes

log = logging.getLogger("reef.registry")


class FollowsCanaries(Protocol):
    """What the loop needs of the canary controller (reef.serving.canary_control.CanaryController)."""

    async def follow(self) -> None: ...


class Follows(Protocol):
    """What the loop needs of the publisher (reef.serving.publisher.Publisher)."""

    state: ReleaseState
    routes: Routes

    @property
    def canary(self) -> FollowsCanaries: ...

    async def follow(self, scenario: str) -> Release | None: ...


async def moved(publisher: Follows) -> list[str]:
    """Scenarios whose head is not what this gateway routes to (one read of the state database)."""
    heads = await asyncio.to_thread(publisher.state.heads)
    serving = publisher.routes.serving()
    return [s for s, head in heads.items()
            if head is not None and (s not in serving or serving[s].release_id != head)]


async def follow_heads(publisher: Follows, interval_s: float) -> None:
    """Until cancelled: every `interval_s`, serve each head another gateway moved, and read again
    the canaries running here (one another gateway decided or ended is seen here the same way)."""
    failing = False
    while True:
        try:
            for scenario in await moved(publisher):
                await publisher.follow(scenario)
            await publisher.canary.follow()
            failing = False
        except Exception as exc:  # noqa: BLE001 - the database is away: serve on, read again next time
            if not failing:
                log.warning("cannot read the release heads from the state database: %s", exc)
            failing = True
        await asyncio.sleep(interval_s)
