"""The served harness: applied to chat requests (`harness.inject`) and fetched by clients.

    GET /reef/harness?scenario=S[&release_id=R]   the manifest and every file of R's harness (default: the head's)

Server-side injection uses the route a request picked, so a request runs on one release's weights
and harness together, and its record says which harness (`harness_id`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from reef.core.paths import DataDir
from reef.gateway.state import GatewayState, get_state
from reef.gateway.wire.contract import errors
from reef.gateway.wire.errors import ReefError
from reef.registry.artifacts import ArtifactError, ArtifactStore
from reef.registry.chain import CHAIN_FILE, ReleaseNotFoundError
from reef.registry.harness import Harness, inject, load_harness
from reef.registry.schema import SCENARIO_RE, Release

router = APIRouter()


def _store(st: GatewayState) -> ArtifactStore:
    return st.publisher.store if st.publisher is not None else ArtifactStore.for_data_dir(st.config.data_dir)


def _harness(st: GatewayState, harness_id: str) -> Harness:
    try:
        return load_harness(_store(st), harness_id)
    except ArtifactError as exc:  # a corrupt or missing harness never serves silently as "none"
        raise ReefError(503, f"harness {harness_id[:12]} cannot be served: {exc}", code="harness_unavailable") from exc


def served_body(st: GatewayState, scenario: str, harness_id: str | None,
                body: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(the harness applied, the body sent upstream): the client's body when the scenario injects nothing."""
    if harness_id is None:
        return None, body
    mode = st.config.scenario(scenario).harness.inject
    if mode == "off":
        return None, body
    return harness_id, {**body, "messages": inject(body["messages"], _harness(st, harness_id), mode)}


def _release(st: GatewayState, scenario: str, release_id: str | None) -> Release | None:
    """The release (default: the head); None for a scenario nobody released to (its r0 is the base,
    with no harness): a GET never creates a chain."""
    if st.publisher is None or st.publisher.disabled:
        raise ReefError(503, "releases are not available on this server", code="releases_unavailable")
    if not (DataDir(st.config.data_dir).releases(scenario) / CHAIN_FILE).is_file():
        if release_id in (None, f"{scenario}@r0"):
            return None
        raise ReefError(404, f"no release {release_id} in scenario {scenario}", param="release_id", code="not_found")
    chain = st.publisher.chain(scenario)
    try:
        return chain.get(release_id) if release_id else chain.head()
    except ReleaseNotFoundError as exc:
        raise ReefError(404, str(exc), param="release_id", code="not_found") from exc


def current_harness(st: GatewayState, scenario: str) -> tuple[str, dict[str, str]]:
    """(the head release, its harness files): what an agent installed now should be sent with."""
    head = _release(st, scenario, None) if st.publisher is not None and not st.publisher.disabled else None
    if head is None:
        return f"{scenario}@r0", {}
    return head.release_id, _harness(st, head.harness_id).files if head.harness_id else {}


@router.get("/reef/harness", responses=errors(404, 422, 503))
async def get_harness(request: Request, scenario: str = Query(pattern=SCENARIO_RE.pattern),
                      release_id: str | None = None) -> dict[str, Any]:
    st = get_state(request)
    release = _release(st, scenario, release_id)
    out: dict[str, Any] = {"scenario": scenario, "release_id": release.release_id if release else f"{scenario}@r0",
                           "harness_id": release.harness_id if release else None,
                           "inject": st.config.scenario(scenario).harness.inject, "manifest": None, "files": {},
                           "system_prompt": ""}
    if release is not None and release.harness_id is not None:
        harness = _harness(st, release.harness_id)
        out.update(manifest=_store(st).get(release.harness_id).model_dump(mode="json"), files=harness.files,
                   system_prompt=harness.system_prompt())
    return out
