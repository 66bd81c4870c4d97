"""Swap mechanics: put an artifact's content into the running engine and prove that it serves.

    model, undo = await swapper.load(scenario, content_id, kind)

- A LoRA is loaded under an adapter name derived from its content id (a name never means two
  weights), into one of the engine's adapter slots (reef.serving.adapters).
- Full weights are replaced by pause -> reload -> resume while the gateway holds new requests and
  waits for running ones (reef.engine.hold.EngineHold); `load` returns with the hold closed, and
  the caller opens it once the route is switched, so no request is recorded under the wrong release.
- Then a canary request at temperature 0 must reproduce the reply the gate computed for this
  content on the first task of the scenario's eval suite (the engine's own reply when the gate ran
  on the engine); content without a gate result: the reply it gave to a neutral probe when it last
  served, kept in `<data_dir>/releases/neutral-probes.json`.

`undo()` puts back what served before; the publisher calls it when the chain refuses the release.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from reef.config import ServeConfig
from reef.core.durable import replace_atomically
from reef.core.paths import DataDir
from reef.engine.hold import EngineHold
from reef.engine.weights import EngineWeightsError, Weights
from reef.registry.artifacts import ArtifactError, ArtifactStore
from reef.registry.base_model import base_of
from reef.registry.candidates import CandidateNotFoundError, CandidateRegistry, Probe
from reef.registry.chain import ReleaseError
from reef.serving.adapters import AdapterSlots, SlotsFullError
from reef.serving.routing import Route, Routes

log = logging.getLogger("reef.registry")

# Content without a gate result (the base model) is checked against its own earlier reply to this.
# Content without a gate result (the base model) is checked against its own earlier reply to this
# neutral probe; a gate result's probe is the first task of the scenario's eval suite.
DEFAULT_PROBE = Probe(messages=[{"role": "user", "content": "Hello."}], max_tokens=8, text="")
PROBES_FILE = "neutral-probes.json"  # replies to DEFAULT_PROBE by content id (probes.json held an older probe's)
# The full weights the engine may hold, written before every reload: an engine that outlives this
# gateway (upstream mode, killed mid-swap) is known to need the base weights back at the next start.
ENGINE_FILE = "engine-weights.json"
DRAIN_TIMEOUT_S = 60.0

Undo = Callable[[], Awaitable[None]]


class SwapFailedError(ReleaseError):
    """The engine refused the content or the canary request failed; nothing was published."""


class EngineConflictError(ReleaseError):
    """Full weights are shared by every scenario on the engine: another scenario needs other ones."""


class Swapper:
    def __init__(self, config: ServeConfig, store: ArtifactStore, routes: Routes, hold: EngineHold,
                 weights: Weights, slots: AdapterSlots) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.store = store
        self.routes = routes
        self.hold = hold
        self.weights = weights
        self.slots = slots
        self.engine_full: str | None = None  # the full weights the engine holds now
        self._probes_path = DataDir(self.data_dir).releases() / PROBES_FILE
        self._engine_path = DataDir(self.data_dir).releases() / ENGINE_FILE
        self._probes: dict[str, str] = {}
        if self._probes_path.is_file():
            self._probes = json.loads(self._probes_path.read_text())

    async def load(self, scenario: str, content_id: str, kind: str) -> tuple[str, Undo]:
        """Put `content_id` into the engine and prove it serves; (model name, undo). Leaves the
        hold closed after a full-weight swap: the caller opens it once the route is switched."""
        probe = self.probe_for(content_id)
        try:
            if kind == "lora":
                return await self._load_lora(content_id, probe)
            if kind == "full":
                return await self._load_full(scenario, content_id, probe)
        except SlotsFullError as exc:
            raise EngineConflictError(str(exc)) from exc
        except (ArtifactError, EngineWeightsError) as exc:
            raise SwapFailedError(str(exc)) from exc
        raise SwapFailedError(f"a {kind} artifact cannot be served by the engine")

    async def _load_lora(self, content_id: str, probe: Probe | None) -> tuple[str, Undo]:
        manifest = self.store.get(content_id)
        if base_of(self.store, manifest).content_id != self.engine_full:
            raise EngineConflictError(f"LoRA {content_id[:12]} runs on other weights than the engine holds")
        name = self.slots.name(content_id)
        fresh = name is None
        if name is None:
            path = await asyncio.to_thread(self.store.verify, content_id)
            name = await self.slots.load(content_id, path)

        async def undo() -> None:
            if fresh:
                await self.slots.unload(content_id)

        try:
            await self.verify(name, content_id, probe)
        except BaseException:
            await undo()
            raise
        return name, undo

    async def _load_full(self, scenario: str, content_id: str, probe: Probe | None) -> tuple[str, Undo]:
        model = self.config.model_name
        previous = self.engine_full

        async def nothing() -> None:
            self.hold.open()

        if content_id == previous:
            await self.verify(model, content_id, probe)
            return model, nothing
        for other, route in self.routes.serving().items():
            needs = self.full_needed_by(route)
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
                await self.weights.reload_full(back)
                self.engine_full = previous
                await asyncio.to_thread(self.mark_engine, previous)
            finally:
                self.hold.open()

        try:
            await asyncio.to_thread(self.mark_engine, content_id)
            await self.weights.reload_full(path)
            self.engine_full = content_id
            await self.verify(model, content_id, probe)
        except BaseException:
            await undo()
            raise
        return model, undo

    def mark_engine(self, content_id: str) -> None:
        """Durably note that the engine holds (or is being given) these full weights."""
        self._engine_path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(self._engine_path, json.dumps({"content_id": content_id}).encode())

    def marked_engine(self) -> str | None:
        """The full weights the engine held, or was being given, when this data dir last swapped."""
        try:
            return json.loads(self._engine_path.read_text())["content_id"]
        except (OSError, ValueError, KeyError):
            return None

    def full_needed_by(self, route: Route) -> str | None:
        if route.kind == "lora" and route.content_id:
            return base_of(self.store, self.store.get(route.content_id)).content_id
        return route.content_id or self.routes.base_content_id

    async def verify(self, model: str, content_id: str, probe: Probe | None, on: Weights | None = None) -> None:
        """The canary request: the engine answers as this content must (see the module docstring);
        with several replicas, each of them does (`on`: one replica, being brought in step)."""
        check = probe or DEFAULT_PROBE
        try:
            answers = await (on or self.weights).answers(model, check.messages, check.max_tokens)
        except EngineWeightsError as exc:
            raise SwapFailedError(str(exc)) from exc
        expected = probe.text if probe is not None else self._probes.get(content_id)
        if expected is None:
            expected = self._probes[content_id] = answers[0][1]
            await asyncio.to_thread(self._save_probes)
        for replica, text in answers:
            if self.config.release.verify == "tokens" and text != expected:
                where = f"replica {replica}: " if replica else ""
                raise SwapFailedError(f"canary request: {where}{model} answered {text!r}, but content "
                                      f"{content_id[:12]} answers {expected!r}: the engine is not serving it")

    def probe_for(self, content_id: str) -> Probe | None:
        """The gate's canary request for this content; None: the neutral probe."""
        url = self.config.state.url
        for scenario in CandidateRegistry.scenarios(self.data_dir, url):
            try:
                view = CandidateRegistry(self.data_dir, scenario, url=url).get(content_id)
            except CandidateNotFoundError:
                continue
            if view.gate is not None and view.gate.probe is not None:
                return view.gate.probe
        return None

    def _save_probes(self) -> None:
        self._probes_path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(self._probes_path, json.dumps(self._probes, indent=1).encode())
