"""`GET /v1/models`: the model server's list, as clients of vLLM expect it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway.state import get_state

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> Response:
    upstream = await get_state(request).upstream.get("/v1/models")
    return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")
