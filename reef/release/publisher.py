"""The release publisher inside `reef serve`: puts a release's content into the running engine,
proves it serves, moves the chain's head, and switches the scenario's route, in that order.

    release(s, candidate, expected_parent)   a gate-selected candidate becomes s@r<n+1>
    rollback(s, release_id, expected_parent) an older release's content serves again, as s@r<n+1>
    start_canary / stop_canary               a share of live traffic goes to a candidate adapter

Order is what makes a swap safe:
1. The head must still be `expected_parent` (checked first, and again by the chain's CAS).
2. The artifact is verified byte for byte, then loaded: a LoRA under a new adapter name (the
   content id, so a name never means two weights), full weights by pause -> reload -> resume while
   the gateway holds new requests (routing.EngineHold).
3. A canary request at temperature 0 must reproduce the reply the gate computed for this content
   with transformers (or, for content without a gate result, the reply it gave when it last served).
4. Only then is the release appended to the chain; a concurrent publisher that got there first
   makes this one undo its load and answer 409.
5. The route switches in one assignment: each request records the release whose weights answered.
If 2-4 fail, the previous release keeps serving and `GET /reef/status` shows the error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef.config import ServeConfig
from reef.engine.weights import EngineWeights, EngineWeightsError
from reef.gateway.routing import CanarySplit, EngineHold, Route, Routes
from reef.release.artifacts import ArtifactError, ArtifactStore
from reef.release.base_model import base_of, ensure_scenario, import_base_model
from reef.release.canary import Canaries, Canary
from reef.release.candidates import CandidateNotFoundError, CandidateRegistry, CandidateView, Probe
from reef.release.chain import HeadMovedError, ReleaseChain, ReleaseError
from reef.release.schema import Release, adapter_name

log = logging.getLogger("reef.release")

# Content without a gate result (the base model) is checked against its own earlier reply to this.
DEFAULT_PROBE = Probe(messages=[{"role": "user", "content": "What is 2 + 3?"}], max_tokens=8, text="")
PROBES_FILE = "probes.json"
DRAIN_TIMEOUT_S = 60.0


class SwapFailedError(ReleaseError):
    """The engine refused the content or the canary request failed; nothing was published."""


class NotSelectedError(ReleaseError):
    """The candidate has no `select` decision from the gate (or was rejected, or is released)."""


class StaleGateError(NotSelectedError):
    """The gate compared the candidate with content that no longer serves: gate it again."""


class EngineConflictError(ReleaseError):
    """Full weights are shared by every scenario on the engine: another scenario needs other ones."""


class Publisher:
    def __init__(self, config: ServeConfig, routes: Routes, hold: EngineHold, weights: EngineWeights | None,
                 canaries: Canaries) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.store = ArtifactStore.for_data_dir(self.data_dir)
        self.routes = routes
        self.hold = hold
        self.weights = weights
        self.canaries = canaries
        self.base_content: str | None = None
        self.engine_full: str | None = None  # the full weights the engine holds now
        self.adapters: dict[str, str] = {}  # content id -> adapter name, loaded in the engine
        self.errors: dict[str, str] = {}
        self.disabled: str | None = None
        self.swapped_at: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._probes_path = self.data_dir / "releases" / PROBES_FILE
        self._probes: dict[str, str] = {}
        self._chains: dict[str, ReleaseChain] = {}

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
        self.base_content = self.engine_full = base.content_id
        self.routes.base_content_id = base.content_id
        self.routes.on_new_scenario = self._new_scenario
        if self._probes_path.is_file():
            self._probes = json.loads(self._probes_path.read_text())
        if self.weights is not None:
            try:  # the engine loaded these weights from disk itself: what it says now is the reference
                await self._verify(self.config.model_name, base.content_id, None)
            except ReleaseError as exc:
                log.error("base model check failed: %s", exc)
        scenarios = sorted({p.parent.name for p in (self.data_dir / "releases").glob("*/chain.jsonl")}
                           | set(self.config.scenarios))
        for scenario in scenarios:
            chain, r0 = await asyncio.to_thread(ensure_scenario, self.data_dir, scenario, self.config.model_path,
                                                self.store)
            if r0.content_id != base.content_id:
                self.errors[scenario] = (f"{r0.release_id} is base {r0.content_id[:12]}, but this server runs "
                                         f"{base.content_id[:12]} ({self.config.model_path})")
                log.error("%s: %s", scenario, self.errors[scenario])
                continue
            head = chain.head()
            assert head is not None
            if head.content_id == base.content_id:
                self.routes.set(scenario, Route(self.config.model_name, head.release_id, head.content_id, "full"))
                continue
            async with self._lock:
                try:
                    model, undo = await self._load(scenario, head.content_id, head.kind)
                    self.routes.set(scenario, Route(model, head.release_id, head.content_id, head.kind))
                    self.swapped_at[scenario] = time.time()
                except ReleaseError as exc:
                    self.errors[scenario] = f"could not serve head {head.release_id}: {exc}"
                    log.error("%s: %s", scenario, self.errors[scenario])
                    self.routes.set(scenario, Route(self.config.model_name, r0.release_id, r0.content_id, "full"))
                finally:
                    self.hold.open()

    def _new_scenario(self, scenario: str) -> None:
        """A request for a scenario nobody released to: give it a chain whose r0 is the base."""
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(
            ensure_scenario, self.data_dir, scenario, self.config.model_path, self.store))
        task.add_done_callback(lambda t: t.exception() and log.error("chain for %s: %s", scenario, t.exception()))

    # --- what serves ---------------------------------------------------------------------------

    def chain(self, scenario: str) -> ReleaseChain:
        """The scenario's chain, with its r0 (the base) created if nobody used the scenario yet."""
        chain = self._chains.get(scenario)
        if chain is None:
            chain, _ = ensure_scenario(self.data_dir, scenario, self.config.model_path, self.store)
            self._chains[scenario] = chain
        return chain

    def serving(self, scenario: str) -> dict[str, Any]:
        route = self.routes.for_scenario(scenario)
        swapped = self.swapped_at.get(scenario)
        return {"release_id": route.release_id, "model": route.model, "content_id": route.content_id,
                "kind": route.kind, "swapped_at": swapped, "error": self.errors.get(scenario),
                "canary": self.canaries.describe(scenario)}

    # --- operations ----------------------------------------------------------------------------

    async def release(self, scenario: str, candidate_id: str, expected_parent: str,
                      approved_by: str | None = None, operation: str = "train") -> tuple[Release, dict[str, Any]]:
        registry = CandidateRegistry(self.data_dir, scenario)
        view = registry.get(candidate_id)  # CandidateNotFoundError before anything else

        def selected() -> None:  # under the publisher's lock, after the head check
            nonlocal view
            view = registry.get(candidate_id)
            if view.status != "selected":
                reason = f": {view.gate.reason}" if view.gate and view.status == "rejected" else ""
                raise NotSelectedError(f"candidate {view.candidate_id[:12]} is {view.status}{reason}; only a "
                                       "candidate the gate selected can be released")
            assert view.gate is not None and view.gate.head_release_id is not None
            # Better than what it replaces: the gate must have compared it with what serves now. A
            # promote is decided by the canary's live comparison with the head instead.
            chain = self.chain(scenario)
            gated_against = chain.get(view.gate.head_release_id).content_id
            head = chain.head()
            if operation != "promote" and head is not None and gated_against != head.content_id:
                raise StaleGateError(f"candidate {view.candidate_id[:12]} was gated against "
                                     f"{view.gate.head_release_id}, but {head.release_id} serves other content "
                                     "now: gate it again (reef gate, or reef.release.gate.evaluate_candidate)")

        def commit(chain: ReleaseChain) -> Release:
            assert view.gate is not None
            evaluation = view.gate.summary()
            if operation == "promote" and self.canaries.describe(scenario):
                evaluation["canary"] = self.canaries.describe(scenario)
            return chain.publish(expected_parent, view.candidate_id, view.kind, operation,  # type: ignore[arg-type]
                                 evaluation=evaluation, approved_by=approved_by, lineage=view.lineage)

        release, swap = await self._publish(scenario, view.candidate_id, view.kind, expected_parent, commit,
                                            selected)
        await asyncio.to_thread(registry.mark_released, view.candidate_id, release.release_id, approved_by)
        return release, swap

    async def rollback(self, scenario: str, release_id: str, expected_parent: str,
                       approved_by: str | None = None) -> tuple[Release, dict[str, Any]]:
        target = self.chain(scenario).get(release_id)

        def commit(chain: ReleaseChain) -> Release:
            return chain.rollback(release_id, expected_parent, approved_by or "unknown")

        return await self._publish(scenario, target.content_id, target.kind, expected_parent, commit)

    async def _publish(self, scenario: str, content_id: str, kind: str, expected_parent: str,
                       commit: Callable[[ReleaseChain], Release],
                       check: Callable[[], None] | None = None) -> tuple[Release, dict[str, Any]]:
        chain = self.chain(scenario)
        async with self._lock:
            head = chain.head()
            if head is None or head.release_id != expected_parent:
                raise HeadMovedError(scenario, expected_parent, head.release_id if head else None)
            if check is not None:
                check()
            started = time.perf_counter()
            try:
                model, undo = await self._load(scenario, content_id, kind)
                try:
                    release = await asyncio.to_thread(commit, chain)
                except BaseException:
                    await undo()
                    raise
                self._finish_canary(scenario, "aborted", f"superseded by {release.release_id}")
                self.routes.set(scenario, Route(model, release.release_id, content_id, kind))
            finally:
                self.hold.open()
            ms = (time.perf_counter() - started) * 1000
            self.swapped_at[scenario] = time.time()
            self.errors.pop(scenario, None)
            await self._trim_adapters()
        log.info("%s: %s serves %s (%s) after %.0f ms", scenario, release.release_id, content_id[:12], kind, ms)
        return release, {"ms": round(ms, 1), "canary_ok": True, "adapter": model if kind == "lora" else None}

    async def _load(self, scenario: str, content_id: str, kind: str) -> tuple[str, Callable[[], Any]]:
        """Put `content_id` into the engine and prove it serves; (model name, undo). Leaves the
        hold closed after a full-weight swap: the caller opens it once the route is switched."""
        if self.weights is None:
            raise SwapFailedError("this server records in front of an upstream it does not manage: "
                                  "it cannot load weights into it")
        probe = self._probe_for(content_id)
        try:
            if kind == "lora":
                return await self._load_lora(content_id, probe)
            if kind == "full":
                return await self._load_full(scenario, content_id, probe)
        except (ArtifactError, EngineWeightsError) as exc:
            self.errors[scenario] = f"swap to {content_id[:12]} failed: {exc}"
            raise SwapFailedError(str(exc)) from exc
        except SwapFailedError as exc:
            self.errors[scenario] = f"swap to {content_id[:12]} failed: {exc}"
            raise
        raise SwapFailedError(f"a {kind} artifact cannot be served by the engine")

    async def _load_lora(self, content_id: str, probe: Probe | None) -> tuple[str, Callable[[], Any]]:
        assert self.weights is not None
        manifest = self.store.get(content_id)
        if base_of(self.store, manifest).content_id != self.engine_full:
            raise EngineConflictError(f"LoRA {content_id[:12]} runs on other weights than the engine holds")
        name = self.adapters.get(content_id)
        fresh = name is None
        if name is None:
            await self._trim_adapters(room_for=1)
            if len(self.adapters) >= self.config.engine.max_loras:
                raise EngineConflictError(f"all {self.config.engine.max_loras} adapter slots serve releases, previous "
                                          "releases or canaries; raise engine.max_loras")
            path = await asyncio.to_thread(self.store.verify, content_id)
            name = adapter_name(content_id)
            await self.weights.load_lora(name, path)
            self.adapters[content_id] = name

        async def undo() -> None:
            if fresh:
                self.adapters.pop(content_id, None)
                await self.weights.unload_lora(name)  # type: ignore[union-attr]

        try:
            await self._verify(name, content_id, probe)
        except BaseException:
            await undo()
            raise
        return name, undo

    async def _load_full(self, scenario: str, content_id: str, probe: Probe | None) -> tuple[str, Callable[[], Any]]:
        assert self.weights is not None
        model = self.config.model_name
        previous = self.engine_full

        async def nothing() -> None:
            self.hold.open()

        if content_id == previous:
            await self._verify(model, content_id, probe)
            return model, nothing
        for other, route in self.routes.serving().items():
            needs = self._full_needed_by(route)
            if other != scenario and needs != content_id:
                raise EngineConflictError(
                    f"full weights serve every scenario on this engine, and {other} serves {route.release_id} "
                    f"(on weights {str(needs)[:12]}); give it the same release or use LoRA candidates")
        path = await asyncio.to_thread(self.store.verify, content_id)
        assert previous is not None
        back = await asyncio.to_thread(self.store.verify, previous)
        self.hold.close()
        try:
            await self.hold.drain(DRAIN_TIMEOUT_S)
        except TimeoutError as exc:
            self.hold.open()
            raise SwapFailedError(f"requests still running after {DRAIN_TIMEOUT_S} s") from exc

        async def undo() -> None:
            try:
                await self.weights.reload_full(back)  # type: ignore[union-attr]
                self.engine_full = previous
            finally:
                self.hold.open()

        try:
            await self.weights.reload_full(path)
            self.engine_full = content_id
            await self._verify(model, content_id, probe)
        except BaseException:
            await undo()
            raise
        return model, undo

    def _full_needed_by(self, route: Route) -> str | None:
        if route.kind == "lora" and route.content_id:
            return base_of(self.store, self.store.get(route.content_id)).content_id
        return route.content_id or self.base_content

    async def _verify(self, model: str, content_id: str, probe: Probe | None) -> None:
        """The canary request: the engine answers as this content must (see the module docstring)."""
        assert self.weights is not None
        check = probe or DEFAULT_PROBE
        try:
            text = await self.weights.greedy(model, check.messages, check.max_tokens)
        except EngineWeightsError as exc:
            raise SwapFailedError(str(exc)) from exc
        expected = probe.text if probe is not None else self._probes.get(content_id)
        if expected is None:
            self._probes[content_id] = text
            await asyncio.to_thread(self._save_probes)
        elif self.config.release.verify == "tokens" and text != expected:
            raise SwapFailedError(f"canary request: {model} answered {text!r}, but content {content_id[:12]} "
                                  f"answers {expected!r}: the engine is not serving it")

    def _probe_for(self, content_id: str) -> Probe | None:
        for scenario in CandidateRegistry.scenarios(self.data_dir):
            try:
                view = CandidateRegistry(self.data_dir, scenario).get(content_id)
            except CandidateNotFoundError:
                continue
            if view.gate is not None and view.gate.probe is not None:
                return view.gate.probe
        return None

    def _save_probes(self) -> None:
        from reef.durable import replace_atomically

        self._probes_path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(self._probes_path, json.dumps(self._probes, indent=1).encode())

    async def _trim_adapters(self, room_for: int = 0) -> None:
        """Keep what serves, what served just before (instant rollback) and canaries; unload the rest
        beyond `release.keep_adapters`. Never more adapters than the engine has slots
        (`engine.max_loras`), so serving releases are not evicted and reloaded batch by batch."""
        keep: set[str] = set()
        for scenario, route in self.routes.serving().items():
            if route.content_id:
                keep.add(route.content_id)
            if route.canary:
                keep.add(route.canary.candidate_id)
            releases = self.chain(scenario).releases()
            if len(releases) >= 2:
                keep.add(releases[-2].content_id)
        limit = min(self.config.release.keep_adapters, self.config.engine.max_loras) - room_for
        for content_id in [c for c in self.adapters if c not in keep][: max(0, len(self.adapters) - limit)]:
            await self._unload(content_id)

    async def _unload(self, content_id: str) -> None:
        name = self.adapters.pop(content_id)
        try:
            await self.weights.unload_lora(name)  # type: ignore[union-attr]
        except EngineWeightsError as exc:
            log.warning("could not unload %s: %s", name, exc)

    async def close(self) -> None:
        """Unload this server's adapters: an engine shared with other gateways keeps no stale ones."""
        for content_id in list(self.adapters):
            await self._unload(content_id)

    # --- canary --------------------------------------------------------------------------------

    async def start_canary(self, scenario: str, candidate_id: str, fraction: float | None) -> Canary:
        view = CandidateRegistry(self.data_dir, scenario).get(candidate_id)
        if view.status != "selected":
            raise NotSelectedError(f"candidate {view.candidate_id[:12]} is {view.status}; a canary needs a "
                                   "candidate the gate selected")
        if view.kind != "lora":
            raise EngineConflictError("a canary shares the engine with the head, so it needs a LoRA candidate")
        async with self._lock:
            route = self.routes.for_scenario(scenario)
            model, _ = await self._load(scenario, view.candidate_id, "lora")
            self._finish_canary(scenario, "aborted", "replaced by another canary")
            rule = self.config.scenario(scenario).canary
            canary = self.canaries.start(scenario, view.candidate_id, route.release_id, rule, fraction)
            split = CanarySplit(view.candidate_id, model, f"{scenario}@canary-{view.candidate_id[:12]}",
                                canary.fraction)
            self.routes.set(scenario, Route(route.model, route.release_id, route.content_id, route.kind, split))
        return canary

    async def stop_canary(self, scenario: str, reason: str = "stopped by a person") -> Canary | None:
        async with self._lock:
            return self._finish_canary(scenario, "aborted", reason)

    def _finish_canary(self, scenario: str, state: str, reason: str | None,
                       release_id: str | None = None) -> Canary | None:
        route = self.routes.serving().get(scenario)
        if route is not None and route.canary is not None:
            self.routes.set(scenario, Route(route.model, route.release_id, route.content_id, route.kind))
        return self.canaries.finish(scenario, state, reason, release_id)  # type: ignore[arg-type]

    async def decide_canaries(self, scenarios: list[str]) -> None:
        """Carry out the rule for canaries that have enough reports (called after each report)."""
        for scenario in scenarios:
            canary = self.canaries.running.get(scenario)
            if canary is None:
                continue
            verdict = canary.decide()
            if verdict == "aborted":
                log.warning("%s: canary of %s aborted: %s", scenario, canary.candidate_id[:12], canary.reason)
                async with self._lock:
                    self._finish_canary(scenario, "aborted", canary.reason)
            elif verdict == "promoted":
                reason = canary.reason
                try:
                    release, _ = await self.release(scenario, canary.candidate_id, canary.head_release_id,
                                                    approved_by="canary", operation="promote")
                except ReleaseError as exc:
                    async with self._lock:
                        self._finish_canary(scenario, "aborted", f"promotion failed: {exc}")
                    continue
                self.canaries.finished[scenario] = canary.model_copy(
                    update={"state": "promoted", "reason": reason, "release_id": release.release_id})

    # --- for the learner -----------------------------------------------------------------------

    async def auto_release(self, view: CandidateView) -> Release | None:
        """Release a gate-selected candidate when the scenario's policy is `auto`."""
        if self.config.policy(view.scenario) != "auto" or view.status != "selected" or view.gate is None:
            return None
        parent = view.gate.head_release_id
        assert parent is not None
        release, _ = await self.release(view.scenario, view.candidate_id, parent, approved_by="auto")
        return release
