"""`GET /v1/models`: the model server's list, as clients of vLLM expect it, without the adapters
Reef loads for releases: clients name the served model, and the route decides what answers."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway.state import get_state
from reef.release.schema import ADAPTER_PREFIX

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> Response:
    status, content = await get_state(request).upstream.get("/v1/models")
    if status == 200:
        listing = orjson.loads(content)
        listing["data"] = [m for m in listing.get("data", []) if not str(m.get("id", "")).startswith(ADAPTER_PREFIX)]
        content = orjson.dumps(listing)
    return Response(content, status_code=status, media_type="application/json")
