"""Loaded by schemathesis (SCHEMATHESIS_HOOKS) in tests/test_fuzz.py.

`positive_data_acceptance` is off for the chat route and this check takes its place, stricter
where it can be: Reef itself must accept every chat body its schema allows; only the model server
may refuse one, for limits no static schema holds (context length, a model without tool parsing),
and such an answer says so (`x-reef-error-source: upstream`).
"""

from __future__ import annotations

import schemathesis

CHAT = "POST /v1/chat/completions"


@schemathesis.check
def chat_accepted_unless_engine_refused(ctx, response, case) -> bool | None:  # noqa: ANN001
    meta = case.meta
    if case.operation.label != CHAT or meta is None or not meta.generation.mode.is_positive:
        return None
    if type(meta.phase.data).__name__ == "CoveragePhaseData" and getattr(meta.phase.data, "description", "") \
            and "Unspecified HTTP method" in meta.phase.data.description:
        return None
    if response.status_code in (400, 413, 422, 431) and response.headers.get("x-reef-error-source") != ["upstream"]:
        raise AssertionError(f"Reef refused a schema-valid chat body with {response.status_code}: "
                             f"{response.text[:300]}")
    return None
