"""Which scenarios the gateway serves: every request names one, and each new one costs a route, a
release chain and experience folders, so `limits.allow_new_scenarios` and `limits.max_scenarios`
bound what clients can create."""

from __future__ import annotations

from collections.abc import Iterable

from reef.config import LimitsConfig, ServeConfig
from reef.core.paths import DataDir
from reef.gateway.wire.errors import ReefError
from reef.gateway.wire.headers import SCENARIO


class ScenarioAdmission:
    def __init__(self, limits: LimitsConfig, known: Iterable[str]):
        self.limits = limits
        self.known = {"default", *known}

    @classmethod
    def seeded(cls, config: ServeConfig, stored: Iterable[str]) -> ScenarioAdmission:
        """Known: declared (serve.yaml, packages), holding experience or a release chain."""
        from reef.scenario.discovery import all_scenarios

        data = DataDir(config.data_dir)
        on_disk = [p.name for folder in (data.experience(), data.releases()) if folder.is_dir()
                   for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]  # not .tmp*
        return cls(config.limits, [*all_scenarios(config), *stored, *on_disk])

    def admit(self, scenario: str) -> None:
        if scenario in self.known:
            return
        if not self.limits.allow_new_scenarios:
            raise ReefError(403, f"scenario {scenario!r} is not declared and limits.allow_new_scenarios is false",
                            param=SCENARIO, code="new_scenarios_disabled")
        if len(self.known) >= self.limits.max_scenarios:
            raise ReefError(403, f"scenario {scenario!r} would be new, and limits.max_scenarios "
                            f"({self.limits.max_scenarios}) are served already", param=SCENARIO,
                            code="max_scenarios_reached")
        self.known.add(scenario)
