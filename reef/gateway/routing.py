"""Which model and release serve each scenario.

Until the release chain exists every scenario is served by the base model as its release 0
(`<scenario>@r0`); the release issue swaps routes here atomically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCENARIO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Route:
    model: str
    release_id: str


class Routes:
    def __init__(self, base_model: str):
        self.base_model = base_model
        self._routes: dict[str, Route] = {}

    def for_scenario(self, scenario: str) -> Route:
        route = self._routes.get(scenario)
        if route is None:
            route = self._routes.setdefault(scenario, Route(self.base_model, f"{scenario}@r0"))
        return route

    def serving(self) -> dict[str, Route]:
        return dict(self._routes)
