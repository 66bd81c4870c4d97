"""Adapter slots: which LoRA release adapters this server has loaded into the engine.

At most `min(release.keep_adapters, engine.max_loras)` stay loaded: what serves, what served just
before (an instant rollback) and canaries. Never more than the engine has slots, or vLLM evicts
and reloads serving adapters batch by batch. A stopping server unloads its adapters, so an engine
shared by several gateways does not accumulate them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from reef.engine.weights import EngineWeightsError, Weights
from reef.registry.chain import ReleaseError
from reef.registry.schema import adapter_name

log = logging.getLogger("reef.registry")


class SlotsFullError(ReleaseError):
    """Every adapter slot holds something that must stay loaded."""


class AdapterSlots:
    def __init__(self, weights: Weights, keep_adapters: int, max_loras: int,
                 keep: Callable[[], set[str]]) -> None:
        self.weights = weights
        self.limit = min(keep_adapters, max_loras)
        self.max_loras = max_loras
        self.keep = keep  # content ids that must stay loaded now (serving, previous, canaries)
        self.loaded: dict[str, str] = {}  # content id -> adapter name

    def name(self, content_id: str) -> str | None:
        return self.loaded.get(content_id)

    async def load(self, content_id: str, path: Path) -> str:
        """Load `content_id`'s adapter (verified, from `path`) into a free slot; its adapter name."""
        await self.trim(room_for=1)
        if len(self.loaded) >= self.max_loras:
            raise SlotsFullError(f"all {self.max_loras} adapter slots serve releases, previous releases or "
                                 "canaries; raise engine.max_loras")
        name = adapter_name(content_id)
        await self.weights.load_lora(name, path)
        self.loaded[content_id] = name
        return name

    async def trim(self, room_for: int = 0) -> None:
        """Unload what need not stay beyond the limit, oldest first."""
        keep = self.keep()
        limit = self.limit - room_for
        spare = [c for c in self.loaded if c not in keep]
        for content_id in spare[: max(0, len(self.loaded) - limit)]:
            await self.unload(content_id)

    async def unload(self, content_id: str) -> None:
        name = self.loaded.pop(content_id, None)
        if name is None:
            return
        try:
            await self.weights.unload_lora(name)
        except EngineWeightsError as exc:
            log.warning("could not unload %s: %s", name, exc)

    def forget(self) -> None:
        """The engine restarted empty: nothing is loaded any more."""
        self.loaded.clear()

    async def close(self) -> None:
        for content_id in list(self.loaded):
            await self.unload(content_id)
