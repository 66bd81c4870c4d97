"""The served harness: which harness a request runs with, applied to its body (`harness.inject`).

Server-side injection uses the route a request picked, so a request runs on one release's weights
and harness together, and its record says which harness (`harness_id`). The route that lets
clients fetch a harness is `reef.gateway.routes.harness`.
"""

from __future__ import annotations

from typing import Any

from reef.gateway.state import GatewayState
from reef.gateway.wire.errors import ReefError
from reef.registry.artifacts import ArtifactError, ArtifactStore
from reef.registry.chain import ReleaseNotFoundError
from reef.registry.harness import Harness, inject, load_harness
from reef.registry.schema import Release


def artifact_store(st: GatewayState) -> ArtifactStore:
    return st.publisher.store if st.publisher is not None else ArtifactStore.for_data_dir(st.config.data_dir)


def load(st: GatewayState, harness_id: str) -> Harness:
    try:
        return load_harness(artifact_store(st), harness_id)
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
    return harness_id, {**body, "messages": inject(body["messages"], load(st, harness_id), mode)}


def release(st: GatewayState, scenario: str, release_id: str | None) -> Release | None:
    """The release (default: the head); None for a scenario nobody released to (its r0 is the base,
    with no harness): a GET never creates a chain."""
    if st.publisher is None or st.publisher.disabled:
        raise ReefError(503, "releases are not available on this server", code="releases_unavailable")
    if not st.publisher.state.has_chain(scenario):
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
    head = release(st, scenario, None) if st.publisher is not None and not st.publisher.disabled else None
    if head is None:
        return f"{scenario}@r0", {}
    return head.release_id, load(st, head.harness_id).files if head.harness_id else {}
