"""`GET /reef/records/{id}`: one stored record, as its parquet row."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request

from reef.config import ApiKey
from reef.gateway import auth
from reef.gateway.state import get_state
from reef.gateway.wire.contract import DATA_PLANE, ID_PATTERN, errors
from reef.gateway.wire.errors import ReefError

router = APIRouter()


@router.get("/reef/records/{record_id}", operation_id="get_record", responses=errors(401, 403, 404, 422),
            openapi_extra=DATA_PLANE)
async def get_record(request: Request, record_id: str = Path(pattern=ID_PATTERN)) -> dict[str, Any]:
    # The pattern is checked by FastAPI (422) and documented; never a path outside the store.
    return await _get(request, record_id)


async def _get(request: Request, record_id: str) -> dict[str, Any]:
    st = get_state(request)
    key = auth.data_key(st.config, request, None)
    if st.inflight.get(record_id) is not None:
        await st.inflight.wait(record_id, st.config.report_wait_s)
    await st.store.locate_record(record_id)  # another partition's, flushed since this store last looked
    record = st.store.get_record(record_id)
    if record is None or not _visible(key, record.scenario):
        raise ReefError(404, f"no record {record_id}", param="record_id", code="record_not_found")
    return record.model_dump(mode="json", by_alias=True)


def _visible(key: ApiKey | None, scenario: str) -> bool:
    """A key limited to some scenarios sees other scenarios' records as missing."""
    try:
        auth.allowed(key, scenario)
    except ReefError:
        return False
    return True
