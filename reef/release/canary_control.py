"""The canary controller: starts and stops canaries and carries out their rule's verdict.

A canary puts a selected LoRA candidate next to the scenario's head (a `CanarySplit` on its
route); the gateway counts each arm's requests and reports (reef.release.canary). Once the rule
decides, the controller promotes the candidate (a `promote` release through the publisher,
expecting the head the canary compared against) or aborts (the split is dropped).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from reef.release.canary import Canaries, Canary, CanaryState
from reef.release.candidates import CandidateRegistry
from reef.release.chain import NotSelectedError, ReleaseError
from reef.release.routing import CanarySplit, Route
from reef.release.swap import EngineConflictError

if TYPE_CHECKING:
    from reef.release.publisher import Publisher

log = logging.getLogger("reef.release")


class CanaryController:
    def __init__(self, publisher: Publisher, canaries: Canaries) -> None:
        self.publisher = publisher
        self.canaries = canaries

    def describe(self, scenario: str) -> dict[str, object] | None:
        return self.canaries.describe(scenario)

    async def resume(self) -> None:
        """Nothing to resume yet: canaries live in memory."""

    def close(self) -> None:
        pass

    async def start(self, scenario: str, candidate_id: str, fraction: float | None) -> Canary:
        pub = self.publisher
        view = CandidateRegistry(pub.data_dir, scenario).get(candidate_id)
        if view.status != "selected":
            raise NotSelectedError(f"candidate {view.candidate_id[:12]} is {view.status}; a canary needs a "
                                   "candidate the gate selected")
        if view.kind != "lora":
            raise EngineConflictError("a canary shares the engine with the head, so it needs a LoRA candidate")
        async with pub.lock:
            route = pub.routes.for_scenario(scenario)
            model, _ = await pub._load(scenario, view.candidate_id, "lora")
            self.finish(scenario, "aborted", "replaced by another canary")
            rule = pub.config.scenario(scenario).canary
            canary = self.canaries.start(scenario, view.candidate_id, route.release_id, rule, fraction)
            split = CanarySplit(view.candidate_id, model, f"{scenario}@canary-{view.candidate_id[:12]}",
                                canary.fraction)
            pub.routes.set(scenario, Route(route.model, route.release_id, route.content_id, route.kind, split))
        return canary

    async def stop(self, scenario: str, reason: str = "stopped by a person") -> Canary | None:
        async with self.publisher.lock:
            return self.finish(scenario, "aborted", reason)

    def finish(self, scenario: str, state: CanaryState, reason: str | None,
               release_id: str | None = None) -> Canary | None:
        """End the scenario's canary, if one runs; the caller holds the publisher's lock."""
        routes = self.publisher.routes
        route = routes.serving().get(scenario)
        if route is not None and route.canary is not None:
            routes.set(scenario, Route(route.model, route.release_id, route.content_id, route.kind))
        return self.canaries.finish(scenario, state, reason, release_id)

    async def decide(self, scenarios: list[str]) -> None:
        """Carry out the rule for canaries that have enough reports."""
        pub = self.publisher
        for scenario in scenarios:
            canary = self.canaries.running.get(scenario)
            if canary is None:
                continue
            verdict = canary.decide()
            if verdict == "aborted":
                log.warning("%s: canary of %s aborted: %s", scenario, canary.candidate_id[:12], canary.reason)
                async with pub.lock:
                    self.finish(scenario, "aborted", canary.reason)
            elif verdict == "promoted":
                reason = canary.reason
                try:
                    release, _ = await pub.release(scenario, canary.candidate_id, canary.head_release_id,
                                                   approved_by="canary", operation="promote")
                except ReleaseError as exc:
                    async with pub.lock:
                        self.finish(scenario, "aborted", f"promotion failed: {exc}")
                    continue
                self.canaries.finished[scenario] = canary.model_copy(
                    update={"state": "promoted", "reason": reason, "release_id": release.release_id})
