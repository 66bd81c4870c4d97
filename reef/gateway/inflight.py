"""Record ids being served right now, so retries and reports can wait for them to be durable."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(slots=True)
class Pending:
    scenario: str
    body_hash: str
    # Made by the first waiter: most calls have none, and a future per call was a measurable share of
    # the gateway's CPU.
    durable: asyncio.Future[bool] | None = None


class InFlight:
    """Lives on the event loop thread only; no locking needed."""

    def __init__(self) -> None:
        self._pending: dict[str, Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def get(self, record_id: str) -> Pending | None:
        return self._pending.get(record_id)

    def begin(self, record_id: str, scenario: str, body_hash: str) -> Pending:
        pending = Pending(scenario, body_hash)
        self._pending[record_id] = pending
        return pending

    def finish(self, record_id: str, durable: bool) -> None:
        pending = self._pending.pop(record_id, None)
        if pending is not None and pending.durable is not None and not pending.durable.done():
            pending.durable.set_result(durable)

    async def wait(self, record_id: str, timeout_s: float) -> bool | None:
        """True once durable, False if it failed, None if it did not finish in time (or is unknown)."""
        pending = self._pending.get(record_id)
        if pending is None:
            return None
        if pending.durable is None:
            pending.durable = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(asyncio.shield(pending.durable), timeout_s)
        except TimeoutError:
            return None
