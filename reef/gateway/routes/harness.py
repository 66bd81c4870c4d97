"""The served harness, fetched by clients (applied to requests by `reef.gateway.harness`).

    GET /reef/harness?scenario=S[&release_id=R]   the manifest and every file of R's harness (default: the head's)
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from reef.gateway import harness
from reef.gateway.state import get_state
from reef.gateway.wire.contract import errors
from reef.registry.schema import SCENARIO_RE

router = APIRouter()


@router.get("/reef/harness", responses=errors(404, 422, 503))
async def get_harness(request: Request, scenario: str = Query(pattern=SCENARIO_RE.pattern),
                      release_id: str | None = None) -> dict[str, Any]:
    st = get_state(request)
    release = harness.release(st, scenario, release_id)
    out: dict[str, Any] = {"scenario": scenario, "release_id": release.release_id if release else f"{scenario}@r0",
                           "harness_id": release.harness_id if release else None,
                           "inject": st.config.scenario(scenario).harness.inject, "manifest": None, "files": {},
                           "system_prompt": ""}
    if release is not None and release.harness_id is not None:
        served = harness.load(st, release.harness_id)
        out.update(manifest=harness.artifact_store(st).get(release.harness_id).model_dump(mode="json"),
                   files=served.files, system_prompt=served.system_prompt())
    return out
