"""Infrastructure faults during a gate: what counts as one, and retrying a sample within a budget.

A fault says nothing about the candidate: a timeout, a dropped connection, a 5xx from the engine
(an engine core that died, an overloaded server). A sample that still faults after its retries
is *void*: its task is left out of both arms, never scored 0, because a 0 would turn the engine's
bad minute into a judgement of the weights. A 4xx is the request's own problem (a prompt longer
than the context): retrying cannot help and it stays an error, which rejects (fail closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx

from reef.core.chat import ChatError

T = TypeVar("T")
# 408 and 429 are the server's state (a slow or busy engine), not the request's.
_RETRYABLE_STATUS = frozenset({408, 429})


@dataclass(frozen=True)
class Void:
    """A sample given up on: the fault it last hit and how many attempts it had."""

    fault: str
    attempts: int


class GateFaultError(RuntimeError):
    """The engine faulted outside any one task (e.g. the probe) past its retries: nothing to judge."""


def fault_of(exc: BaseException) -> str | None:
    """A short name of the infrastructure fault behind `exc` (e.g. `ReadTimeout`, `HTTP 503`), or
    None when `exc` is not one. The engine path wraps what went wrong (GateEngineError from an
    httpx error or a ChatError), so the explicit cause chain (`raise ... from`) is looked at; not
    the implicit context, or an error raised while handling a fault would pass for one."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, httpx.TransportError):  # timeouts, refused/reset connections, protocol errors
            return type(current).__name__
        if isinstance(current, ChatError) and current.problem is None and (
                current.status >= 500 or current.status in _RETRYABLE_STATUS):
            return f"HTTP {current.status}"
        if isinstance(current, (TimeoutError, ConnectionError)):
            return type(current).__name__
        current = current.__cause__
    return None


def is_fault(exc: BaseException) -> bool:
    return fault_of(exc) is not None


async def with_retries(attempt: Callable[[], Awaitable[T]], retries: int, backoff_s: float) -> T | Void:
    """`attempt()`, again up to `retries` times while it faults, waiting `backoff_s`, then twice
    that, between tries (an engine that is restarting or shedding load gets a moment); a Void when
    every try faulted. Anything that is not a fault is raised at once."""
    for k in range(retries + 1):
        try:
            return await attempt()
        except Exception as exc:  # noqa: BLE001 - sorted into faults and errors right here
            fault = fault_of(exc)
            if fault is None:
                raise
            if k == retries:
                return Void(fault, k + 1)
        if backoff_s > 0:
            await asyncio.sleep(backoff_s * 2**k)
    raise AssertionError("unreachable: the last try returns or raises")
