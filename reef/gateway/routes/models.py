"""`GET /v1/models`: the model server's list, as clients of vLLM expect it, without the adapters
Reef loads for releases: clients name the served model, and the route decides what answers."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway import auth
from reef.gateway.state import get_state
from reef.gateway.wire.contract import DATA_PLANE, errors
from reef.registry.schema import ADAPTER_PREFIX

router = APIRouter()


@router.get("/v1/models", operation_id="list_models", response_class=Response,
            responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}},
                       **errors(401, 403, 502, 503)}, openapi_extra=DATA_PLANE)
async def models(request: Request) -> Response:
    st = get_state(request)
    auth.data_key(st.config, request, None)
    status, content = await st.upstream.get("/v1/models")
    if status == 200:
        listing = orjson.loads(content)
        listing["data"] = [m for m in listing.get("data", []) if not str(m.get("id", "")).startswith(ADAPTER_PREFIX)]
        content = orjson.dumps(listing)
    return Response(content, status_code=status, media_type="application/json")
