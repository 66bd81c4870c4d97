"""The release publisher inside `reef serve`: puts a release's content into the running engine,
proves it serves, moves the chain's head, and switches the scenario's route, in that order.

    release(s, candidate, expected_parent)   a gate-selected candidate becomes s@r<n+1>
    release(..., harness=h)                  weights and a harness candidate in one step (composite)
    rollback(s, release_id, expected_parent) an older release's content (and traffic split) serves again
    route(s, expected_parent, split)         a routing release: the head's content, a canary split on or off
    apply_heads()                            serve each scenario's head and its split (at start, after an
                                             engine restart)

Order is what makes a swap safe:
1. The head must still be `expected_parent` (checked first, and again by the chain's CAS).
2. The content is loaded and proved by a canary request (reef.serving.swap).
3. Only then is the release appended to the chain; a concurrent publisher that got there first
   makes this one undo its load and answer 409.
4. The route switches in one assignment: each request records the release whose weights answered.
If 2-3 fail, the previous release keeps serving and `GET /reef/status` shows the error.

Canaries (a share of live traffic on a candidate) are `self.canary` (reef.serving.canary_control);
their traffic split is a routing release on the chain, so a restart or a rollback restores it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from reef.config import ServeConfig
from reef.core.crashpoints import crash_point
from reef.engine.hold import EngineHold
from reef.engine.weights import EngineWeightsError, Weights
from reef.registry.artifacts import ArtifactError, ArtifactStore
from reef.registry.base_model import ensure_scenario, import_base_model
from reef.registry.candidates import CandidateRegistry, CandidateStateError, CandidateView
from reef.registry.chain_api import Chain, HeadMovedError, NotSelectedError, ReleaseError, StaleGateError
from reef.registry.schema import Release, Routing
from reef.registry.state import ReleaseState
from reef.serving.adapters import AdapterSlots
from reef.serving.canary import Canaries
from reef.serving.canary_control import CanaryController
from reef.serving.routing import CanarySplit, Route, Routes
from reef.serving.swap import EngineConflictError, SwapFailedError, Swapper, Undo

log = logging.getLogger("reef.registry")

# A head released through another gateway that this one failed to serve is tried again after this
# long (or at once when the head moves on), not on every poll.
FOLLOW_RETRY_S = 60.0

__all__ = ["EngineConflictError", "NotSelectedError", "Publisher", "StaleGateError", "SwapFailedError"]


def _log_failure(task: asyncio.Task[Any], scenario: str) -> None:
    if task.exception() is not None:
        log.error("chain for %s: %s", scenario, task.exception())


async def _nothing() -> None:
    pass


class Publisher:
    def __init__(self, config: ServeConfig, routes: Routes, hold: EngineHold, weights: Weights | None,
                 canaries: Canaries) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.store = ArtifactStore.for_data_dir(self.data_dir)
        self.state = ReleaseState(self.data_dir, config.state.url)  # where the chains live
        self.routes = routes
        self.hold = hold
        self.weights = weights
        self.slots: AdapterSlots | None = None
        self.swapper: Swapper | None = None
        if weights is not None:
            self.slots = AdapterSlots(weights, config.release.keep_adapters, config.engine.max_loras,
                                      self._must_stay_loaded)
            self.swapper = Swapper(config, self.store, routes, hold, weights, self.slots)
        self.canary = CanaryController(self, canaries)
        self.base_content: str | None = None
        self.errors: dict[str, str] = {}
        self.disabled: str | None = None
        # Why weights cannot be loaded when there is no swapper (said by every release that needs them).
        self.unmanaged = ("this server records in front of an upstream it does not manage: "
                          "it cannot load weights into it")
        self.swapped_at: dict[str, float] = {}
        self.lock = asyncio.Lock()  # one swap at a time: releases, rollbacks, canaries
        self._chains: dict[str, Chain] = {}
        self._follow_failed: dict[str, tuple[str, float]] = {}  # scenario -> (head it could not serve, when)

    # --- start-up ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Import the base model, then serve each scenario's head (a restart resumes every chain)."""
        try:
            base = await asyncio.to_thread(import_base_model, self.store, self.config.model_path)
        except ArtifactError as exc:
            # Recording in front of an upstream whose weights are not here: serve, but no releases.
            self.disabled = f"releases are off: {exc}; give reef serve the model (--model)"
            log.warning(self.disabled)
            return
        self.base_content = base.content_id
        if self.swapper is not None:
            self.swapper.engine_full = base.content_id
        self.routes.base_content_id = base.content_id
        self.routes.on_new_scenario = self._new_scenario
        if self.swapper is not None:
            await self._check_base(base.content_id)
        await self.apply_heads()
        await self.canary.resume()

    async def _check_base(self, content_id: str) -> None:
        """The engine must hold the base weights before the heads are applied. An engine this server
        started loaded them itself (its answer is the reference). An upstream engine outlives the
        gateway: one killed during a full-weight swap leaves it holding the new weights (the swapper
        noted them before the reload), so they are replaced by the base again. Several replicas:
        every one of them, as one step (reef.engine.replica_weights)."""
        assert self.swapper is not None and self.weights is not None
        marked = self.swapper.marked_engine()
        reload = bool(self.config.upstream.replica_urls) and marked not in (None, content_id)
        if not reload:
            try:
                await self.swapper.verify(self.config.model_name, content_id, None)
            except ReleaseError as exc:
                log.warning("the engine does not answer as the base model (%s)", exc)
                reload = True
        try:
            if reload:  # at start: no request runs yet, nothing to hold back
                log.warning("the engine may hold other full weights (%s): reloading the base", str(marked)[:12])
                await self.weights.reload_full(await asyncio.to_thread(self.store.verify, content_id))
                await self.swapper.verify(self.config.model_name, content_id, None)
            await asyncio.to_thread(self.swapper.mark_engine, content_id)
        except (ReleaseError, ArtifactError, EngineWeightsError) as exc:
            log.error("base model check failed: %s", exc)

    async def apply_heads(self) -> None:
        """Serve each scenario's head, with its traffic split (a canary's candidate arm) when it has
        one; the engine holds only the base (it just started)."""
        if self.disabled or self.base_content is None:
            return
        scenarios = sorted(set(await asyncio.to_thread(self.state.scenarios)) | set(self.config.scenarios))
        for scenario in scenarios:
            chain, r0 = await asyncio.to_thread(self._ensure_scenario, scenario)
            if r0.content_id != self.base_content:
                self.errors[scenario] = (f"{r0.release_id} is base {r0.content_id[:12]}, but this server runs "
                                         f"{self.base_content[:12]} ({self.config.model_path})")
                log.error("%s: %s", scenario, self.errors[scenario])
                continue
            head = chain.head()
            assert head is not None
            await asyncio.to_thread(self._mark_released, scenario, chain)
            async with self.lock:
                try:
                    if head.content_id == self.base_content:
                        model = self.config.model_name
                    else:
                        model, _ = await self._load(scenario, head.content_id, head.kind)
                        self.swapped_at[scenario] = time.time()
                    self.routes.set(scenario, self._route(head, model, await self._load_split(scenario, head)))
                except ReleaseError as exc:
                    self.errors[scenario] = f"could not serve head {head.release_id}: {exc}"
                    log.error("%s: %s", scenario, self.errors[scenario])
                    self.routes.set(scenario, Route(self.config.model_name, r0.release_id, r0.content_id, "full"))
                finally:
                    self.hold.open()

    async def follow(self, scenario: str) -> Release | None:
        """Serve the head another gateway on the same state database released (reef.serving.follow):
        its content and split loaded and proved here too, then the route switched; None when this
        gateway serves the head already, or cannot serve it (then the previous release keeps serving
        and `GET /reef/status` shows why)."""
        if self.disabled or self.base_content is None:
            return None
        chain = await asyncio.to_thread(self.chain, scenario)
        async with self.lock:  # never between another swap's load and its route switch
            head = await asyncio.to_thread(chain.head)
            current = self.routes.for_scenario(scenario)
            if head is None or head.release_id == current.release_id:
                return None
            failed = self._follow_failed.get(scenario)
            if failed is not None and failed[0] == head.release_id and time.monotonic() - failed[1] < FOLLOW_RETRY_S:
                return None  # not a load every poll for a head this engine refused
            try:
                if (head.content_id, head.kind) == (current.content_id, current.kind):
                    model = current.model
                else:
                    model, _ = await self._load(scenario, head.content_id, head.kind)
                self.routes.set(scenario, self._route(head, model, await self._load_split(scenario, head)))
            except ReleaseError as exc:
                self.errors[scenario] = f"could not serve {head.release_id}, released through another gateway: {exc}"
                log.error("%s: %s", scenario, self.errors[scenario])
                self._follow_failed[scenario] = (head.release_id, time.monotonic())
                return None
            finally:
                self.hold.open()
            self.swapped_at[scenario] = time.time()
            self.errors.pop(scenario, None)
        await asyncio.to_thread(self.state.write_head_file, scenario, head.release_id)
        log.info("%s: %s serves (released through another gateway)", scenario, head.release_id)
        return head

    async def _load_split(self, scenario: str, release: Release) -> str | None:
        """The engine name of `release`'s candidate arm, loaded; None without a split, or when it
        cannot be loaded (the head arm serves alone; the canary controller then ends the split)."""
        arm = release.split()
        if arm is None:
            return None
        try:
            model, _ = await self._load(scenario, arm.content_id, arm.kind)
        except ReleaseError as exc:
            self.errors[scenario] = (f"could not load the canary arm {arm.content_id[:12]} of "
                                     f"{release.release_id}: {exc}")
            log.error("%s: %s", scenario, self.errors[scenario])
            return None
        return model

    @staticmethod
    def _route(release: Release, model: str, split_model: str | None) -> Route:
        arm = release.split()
        split = (CanarySplit(arm.content_id, split_model, arm.label or release.release_id, arm.share)
                 if arm is not None and split_model is not None else None)
        return Route(model, release.release_id, release.content_id, release.kind, canary=split,
                     harness_id=release.harness_id)

    def _mark_released(self, scenario: str, chain: Chain) -> None:
        """A kill between a release's chain append and its candidate's `released` event leaves the
        register behind the chain (the truth): catch it up."""
        registry = CandidateRegistry(self.data_dir, scenario, url=self.config.state.url)
        views = {v.candidate_id: v for v in registry.list()}
        for release in chain.releases():
            for cid in (release.content_id, release.harness_id):
                view = views.get(cid) if release.operation in ("train", "promote") and cid else None
                if view is not None and view.status == "selected":
                    try:
                        registry.mark_released(view.candidate_id, release.release_id, release.approved_by)
                    except CandidateStateError:
                        pass  # another gateway on the state database caught it up first (or a person rejected it)
                    views.pop(view.candidate_id)

    async def engine_restarted(self) -> None:
        """The engine came back empty (the base weights, no adapters): serve every head and canary
        again before the gateway takes requests."""
        if self.swapper is None or self.slots is None or self.base_content is None:
            return
        self.slots.forget()
        self.swapper.engine_full = self.base_content
        await self.apply_heads()
        await self.canary.splits_applied()

    def _new_scenario(self, scenario: str) -> None:
        """A request for a scenario nobody released to: give it a chain whose r0 is the base."""
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._ensure_scenario, scenario))
        task.add_done_callback(lambda t: _log_failure(t, scenario))

    # --- what serves ---------------------------------------------------------------------------

    def chain(self, scenario: str) -> Chain:
        """The scenario's chain, with its r0 (the base) created if nobody used the scenario yet."""
        chain = self._chains.get(scenario)
        if chain is None:
            chain, _ = self._ensure_scenario(scenario)
            self._chains[scenario] = chain
        return chain

    def _ensure_scenario(self, scenario: str) -> tuple[Chain, Release]:
        return ensure_scenario(self.data_dir, scenario, self.config.model_path, self.store, self.config.state.url)

    def serving(self, scenario: str) -> dict[str, Any]:
        route = self.routes.for_scenario(scenario)
        swapped = self.swapped_at.get(scenario)
        split = route.canary
        return {"release_id": route.release_id, "model": route.model, "content_id": route.content_id,
                "kind": route.kind, "swapped_at": swapped, "error": self.errors.get(scenario),
                "split": None if split is None else {"candidate_id": split.candidate_id, "label": split.label,
                                                     "share": split.fraction},
                "canary": self.canary.describe(scenario)}

    # --- operations ----------------------------------------------------------------------------

    async def release(self, scenario: str, candidate_id: str, expected_parent: str,
                      approved_by: str | None = None, operation: str = "train",
                      harness: str | None = None) -> tuple[Release, dict[str, Any]]:
        """Release a gate-selected candidate: weights (the head's harness stays), a harness (the head's
        weights stay), or, with `harness`, weights and a harness together in one step (composite)."""
        registry = CandidateRegistry(self.data_dir, scenario, url=self.config.state.url)
        first = registry.get(candidate_id)  # CandidateNotFoundError before anything else
        second = registry.get(harness) if harness else None
        if first.kind == "harness" and second is not None:
            raise ReleaseError("a composite release binds a weights candidate and a harness candidate; "
                               f"{first.candidate_id[:12]} is a harness")
        if second is not None and second.kind != "harness":
            raise ReleaseError(f"harness {second.candidate_id[:12]} is a {second.kind} candidate, not a harness")
        ids = [v.candidate_id for v in (first, second) if v is not None]
        views: dict[str, CandidateView] = {}

        def selected() -> None:  # under the publisher's lock, after the head check
            chain = self.chain(scenario)
            head = chain.head()
            for cid in ids:
                view = views[cid] = registry.get(cid)
                # A split restored by a rollback may promote a candidate that was released before.
                if view.status != "selected" and not (operation == "promote" and view.status == "released"):
                    reason = f": {view.gate.reason}" if view.gate and view.status == "rejected" else ""
                    raise NotSelectedError(f"candidate {view.candidate_id[:12]} is {view.status}{reason}; only a "
                                           "candidate the gate selected can be released")
                assert view.gate is not None and view.gate.head_release_id is not None
                # Better than what it replaces: the gate must have compared it with what serves now
                # (weights and harness). A promote is decided by the canary's live comparison instead.
                gated_against = chain.get(view.gate.head_release_id).serves()
                if operation != "promote" and head is not None and gated_against != head.serves():
                    raise StaleGateError(f"candidate {view.candidate_id[:12]} was gated against "
                                         f"{view.gate.head_release_id}, but {head.release_id} serves other content "
                                         "now: gate it again (reef gate, or reef.gate.evaluate.evaluate_candidate)")

        def commit(chain: Chain, expected_parent: str) -> Release:
            parent = chain.get(expected_parent)
            chosen = [views[cid] for cid in ids]
            weights = next((v for v in chosen if v.kind != "harness"), None)
            tree = next((v for v in chosen if v.kind == "harness"), None)
            assert all(v.gate is not None for v in chosen)
            evaluation = (weights or tree).gate.summary()  # type: ignore[union-attr]
            if weights is not None and tree is not None:
                evaluation["harness"] = tree.gate.summary()  # type: ignore[union-attr]
            if operation == "promote" and self.canary.describe(scenario):
                evaluation["canary"] = self.canary.describe(scenario)
            return chain.publish(
                expected_parent, weights.candidate_id if weights else parent.content_id,
                weights.kind if weights else parent.kind, operation,  # type: ignore[arg-type]
                evaluation=evaluation, approved_by=approved_by,
                lineage=weights.lineage if weights else parent.lineage,
                harness_id=tree.candidate_id if tree else parent.harness_id,
                harness_lineage=tree.lineage if tree else parent.harness_lineage)

        # A harness alone keeps the head's weights: None tells _publish to load nothing new.
        content, kind = (None, None) if first.kind == "harness" else (first.candidate_id, first.kind)
        release, swap = await self._publish(scenario, content, kind, expected_parent, commit, selected)
        for cid in ids:
            try:
                await asyncio.to_thread(registry.mark_released, cid, release.release_id, approved_by)
            except CandidateStateError as exc:  # a person rejected it during the swap: the chain is the truth
                log.warning("%s: %s serves, but its candidate could not be marked released: %s", scenario,
                            release.release_id, exc)
        return release, swap

    async def rollback(self, scenario: str, release_id: str, expected_parent: str,
                       approved_by: str | None = None) -> tuple[Release, dict[str, Any]]:
        target = self.chain(scenario).get(release_id)

        def commit(chain: Chain, expected_parent: str) -> Release:
            return chain.rollback(release_id, expected_parent, approved_by or "unknown")

        split = target.split()
        return await self._publish(scenario, target.content_id, target.kind, expected_parent, commit,
                                   split=split.content_id if split else None, reason=f"rolled back to {release_id}")

    async def route(self, scenario: str, expected_parent: str | None, split: tuple[str, float] | None,
                    approved_by: str | None, evaluation: dict[str, Any] | None = None,
                    reason: str | None = None) -> Release:
        """A routing release: the head's content, with a share of traffic on a LoRA candidate
        (`split` = (candidate, fraction): a canary starts) or with none (it ends). `expected_parent`
        None: whatever the head is. The canary controller keeps the canary's state in step."""

        def commit(chain: Chain, expected_parent: str) -> Release:
            parent = chain.get(expected_parent)
            routing = None if split is None else Routing.canary(scenario, parent.content_id, parent.kind, *split)
            return chain.publish(expected_parent, parent.content_id, parent.kind, "route", evaluation=evaluation,
                                 approved_by=approved_by, lineage=parent.lineage, harness_id=parent.harness_id,
                                 harness_lineage=parent.harness_lineage, routing=routing)

        release, _ = await self._publish(scenario, None, None, expected_parent, commit,
                                         split=split[0] if split else None, reason=reason)
        return release

    async def _publish(self, scenario: str, content_id: str | None, kind: str | None, expected_parent: str | None,
                       commit: Callable[[Chain, str], Release], check: Callable[[], None] | None = None,
                       split: str | None = None, reason: str | None = None) -> tuple[Release, dict[str, Any]]:
        """Load `content_id` (None: the head's weights stay) and the LoRA `split` (a canary arm),
        commit on top of `expected_parent` (None: the head), switch the route. `reason`: why a
        canary running until now ends (when this release ends it)."""
        chain = self.chain(scenario)
        async with self.lock:
            head = chain.head()
            if head is None or (expected_parent is not None and head.release_id != expected_parent):
                raise HeadMovedError(scenario, expected_parent, head.release_id if head else None)
            expected_parent = head.release_id
            if check is not None:
                check()
            if content_id is None or kind is None:
                content_id, kind = head.content_id, head.kind
            started = time.perf_counter()
            current = self.routes.for_scenario(scenario)
            try:
                if (content_id, kind) == (current.content_id, current.kind):  # a harness or routing change: no swap
                    model, undo = current.model, cast(Undo, _nothing)
                else:
                    model, undo = await self._load(scenario, content_id, kind)
                split_model, split_undo = (None, _nothing) if split is None else await self._load_split_arm(
                    scenario, split, undo)
                crash_point("release:loaded")
                try:
                    release = await asyncio.to_thread(commit, chain, expected_parent)
                except BaseException:
                    await split_undo()
                    await undo()
                    raise
                crash_point("release:appended")
                self.canary.on_release(scenario, release, reason)
                self.routes.set(scenario, self._route(release, model, split_model))
            finally:
                self.hold.open()
            ms = (time.perf_counter() - started) * 1000
            self.swapped_at[scenario] = time.time()
            self.errors.pop(scenario, None)
            if self.slots is not None:
                await self.slots.trim()
        log.info("%s: %s serves %s (%s)%s after %.0f ms", scenario, release.release_id, content_id[:12], kind,
                 f", {arm.share:.0%} on {split[:12]}" if split and (arm := release.split()) else "", ms)
        return release, {"ms": round(ms, 1), "canary_ok": True, "adapter": model if kind == "lora" else None}

    async def _load_split_arm(self, scenario: str, content_id: str, undo: Undo) -> tuple[str, Undo]:
        """A canary arm's adapter, loaded and proved; on failure the head's load is undone too."""
        try:
            return await self._load(scenario, content_id, "lora")
        except BaseException:
            await undo()
            raise

    async def _load(self, scenario: str, content_id: str, kind: str) -> tuple[str, Undo]:
        """The swapper's load; a failure is what `GET /reef/status` shows for the scenario."""
        if self.swapper is None:
            raise SwapFailedError(self.unmanaged)
        try:
            return await self.swapper.load(scenario, content_id, kind)
        except SwapFailedError as exc:
            self.errors[scenario] = f"swap to {content_id[:12]} failed: {exc}"
            raise

    def _must_stay_loaded(self) -> set[str]:
        """What serves, what served just before (instant rollback) and canaries."""
        keep: set[str] = set()
        for scenario, route in self.routes.serving().items():
            if route.content_id:
                keep.add(route.content_id)
            if route.canary:
                keep.add(route.canary.candidate_id)
            releases = self.chain(scenario).releases()
            if len(releases) >= 2:
                keep.add(releases[-2].content_id)
        return keep

    async def close(self) -> None:
        """Unload this server's adapters: an engine shared with other gateways keeps no stale ones."""
        self.canary.close()
        if self.slots is not None:
            await self.slots.close()

    # --- for the learner -----------------------------------------------------------------------

    async def auto_release(self, view: CandidateView) -> Release | None:
        """Release a gate-selected candidate when the scenario's policy is `auto`."""
        if self.config.policy(view.scenario) != "auto" or view.status != "selected" or view.gate is None:
            return None
        parent = view.gate.head_release_id
        assert parent is not None
        release, _ = await self.release(view.scenario, view.candidate_id, parent, approved_by="auto")
        return release
