"""`GET /reef/records/{id}`: one stored record, as its parquet row."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from reef.gateway import headers as h
from reef.gateway.errors import ReefError
from reef.gateway.state import get_state

router = APIRouter()


@router.get("/reef/records/{record_id}")
async def get_record(record_id: str, request: Request) -> dict[str, Any]:
    st = get_state(request)
    h.valid_id(record_id, "record_id")
    if st.inflight.get(record_id) is not None:
        await st.inflight.wait(record_id, st.config.report_wait_s)
    record = st.store.get_record(record_id)
    if record is None:
        raise ReefError(404, f"no record {record_id}", param="record_id", code="record_not_found")
    return record.model_dump(mode="json", by_alias=True)
