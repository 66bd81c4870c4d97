"""The Responses API's stored responses: `GET /v1/responses/{id}` and `previous_response_id`.

A stored response is its record: every call is recorded, durably, before it is answered (the same
receipt, `x-reef-agent-record-id`), and a Responses call's record keeps what of its request the
chat body does not hold (`reef.gateway.wire.responses.kept`). A response is stored unless its
request said `store: false`, as the OpenAI API's default is; one made with `x-reef-capture: false`
has no record, so it is never stored. Scenarios are isolated: a response is found only from its own.
"""

from __future__ import annotations

from typing import Any

import orjson

from reef.experience.schema import Record
from reef.gateway.state import GatewayState
from reef.gateway.wire import responses as wire
from reef.gateway.wire.completion import read_response


def _kept(record: Record) -> dict[str, Any] | None:
    """What the record kept of its Responses request; None unless it is a stored response."""
    params = orjson.loads(record.params_json)
    request = params.get("reef.request") if params.get("reef.dialect") == "responses" else None
    return request if isinstance(request, dict) and request.get("store") is True else None


async def find(st: GatewayState, response: str, scenario: str) -> tuple[Record, dict[str, Any]] | None:
    """The stored response's record and what it kept of its request; a response still being written
    (a stream in flight) is waited for."""
    for record_id in wire.record_ids(response):
        if st.inflight.get(record_id) is not None:
            await st.inflight.wait(record_id, st.config.request_timeout_s)
        known = await st.store.locate_record(record_id)
        if known is None or known[0] != scenario:
            continue
        record = st.store.get_record(record_id)
        kept = _kept(record) if record is not None else None
        if record is not None and kept is not None and wire.response_id(record.record_id) == response:
            return record, kept
    return None


def context(record: Record, kept: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` continues: the stored input, then the stored output."""
    completion = read_response(record.response_json.encode())
    reply = (completion.choices[0].message if completion.choices else None) or {}
    return wire.continued(orjson.loads(record.request_json), kept, reply)


def as_response(record: Record, kept: dict[str, Any]) -> dict[str, Any]:
    """The stored response as the Responses API answered it."""
    request = wire.stored_request(orjson.loads(record.request_json), kept)
    return wire.from_chat(read_response(record.response_json.encode()), request, record.record_id,
                          record.request_model)
