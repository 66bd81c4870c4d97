"""What the running vLLM serves: load and unload LoRA adapters, reload full weights, and ask it a
greedy question to prove which weights answer.

These are vLLM's own HTTP endpoints (runtime LoRA updating and dev mode, both switched on by
EngineSupervisor): `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, `/pause?mode=wait`,
`/collective_rpc {"method": "reload_weights"}`, `/reset_prefix_cache`, `/resume`. On CPU these
work; `/sleep`, `/wake_up` and the NCCL weight-transfer engine do not (shared/notes/cpu-stack.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import httpx

from reef.core.chat import ChatError, achat, chat_body


class EngineWeightsError(RuntimeError):
    pass


class Weights(Protocol):
    """What releases need of the weights that serve: one engine (EngineWeights), or every replica
    of several as one step (reef.engine.replica_weights.ReplicaWeights)."""

    async def load_lora(self, name: str, path: Path) -> None: ...

    async def unload_lora(self, name: str) -> None: ...

    async def reload_full(self, path: Path) -> None: ...

    async def answers(self, model: str, messages: list[dict[str, Any]],
                      max_tokens: int) -> list[tuple[str | None, str]]: ...

    async def close(self) -> None: ...


class EngineWeights:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s)

    async def close(self) -> None:
        await self.http.aclose()

    async def _post(self, path: str, what: str, **kw: Any) -> httpx.Response:
        try:
            response = await self.http.post(path, **kw)
        except httpx.HTTPError as exc:
            raise EngineWeightsError(f"{what}: {exc!r}") from exc
        if response.status_code >= 400:
            raise EngineWeightsError(f"{what}: HTTP {response.status_code} {response.text[:300]}")
        return response

    async def load_lora(self, name: str, path: Path) -> None:
        """Load an adapter; one already loaded under `name` counts (Reef names adapters by content id,
        so a name found in the engine, e.g. after a gateway restart, holds the same weights)."""
        try:
            await self._post("/v1/load_lora_adapter", f"loading adapter {name}",
                             json={"lora_name": name, "lora_path": str(Path(path).resolve())})
        except EngineWeightsError as exc:
            if "already" not in str(exc):
                raise

    async def unload_lora(self, name: str) -> None:
        await self._post("/v1/unload_lora_adapter", f"unloading adapter {name}", json={"lora_name": name})

    async def reload_full(self, path: Path) -> None:
        """Drain what runs, load the weights in `path` in place, drop cached KV computed with the
        old weights, resume. Callers hold new requests back meanwhile (reef.engine.hold.EngineHold)."""
        await self._post("/pause", "pausing the engine", params={"mode": "wait"})
        try:
            await self._post("/collective_rpc", "reloading weights", json={
                "method": "reload_weights", "kwargs": {"weights_path": str(Path(path).resolve())}})
            reset = await self._post("/reset_prefix_cache", "resetting the prefix cache")
            if not reset.json().get("success", False):
                raise EngineWeightsError("the prefix cache still holds blocks computed with the old weights")
        finally:
            await self._post("/resume", "resuming the engine")

    async def greedy(self, model: str, messages: list[dict[str, Any]], max_tokens: int) -> str:
        """The reply at temperature 0: what a swap's canary request compares."""
        what = f"canary request to {model}"
        try:
            reply = await achat(self.http, chat_body(model, messages, max_tokens=max_tokens, temperature=0.0, seed=0))
        except httpx.HTTPError as exc:
            raise EngineWeightsError(f"{what}: {exc!r}") from exc
        except ChatError as exc:
            problem = "unexpected answer" if exc.problem else f"HTTP {exc.status}"
            raise EngineWeightsError(f"{what}: {problem} {exc.text[:300]}") from exc
        return reply.text

    async def answers(self, model: str, messages: list[dict[str, Any]],
                      max_tokens: int) -> list[tuple[str | None, str]]:
        """[(None, the greedy reply)]: one engine, named by nobody (see `Weights`)."""
        return [(None, await self.greedy(model, messages, max_tokens))]
