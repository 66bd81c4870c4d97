"""Weights loaded into every replica of several (`upstream.urls`, `engine.replicas`) as one step.

`ReplicaWeights` has `EngineWeights`' calls (the `Weights` protocol the swapper and the adapter
slots use), each applied to every replica in service at once:

- an adapter loads on all of them or on none: one that refuses (or cannot be reached) makes the
  others unload it again, and the error names the replica;
- full weights reload on all of them; a replica whose reload failed holds weights nobody knows, so
  it is taken out of service (the pool brings it back only once it is in step again); the
  swapper's undo reloads the previous weights on the rest;
- a canary request is asked of each, and each answer is checked (reef.serving.swap.Swapper.verify).

A replica out of service (down, or back but not yet in step) gets none of this: it is brought in
step on its own before it serves again (reef.serving.replica_sync). The adapter and weight paths
are the gateway's: every replica must read the same artifact store (the same machine, or the
store's folder mounted at the same path).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from reef.engine.weights import EngineWeights, EngineWeightsError

T = TypeVar("T")


def label(url: str) -> str:
    """A replica's name in records, status, metrics and errors: its URL without credentials."""
    parts = urlsplit(url.rstrip("/"))
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


class ReplicaPool(Protocol):
    """Which replicas serve (reef.gateway.transport.replicas.Replicas)."""

    def in_service(self) -> list[str]: ...

    def take_out(self, url: str, reason: str) -> None: ...


def _named(failed: list[tuple[str, BaseException]]) -> EngineWeightsError:
    return EngineWeightsError("; ".join(f"replica {label(url)}: {exc}" for url, exc in failed))


class ReplicaWeights:
    def __init__(self, urls: Sequence[str], pool: ReplicaPool, api_key: str | None = None,
                 timeout_s: float = 120.0) -> None:
        self.engines = {url: EngineWeights(url, api_key, timeout_s) for url in urls}
        self.pool = pool

    def one(self, url: str) -> EngineWeights:
        """One replica's weights (bringing it in step, on its own)."""
        return self.engines[url]

    async def _each(self, call: Callable[[EngineWeights], Awaitable[T]]) -> tuple[
            list[tuple[str, T]], list[tuple[str, BaseException]]]:
        """`call` on every replica in service at once: (what each that succeeded returned, failures)."""
        urls = self.pool.in_service()
        if not urls:
            raise EngineWeightsError("no replica is in service")
        results = await asyncio.gather(*(call(self.engines[url]) for url in urls), return_exceptions=True)
        done: list[tuple[str, T]] = []
        failed: list[tuple[str, BaseException]] = []
        for url, result in zip(urls, results, strict=True):
            if isinstance(result, EngineWeightsError):
                failed.append((url, result))
            elif isinstance(result, BaseException):
                raise result  # not the engine's answer (a cancellation, a bug): as it is
            else:
                done.append((url, result))
        return done, failed

    async def load_lora(self, name: str, path: Path) -> None:
        """On every replica in service, or (one refused) on none."""
        done, failed = await self._each(lambda engine: engine.load_lora(name, path))
        if failed:
            await asyncio.gather(*(self.engines[url].unload_lora(name) for url, _ in done), return_exceptions=True)
            raise _named(failed)

    async def unload_lora(self, name: str) -> None:
        _, failed = await self._each(lambda engine: engine.unload_lora(name))
        if failed:
            raise _named(failed)

    async def reload_full(self, path: Path) -> None:
        """On every replica in service; one that failed is taken out (its weights are unknown)."""
        _, failed = await self._each(lambda engine: engine.reload_full(path))
        for url, exc in failed:
            self.pool.take_out(url, f"reloading weights failed: {exc}")
        if failed:
            raise _named(failed)

    async def answers(self, model: str, messages: list[dict[str, Any]],
                      max_tokens: int) -> list[tuple[str | None, str]]:
        """Each replica's greedy reply, by replica name."""
        done, failed = await self._each(lambda engine: engine.greedy(model, messages, max_tokens))
        if failed:
            raise _named(failed)
        return [(label(url), text) for url, text in done]

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.close()
