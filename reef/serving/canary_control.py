"""The canary controller: starts and stops canaries, carries out their rule's verdict, and resumes
them after a restart.

A canary's traffic split is a routing release on the scenario's chain (reef.registry.schema.Routing:
the head arm and the candidate arm with their shares): starting a canary appends one, and the
canary ends with the next release, whatever it is (its promotion, a routing release without the
split when it is aborted, or any release or rollback a person makes). The chain is the one truth
of what serves: a restarted `reef serve` applies the head's split, and a rollback to a routing
release restores it. The canary log (reef.serving.canary.CanaryLog) is the decision's state
machine over that split: a canary runs exactly while the head is its routing release
(`Canary.head_release_id`), and a chain release is always written before the canary event it
causes, so a crash between the two is repaired from the chain at the next start.

The gateway counts each arm's requests and reports (reef.serving.canary). A report that completes
the sample only schedules the decision: it runs here, in a background task, never inside the
report's request.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Protocol

from reef.config import ServeConfig
from reef.core.statemachine import IllegalTransitionError
from reef.engine.hold import EngineHold
from reef.registry.candidates import CandidateRegistry
from reef.registry.chain_api import Chain, HeadMovedError, NotSelectedError, ReleaseError
from reef.registry.schema import Release
from reef.serving.canary import Canaries, Canary, CanaryLog, CanaryState, recount
from reef.serving.routing import Routes
from reef.serving.swap import EngineConflictError

log = logging.getLogger("reef.registry")


class Releases(Protocol):
    """What the controller needs of the publisher (reef.serving.publisher.Publisher): its lock and
    state, and the two releases a canary causes. A protocol, so the controller never imports the
    publisher that owns it."""

    config: ServeConfig
    data_dir: Path
    routes: Routes
    hold: EngineHold
    lock: asyncio.Lock

    def chain(self, scenario: str) -> Chain: ...

    async def release(self, scenario: str, candidate_id: str, expected_parent: str,
                      approved_by: str | None = None, operation: str = "train",
                      harness: str | None = None) -> tuple[Release, dict[str, Any]]: ...

    async def route(self, scenario: str, expected_parent: str | None, split: tuple[str, float] | None,
                    approved_by: str | None, evaluation: dict[str, Any] | None = None,
                    reason: str | None = None) -> Release: ...


class CanaryController:
    def __init__(self, publisher: Releases, canaries: Canaries) -> None:
        self.publisher = publisher
        self.canaries = canaries
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def log(self, scenario: str) -> CanaryLog:
        return CanaryLog(self.publisher.data_dir, scenario, url=self.publisher.config.state.url)

    def describe(self, scenario: str) -> dict[str, object] | None:
        return self.canaries.describe(scenario)

    # --- a person (or the API) --------------------------------------------------------------

    async def start(self, scenario: str, candidate_id: str, fraction: float | None,
                    expected_parent: str | None = None, approved_by: str | None = None) -> Canary:
        """Append a routing release splitting `fraction` of the traffic to the candidate (on top of
        `expected_parent`; None: the head); its canary starts with it."""
        pub = self.publisher
        view = CandidateRegistry(pub.data_dir, scenario, url=pub.config.state.url).get(candidate_id)
        if view.status != "selected":
            raise NotSelectedError(f"candidate {view.candidate_id[:12]} is {view.status}; a canary needs a "
                                   "candidate the gate selected")
        if view.kind != "lora":
            raise EngineConflictError("a canary shares the engine with the head, so it needs a LoRA candidate")
        share = fraction if fraction is not None else pub.config.scenario(scenario).canary.fraction
        evaluation: dict[str, Any] = {"canary": {"candidate_id": view.candidate_id, "fraction": share,
                                                 "gate": view.gate.summary() if view.gate else None}}
        release = await pub.route(scenario, expected_parent, (view.candidate_id, share), approved_by or "admin",
                                  evaluation, reason="replaced by another canary")
        return self._of(scenario, release.release_id)

    async def stop(self, scenario: str, reason: str = "stopped by a person",
                   approved_by: str | None = None) -> Canary | None:
        canary = self.canaries.running.get(scenario)
        if canary is None:
            return None
        await self._end_split(scenario, canary, reason, approved_by or "admin")
        return self._of(scenario, canary.head_release_id)

    def _of(self, scenario: str, routing_release: str) -> Canary:
        """The canary of a routing release, running or (already) decided."""
        for canary in (self.canaries.running.get(scenario), self.canaries.finished.get(scenario)):
            if canary is not None and canary.head_release_id == routing_release:
                return canary
        found = next(c for c in reversed(self.log(scenario).canaries()) if c.head_release_id == routing_release)
        return found

    async def _end_split(self, scenario: str, canary: Canary, reason: str | None, by: str = "canary") -> None:
        """End `canary` by a routing release without its split. A head that moved already ended it."""
        try:
            await self.publisher.route(scenario, canary.head_release_id, None, by, {"canary": canary.public()},
                                       reason=reason)
        except HeadMovedError:
            # The release that moved the head ended the canary: ours in on_release, or another
            # gateway's, whose end this one reads from the log.
            await self.refresh(scenario)

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
            if verdict == "promoted":
                try:
                    await asyncio.to_thread(self.log(scenario).append, canary, "promoting", canary.reason)
                except IllegalTransitionError as exc:  # another gateway decided it first (state.url)
                    log.info("%s: the canary of %s was decided by another gateway: %s", scenario,
                             canary.candidate_id[:12], exc)
                    await self.refresh(scenario)
                    return
        if verdict == "aborted":
            log.warning("%s: canary of %s aborted: %s", scenario, canary.candidate_id[:12], canary.reason)
            await self._end_split(scenario, canary, canary.reason)
            return
        try:
            # The promote release ends the canary as promoted when it switches the route (on_release).
            await pub.release(scenario, canary.candidate_id, canary.head_release_id, approved_by="canary",
                              operation="promote")
        except Exception as exc:  # noqa: BLE001 - any refusal aborts the canary, with the reason
            if self.canaries.running.get(scenario) is canary:
                await self._end_split(scenario, canary, f"promotion failed: {exc}")
            if not isinstance(exc, ReleaseError):
                raise

    # --- for the publisher (it holds its lock) -----------------------------------------------

    def on_release(self, scenario: str, release: Release, reason: str | None = None) -> None:
        """`release` now heads the scenario: the canary running until now ends (promoted if this is
        its promotion, else aborted with `reason`), and a release that splits traffic starts its own."""
        canary = self.canaries.running.get(scenario)
        if canary is not None:
            if (canary.state == "promoting" and release.operation == "promote"
                    and release.content_id == canary.candidate_id):
                self._end(scenario, "promoted", canary.reason, release.release_id)
            else:
                self._end(scenario, "aborted", reason or f"superseded by {release.release_id}")
        if release.split() is not None:
            self._begin(scenario, release, f"restored by {release.release_id}" if release.operation == "rollback"
                        else None)

    def _begin(self, scenario: str, release: Release, reason: str | None) -> Canary:
        arm = release.split()
        assert arm is not None
        canary = self.canaries.new(scenario, arm.content_id, release.release_id,
                                   self.publisher.config.scenario(scenario).canary, arm.share)
        self.log(scenario).append(canary, "running", reason)
        self.canaries.run(canary)
        return canary

    def _end(self, scenario: str, state: CanaryState, reason: str | None,
             release_id: str | None = None) -> Canary | None:
        canary = self.canaries.running.get(scenario)
        if canary is None:
            return None
        try:
            self.log(scenario).append(canary, state, reason, release_id)
        except IllegalTransitionError as exc:
            # Another gateway ended it first (its release moved the head before this one's): the
            # log's end stands, and the canary runs here no more either way.
            log.warning("%s: the canary of %s was ended by another gateway: %s", scenario, canary.candidate_id[:12],
                        exc)
            _adopt(canary, self._logged(scenario, canary.canary_id))
        return self.canaries.end(scenario)

    # --- another gateway (state.url) ----------------------------------------------------------

    def _logged(self, scenario: str, canary_id: str) -> Canary | None:
        return next((c for c in self.log(scenario).canaries() if c.canary_id == canary_id), None)

    async def refresh(self, scenario: str) -> None:
        """Bring the scenario's running canary in line with its log, where another gateway on the same
        state database moved it: one that gateway ended stops running here (it shows as decided there),
        and one it is promoting is no longer decided here. Only forward: a read older than this
        gateway's own transition changes nothing."""
        canary = self.canaries.running.get(scenario)
        if canary is None:
            return
        logged = await asyncio.to_thread(self._logged, scenario, canary.canary_id)
        if self.canaries.running.get(scenario) is not canary or not _adopt(canary, logged):
            return
        log.info("%s: the canary of %s is %s (moved by another gateway)", scenario, canary.candidate_id[:12],
                 canary.state)
        if canary.state in ("promoted", "aborted"):
            self.canaries.end(scenario)

    async def follow(self) -> None:
        """The follow loop's poll (reef.serving.follow): each canary running here read again from its
        log, so that one another gateway decided, promoted or ended is seen here within the poll
        interval, as its heads are (one read per running canary)."""
        for scenario in list(self.canaries.running):
            await self.refresh(scenario)

    # --- restart ----------------------------------------------------------------------------

    async def resume(self) -> None:
        """Bring each scenario's canary in line with its chain's head, after the publisher applied
        the heads (and their splits): the canary of the head's routing release runs on, counted
        again from the recorded experience; any other that was running ends."""
        pub = self.publisher
        scenarios = sorted(set(CanaryLog.scenarios(pub.data_dir, pub.config.state.url)) | set(pub.routes.serving()))
        for scenario in scenarios:
            lost: Canary | None = None
            async with pub.lock:
                try:
                    lost = await self._resume(scenario)
                except ReleaseError as exc:
                    log.error("%s: could not resume the canary: %s", scenario, exc)
                finally:
                    pub.hold.open()
            if lost is not None:
                await self._end_split(scenario, lost, "could not load the candidate again after a restart")

    async def _resume(self, scenario: str) -> Canary | None:
        """Returns a canary whose split could not be applied (to be ended on the chain)."""
        chain = self.publisher.chain(scenario)
        head = chain.head()
        split = head.split() if head is not None else None
        canary = self.log(scenario).last()
        if canary is not None and canary.state in ("promoted", "aborted"):
            self.canaries.finished[scenario] = canary
            canary = None
        if canary is not None:
            self.canaries.run(canary)  # so that every way out below is a persisted transition
            if canary.state == "promoting":
                done = next((r for r in chain.releases() if r.operation == "promote"
                             and r.content_id == canary.candidate_id
                             and r.parent_release_id == canary.head_release_id), None)
                if done is not None:
                    self._end(scenario, "promoted", canary.reason, done.release_id)
                    canary = None
            if canary is not None and (head is None or canary.head_release_id != head.release_id):
                self._end(scenario, "aborted", f"the head moved to {head.release_id if head else None} meanwhile")
                canary = None
            if canary is not None and canary.state == "promoting":
                self.log(scenario).append(canary, "running", "resumed: the promotion had not happened")
        if split is None or head is None:
            return None
        if canary is None:  # the routing release was committed, its canary event was not
            canary = self._begin(scenario, head, "resumed from the head's routing release")
        if self.publisher.routes.for_scenario(scenario).canary is None:
            return canary
        canary.arms, by_record = await asyncio.to_thread(recount, self.publisher.data_dir, canary)
        self.canaries.run(canary, by_record)
        log.info("%s: canary of %s resumed with %s", scenario, canary.candidate_id[:12],
                 {arm: stats.public() for arm, stats in canary.arms.items()})
        self.schedule([scenario])
        return None

    async def splits_applied(self) -> None:
        """After an engine restart the publisher applied every head again: a running canary whose
        candidate could not be loaded again ends."""
        for scenario, canary in list(self.canaries.running.items()):
            if self.publisher.routes.for_scenario(scenario).canary is None:
                await self._end_split(scenario, canary, "could not load the candidate again after an engine restart")

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()


def _adopt(canary: Canary, logged: Canary | None) -> bool:
    """Move `canary` (this gateway's copy) forward to the state its log holds: to a final state, or
    from running to promoting (another gateway's promotion). Whether it moved."""
    if logged is None or logged.state == canary.state:
        return False
    if logged.state in ("promoted", "aborted") or (logged.state, canary.state) == ("promoting", "running"):
        canary.state, canary.reason, canary.release_id = logged.state, logged.reason, logged.release_id
        return True
    return False
