"""Which model and release serve each scenario, switched atomically by the release publisher.

A request picks its route once, when it starts, and records that route's release: a swap never
relabels a request in flight. A scenario nobody released to is served by the base model as its
release 0 (`<scenario>@r0`). A running canary sends a share of the scenario's requests to a
candidate adapter.

`EngineHold` holds new requests back while the engine's full weights are being replaced, so no
request runs on half-swapped weights or is recorded under the wrong release.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

ReleaseKind = str


@dataclass(frozen=True)
class CanarySplit:
    candidate_id: str
    model: str  # the candidate's adapter name in the engine
    label: str  # what its records carry as release: `<scenario>@canary-<id12>`
    fraction: float


@dataclass(frozen=True)
class Route:
    model: str
    release_id: str
    content_id: str | None = None
    kind: ReleaseKind = "full"
    canary: CanarySplit | None = None


@dataclass(frozen=True)
class Pick:
    model: str
    release_id: str
    arm: str | None  # "candidate" | "head" while a canary runs, else None


class Routes:
    def __init__(self, base_model: str, on_new_scenario: Callable[[str], None] | None = None,
                 rng: random.Random | None = None) -> None:
        self.base_model = base_model
        self.base_content_id: str | None = None  # set by the publisher once it knows the base
        self.on_new_scenario = on_new_scenario
        self._routes: dict[str, Route] = {}
        self._rng = rng or random.Random()

    def for_scenario(self, scenario: str) -> Route:
        route = self._routes.get(scenario)
        if route is None:
            route = self._routes.setdefault(scenario, Route(self.base_model, f"{scenario}@r0", self.base_content_id))
            if self.on_new_scenario is not None:
                self.on_new_scenario(scenario)
        return route

    def pick(self, scenario: str) -> Pick:
        route = self.for_scenario(scenario)
        split = route.canary
        if split is None:
            return Pick(route.model, route.release_id, None)
        if self._rng.random() < split.fraction:
            return Pick(split.model, split.label, "candidate")
        return Pick(route.model, route.release_id, "head")

    def set(self, scenario: str, route: Route) -> None:
        self._routes[scenario] = route  # one dict store: requests see the old route or the new one

    def serving(self) -> dict[str, Route]:
        return dict(self._routes)


class EngineHold:
    """Counts the requests using the engine; closed while full weights are swapped.

    `enter()` waits while closed; `close()` stops new entries and `drain()` waits until every
    request that entered has left, so the swap happens with nothing running and every request is
    recorded under the release whose weights answered it."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self) -> None:
        while not self._open.is_set():
            await self._open.wait()
        self._active += 1
        self._idle.clear()

    def exit(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    @property
    def active(self) -> int:
        return self._active

    def close(self) -> None:
        self._open.clear()

    async def drain(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    def open(self) -> None:
        self._open.set()
