"""`GET /v1/models`: the model server's list, as clients of vLLM expect it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.gateway.state import get_state

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> Response:
    status, content = await get_state(request).upstream.get("/v1/models")
    return Response(content, status_code=status, media_type="application/json")
