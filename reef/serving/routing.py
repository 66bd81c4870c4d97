"""Which model and release serve each scenario, switched atomically by the release publisher.

A request picks its route once, when it starts, and records that route's release: a swap never
relabels a request in flight. A scenario nobody released to is served by the base model as its
release 0 (`<scenario>@r0`). A running canary sends a share of the scenario's requests to a
candidate adapter. The gateway reads routes; only the release package writes them.
"""

from __future__ import annotations

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
    harness_id: str | None = None  # the release's harness; a canary's arms share it


@dataclass(frozen=True)
class Pick:
    model: str
    release_id: str
    arm: str | None  # "candidate" | "head" while a canary runs, else None
    harness_id: str | None = None


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
            return Pick(route.model, route.release_id, None, route.harness_id)
        if self._rng.random() < split.fraction:
            return Pick(split.model, split.label, "candidate", route.harness_id)
        return Pick(route.model, route.release_id, "head", route.harness_id)

    def set(self, scenario: str, route: Route) -> None:
        self._routes[scenario] = route  # one dict store: requests see the old route or the new one

    def serving(self) -> dict[str, Route]:
        return dict(self._routes)
