"""The canary controller: starts and stops canaries, carries out their rule's verdict, and resumes
them after a restart.

A canary puts a selected LoRA candidate next to the scenario's head (a `CanarySplit` on its
route); the gateway counts each arm's requests and reports (reef.release.canary). A report that
completes the sample only schedules the decision: it runs here, in a background task, never
inside the report's request. The controller promotes the candidate (a `promote` release through
the publisher, expecting the head the canary compared against) or aborts (the split is dropped).
Every transition is persisted (reef.release.canary.CanaryLog) before it takes effect.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from reef.release.canary import Canaries, Canary, CanaryLog, CanaryState, recount
from reef.release.candidates import CandidateRegistry
from reef.release.chain import NotSelectedError, ReleaseError
from reef.release.routing import CanarySplit
from reef.release.schema import Release
from reef.release.swap import EngineConflictError

if TYPE_CHECKING:
    from reef.release.publisher import Publisher

log = logging.getLogger("reef.release")


class CanaryController:
    def __init__(self, publisher: Publisher, canaries: Canaries) -> None:
        self.publisher = publisher
        self.canaries = canaries
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def log(self, scenario: str) -> CanaryLog:
        return CanaryLog(self.publisher.data_dir, scenario)

    def describe(self, scenario: str) -> dict[str, object] | None:
        return self.canaries.describe(scenario)

    # --- a person (or the API) --------------------------------------------------------------

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
            self._end(scenario, "aborted", "replaced by another canary")
            canary = self.canaries.new(scenario, view.candidate_id, route.release_id,
                                       pub.config.scenario(scenario).canary, fraction)
            await asyncio.to_thread(self.log(scenario).append, canary, "running")
            self.canaries.run(canary)
            self._split(canary, model)
        return canary

    async def stop(self, scenario: str, reason: str = "stopped by a person") -> Canary | None:
        async with self.publisher.lock:
            return self._end(scenario, "aborted", reason)

    # --- the rule ---------------------------------------------------------------------------

    def schedule(self, scenarios: list[str]) -> None:
        """Decide these scenarios' canaries soon, off the caller's path (one task per scenario)."""
        for scenario in scenarios:
            task = self._tasks.get(scenario)
            if task is None or task.done():
                task = asyncio.get_running_loop().create_task(self._decide(scenario), name=f"canary-{scenario}")
                self._tasks[scenario] = task

    async def _decide(self, scenario: str) -> None:
        try:
            await self._carry_out(scenario)
        except Exception:  # a background task: nobody else would see the error
            log.exception("%s: deciding the canary failed", scenario)

    async def _carry_out(self, scenario: str) -> None:
        pub = self.publisher
        async with pub.lock:
            canary = self.canaries.running.get(scenario)
            verdict = canary.decide() if canary is not None else None
            if canary is None or verdict is None:
                return
            if verdict == "aborted":
                log.warning("%s: canary of %s aborted: %s", scenario, canary.candidate_id[:12], canary.reason)
                self._end(scenario, "aborted", canary.reason)
                return
            await asyncio.to_thread(self.log(scenario).append, canary, "promoting", canary.reason)
        try:
            # The publisher ends the canary as promoted when it switches the route (superseded()).
            await pub.release(scenario, canary.candidate_id, canary.head_release_id, approved_by="canary",
                              operation="promote")
        except Exception as exc:  # noqa: BLE001 - any refusal aborts the canary, with the reason
            async with pub.lock:
                if self.canaries.running.get(scenario) is canary:
                    self._end(scenario, "aborted", f"promotion failed: {exc}")
            if not isinstance(exc, ReleaseError):
                raise

    # --- for the publisher (it holds its lock) -----------------------------------------------

    def superseded(self, scenario: str, release: Release) -> None:
        """`release` now serves the scenario: its canary is promoted (if this was its promotion)
        or aborted."""
        canary = self.canaries.running.get(scenario)
        if canary is None:
            return
        if (canary.state == "promoting" and release.operation == "promote"
                and release.content_id == canary.candidate_id):
            self._end(scenario, "promoted", canary.reason, release.release_id)
        else:
            self._end(scenario, "aborted", f"superseded by {release.release_id}")

    def _end(self, scenario: str, state: CanaryState, reason: str | None,
             release_id: str | None = None) -> Canary | None:
        canary = self.canaries.running.get(scenario)
        if canary is None:
            return None
        self.log(scenario).append(canary, state, reason, release_id)
        routes = self.publisher.routes
        route = routes.serving().get(scenario)
        if route is not None and route.canary is not None:
            routes.set(scenario, dataclasses.replace(route, canary=None))
        return self.canaries.end(scenario)

    def _split(self, canary: Canary, model: str) -> None:
        routes = self.publisher.routes
        route = routes.for_scenario(canary.scenario)
        split = CanarySplit(canary.candidate_id, model, canary.label, canary.fraction)
        routes.set(canary.scenario, dataclasses.replace(route, canary=split))  # the head's harness stays

    # --- restart ----------------------------------------------------------------------------

    async def resume(self) -> None:
        """Take up each scenario's last canary where the previous server left it."""
        for path in sorted((self.publisher.data_dir / "releases").glob("*/canaries.jsonl")):
            scenario = path.parent.name
            canary = self.log(scenario).last()
            if canary is None:
                continue
            if canary.state in ("promoted", "aborted"):
                self.canaries.finished[scenario] = canary
                continue
            async with self.publisher.lock:
                try:
                    await self._resume(scenario, canary)
                except ReleaseError as exc:
                    self._end(scenario, "aborted", f"could not resume after a restart: {exc}")
                finally:
                    self.publisher.hold.open()

    async def _resume(self, scenario: str, canary: Canary) -> None:
        pub = self.publisher
        chain = pub.chain(scenario)
        self.canaries.run(canary)  # so that every way out below is a persisted transition
        if canary.state == "promoting":
            done = next((r for r in chain.releases() if r.operation == "promote"
                         and r.content_id == canary.candidate_id
                         and r.parent_release_id == canary.head_release_id), None)
            if done is not None:
                self._end(scenario, "promoted", canary.reason, done.release_id)
                return
            self.log(scenario).append(canary, "running", "resumed: the promotion had not happened")
        head = chain.head()
        if head is None or head.release_id != canary.head_release_id:
            self._end(scenario, "aborted", f"the head moved to {head.release_id if head else None} meanwhile")
            return
        model, _ = await pub._load(scenario, canary.candidate_id, "lora")
        canary.arms, by_record = await asyncio.to_thread(recount, pub.data_dir, canary)
        self.canaries.run(canary, by_record)
        self._split(canary, model)
        log.info("%s: canary of %s resumed with %s", scenario, canary.candidate_id[:12],
                 {arm: stats.public() for arm, stats in canary.arms.items()})
        self.schedule([scenario])

    async def reload(self) -> None:
        """After an engine restart: load each running canary's adapter again and split again."""
        pub = self.publisher
        for scenario, canary in list(self.canaries.running.items()):
            async with pub.lock:
                try:
                    model, _ = await pub._load(scenario, canary.candidate_id, "lora")
                except ReleaseError as exc:
                    self._end(scenario, "aborted", f"could not load it again after an engine restart: {exc}")
                    continue
                self._split(canary, model)

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
