"""Candidates and releases over HTTP: list them, release, roll back, reject, canary.

Admin operations need `Authorization: Bearer <admin_token>` (serve.yaml or REEF_ADMIN_TOKEN).
Every release and rollback names the head it expects to replace: a stale or concurrent caller
gets 409 and nothing changes. The contract is docs/release-api.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from reef.core.pg import StateUnavailableError
from reef.gateway import auth
from reef.gateway.state import GatewayState, get_state
from reef.gateway.wire.contract import ADMIN, errors
from reef.gateway.wire.errors import ReefError
from reef.registry.artifacts import ArtifactError
from reef.registry.candidates import (
    CandidateError,
    CandidateNotFoundError,
    CandidateRegistry,
    CandidateView,
    find_candidate,
)
from reef.registry.chain import HeadMovedError, NotSelectedError, ReleaseError, ReleaseNotFoundError, StaleGateError
from reef.registry.schema import SCENARIO_RE, Release
from reef.serving.publisher import Publisher
from reef.serving.swap import EngineConflictError, SwapFailedError

router = APIRouter()
_ADMIN_SWAP_ERRORS = errors(400, 401, 403, 404, 409, 422, 502, 503)


class ReleaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidate: str = Field(min_length=8, description="a weights or harness candidate")
    expected_parent: str
    approved_by: str | None = None
    harness: str | None = Field(default=None, min_length=8,
                                description="a harness candidate released together with `candidate` (composite)")


class RollbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    release_id: str
    expected_parent: str
    approved_by: str | None = None


class RejectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1)
    by: str | None = None


class CanaryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidate: str = Field(min_length=8)
    fraction: float | None = Field(default=None, gt=0, lt=1)
    expected_parent: str | None = Field(default=None, description="the head the routing release goes on; "
                                                                  "unset: whatever the head is")
    approved_by: str | None = None


def _admin(request: Request) -> GatewayState:
    st = get_state(request)
    auth.admin(st.config, request)
    return st


def _publisher(st: GatewayState) -> Publisher:
    if st.publisher is None or st.publisher.disabled:
        reason = st.publisher.disabled if st.publisher else "releases are not available on this server"
        raise ReefError(503, str(reason), code="releases_unavailable")
    return st.publisher


def _scenario(scenario: str) -> str:
    if not SCENARIO_RE.match(scenario):
        raise ReefError(404, f"no scenario {scenario!r}", param="scenario", code="not_found")
    return scenario


def _as_http(exc: Exception) -> ReefError:
    if isinstance(exc, HeadMovedError):
        return ReefError(409, f"{exc}; nothing changed. Reload and decide again.", param="expected_parent",
                         code="head_moved")
    if isinstance(exc, StaleGateError):
        return ReefError(409, str(exc), param="candidate", code="gate_stale")
    if isinstance(exc, NotSelectedError):
        return ReefError(409, str(exc), param="candidate", code="not_selected")
    if isinstance(exc, EngineConflictError):
        return ReefError(409, str(exc), code="engine_conflict")
    if isinstance(exc, CandidateNotFoundError | ReleaseNotFoundError):
        return ReefError(404, str(exc), code="not_found")
    if isinstance(exc, StateUnavailableError):  # state.url's PostgreSQL is away: nothing changed
        return ReefError(503, f"{exc}; the current release keeps serving", code="state_unavailable")
    if isinstance(exc, SwapFailedError):
        return ReefError(502, f"swap failed, the previous release keeps serving: {exc}", code="swap_failed")
    if isinstance(exc, CandidateError | ReleaseError | ArtifactError):
        return ReefError(409, str(exc), code="release_refused")
    raise exc


@router.get("/reef/scenarios/{scenario}/releases", responses=errors(404, 503))
async def list_releases(scenario: str, request: Request) -> dict[str, Any]:
    st = get_state(request)
    publisher = _publisher(st)
    releases = publisher.chain(_scenario(scenario)).releases()
    return {"scenario": scenario, "head": releases[-1].model_dump(mode="json") if releases else None,
            "releases": [r.model_dump(mode="json") for r in releases], "serving": publisher.serving(scenario)}


@router.post("/reef/scenarios/{scenario}/releases", status_code=201, responses=_ADMIN_SWAP_ERRORS, openapi_extra=ADMIN)
async def release(scenario: str, body: ReleaseIn, request: Request) -> dict[str, Any]:
    publisher = _publisher(_admin(request))
    return await _swap(publisher, scenario, publisher.release(_scenario(scenario), body.candidate, body.expected_parent,
                                                              approved_by=body.approved_by or "admin",
                                                              harness=body.harness))


@router.post("/reef/scenarios/{scenario}/rollback", status_code=201, responses=_ADMIN_SWAP_ERRORS, openapi_extra=ADMIN)
async def rollback(scenario: str, body: RollbackIn, request: Request) -> dict[str, Any]:
    publisher = _publisher(_admin(request))
    return await _swap(publisher, scenario, publisher.rollback(_scenario(scenario), body.release_id,
                                                               body.expected_parent,
                                                               approved_by=body.approved_by or "admin"))


async def _swap(publisher: Publisher, scenario: str, operation: Awaitable[tuple[Release, dict[str, Any]]]
                ) -> dict[str, Any]:
    try:
        made, swap = await operation
    except Exception as exc:  # noqa: BLE001 - mapped to a status, or re-raised as a 500
        raise _as_http(exc) from exc
    return {"release": made.model_dump(mode="json"), "serving": publisher.serving(scenario), "swap": swap}


@router.get("/reef/candidates", responses=errors(404, 422, 503))
async def list_candidates(request: Request, scenario: str | None = None) -> dict[str, Any]:
    config = get_state(request).config
    wanted = [_scenario(scenario)] if scenario else None

    def read() -> list[CandidateView]:  # files or the state database: off the event loop
        scenarios = wanted or CandidateRegistry.scenarios(config.data_dir, config.state.url)
        return [v for s in scenarios for v in CandidateRegistry(config.data_dir, s, url=config.state.url).list()]

    try:
        views = await asyncio.to_thread(read)
    except StateUnavailableError as exc:
        raise _as_http(exc) from exc
    views.sort(key=lambda v: v.created_at, reverse=True)
    return {"candidates": [v.model_dump(mode="json") for v in views]}


@router.get("/reef/candidates/{candidate_id}", responses=errors(404, 503))
async def get_candidate(candidate_id: str, request: Request) -> dict[str, Any]:
    config = get_state(request).config
    try:
        view = await asyncio.to_thread(find_candidate, config.data_dir, candidate_id, url=config.state.url)
    except CandidateNotFoundError as exc:
        raise ReefError(404, str(exc), code="not_found") from exc
    except StateUnavailableError as exc:
        raise _as_http(exc) from exc
    return view.model_dump(mode="json")


@router.post("/reef/candidates/{candidate_id}/reject", responses=errors(400, 401, 403, 404, 409, 422, 503),
             openapi_extra=ADMIN)
async def reject_candidate(candidate_id: str, body: RejectIn, request: Request) -> dict[str, Any]:
    config = _admin(request).config

    def reject() -> CandidateView:
        view = find_candidate(config.data_dir, candidate_id, url=config.state.url)
        return CandidateRegistry(config.data_dir, view.scenario, url=config.state.url).reject(
            view.candidate_id, body.reason, body.by or "admin")

    try:
        rejected = await asyncio.to_thread(reject)
    except Exception as exc:  # noqa: BLE001
        raise _as_http(exc) from exc
    return rejected.model_dump(mode="json")


@router.post("/reef/scenarios/{scenario}/canary", status_code=201, responses=_ADMIN_SWAP_ERRORS, openapi_extra=ADMIN)
async def start_canary(scenario: str, body: CanaryIn, request: Request) -> dict[str, Any]:
    st = _admin(request)
    try:
        canary = await _publisher(st).canary.start(_scenario(scenario), body.candidate, body.fraction,
                                                   body.expected_parent, body.approved_by)
    except Exception as exc:  # noqa: BLE001
        raise _as_http(exc) from exc
    return canary.public()


@router.delete("/reef/scenarios/{scenario}/canary", responses=_ADMIN_SWAP_ERRORS, openapi_extra=ADMIN)
async def stop_canary(scenario: str, request: Request) -> dict[str, Any]:
    st = _admin(request)
    try:
        canary = await _publisher(st).canary.stop(_scenario(scenario))
    except Exception as exc:  # noqa: BLE001
        raise _as_http(exc) from exc
    if canary is None:
        raise ReefError(404, f"no canary runs for {scenario}", code="not_found")
    return canary.public()


@router.get("/reef/scenarios/{scenario}/canary", responses=errors(404))
async def get_canary(scenario: str, request: Request) -> dict[str, Any]:
    found = get_state(request).canaries.describe(_scenario(scenario))
    if found is None:
        raise ReefError(404, f"no canary for {scenario}", code="not_found")
    return found
