"""`EngineHold` holds new requests back while the engine's full weights are being replaced, so no
request runs on half-swapped weights or is recorded under the wrong release."""

from __future__ import annotations

import asyncio


class EngineHold:
    """Counts the requests using the engine; closed while full weights are swapped.

    `enter()` waits while closed; `close()` stops new entries and `drain()` waits until every
    request that entered has left, so the swap happens with nothing running and every request is
    recorded under the release whose weights answered it."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self) -> None:
        while not self._open.is_set():
            await self._open.wait()
        self._active += 1
        self._idle.clear()

    def exit(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    @property
    def active(self) -> int:
        return self._active

    def close(self) -> None:
        self._open.clear()

    async def drain(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    def open(self) -> None:
        self._open.set()
