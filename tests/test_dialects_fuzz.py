"""Random and near-valid bodies and headers on the dialect routes never get a 5xx or a dropped
connection, and every refusal is in the dialect's own error shape. (schemathesis covers the same
routes from the OpenAPI document in tests/test_fuzz.py.)"""

from __future__ import annotations

from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import MODEL_NAME
from tests.helpers.fuzz import HEADERS as _HEADERS
from tests.helpers.fuzz import JSON as _JSON
from tests.helpers.gateway import Gateway

_TEXT = st.text(max_size=12)
_RESPONSES_ITEM = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"]) | _JSON,
    "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | _JSON,
    "content": _TEXT | st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "output_text", "input_image", "x"])},
        optional={"text": _JSON | _TEXT, "image_url": _JSON}), max_size=2) | _JSON,
    "call_id": _TEXT | _JSON, "name": _TEXT | _JSON, "arguments": _TEXT | _JSON, "output": _TEXT | _JSON,
})
_RESPONSES = st.fixed_dictionaries({"max_output_tokens": st.just(1)}, optional={
    "model": st.just(MODEL_NAME) | _JSON,
    "input": _TEXT | st.lists(_RESPONSES_ITEM, max_size=3) | _JSON,
    "instructions": _TEXT | _JSON, "stream": st.booleans() | _JSON, "store": st.booleans() | _JSON,
    "tools": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search"])},
                                            optional={"name": _TEXT | _JSON, "parameters": _JSON}), max_size=2) | _JSON,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | _JSON,
    "temperature": _JSON, "previous_response_id": _JSON, "reasoning": _JSON, "text": _JSON,
})
_BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking", "x"])},
                               optional={"text": _TEXT | _JSON, "id": _TEXT | _JSON, "name": _TEXT | _JSON,
                                         "input": _JSON, "tool_use_id": _TEXT | _JSON, "content": _TEXT | _JSON,
                                         "source": _JSON})
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]) | _JSON},
                                 optional={"content": _TEXT | st.lists(_BLOCK, max_size=2) | _JSON})
_MESSAGES = st.fixed_dictionaries({"max_tokens": st.just(1) | _JSON}, optional={
    "model": st.just(MODEL_NAME) | _JSON,
    "messages": st.lists(_MESSAGE, max_size=3) | _JSON,
    "system": _TEXT | st.lists(_BLOCK, max_size=1) | _JSON, "stream": st.booleans() | _JSON,
    "tools": st.lists(st.fixed_dictionaries({"name": _TEXT | _JSON}, optional={"input_schema": _JSON}),
                      max_size=2) | _JSON,
    "tool_choice": _JSON, "stop_sequences": _JSON, "temperature": _JSON, "top_k": _JSON,
})
# Well-typed bodies that vary only in values, so the fuzz also walks the paths that reach the engine
# (fully random bodies and headers are refused long before it).
_SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_VALID_RESPONSES = st.fixed_dictionaries({"model": st.just(MODEL_NAME), "input": _SAFE_TEXT,
                                          "max_output_tokens": st.just(1)},
                                         optional={"stream": st.booleans(), "instructions": _SAFE_TEXT,
                                                   "temperature": st.floats(0, 2), "store": st.just(False)})
_VALID_MESSAGES = st.fixed_dictionaries(
    {"model": st.just(MODEL_NAME), "max_tokens": st.just(1),
     "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": _SAFE_TEXT}),
                          min_size=1, max_size=2)},
    optional={"stream": st.booleans(), "system": _SAFE_TEXT, "temperature": st.floats(0, 1)})
_ROUTES = {"/v1/responses": (_VALID_RESPONSES, _RESPONSES), "/v1/messages": (_VALID_MESSAGES, _MESSAGES),
           "/v1/messages/count_tokens": (_VALID_MESSAGES, _MESSAGES)}
_REQUESTS = st.sampled_from(sorted(_ROUTES)).flatmap(
    lambda path: st.tuples(st.just(path), st.one_of(_ROUTES[path][0], _ROUTES[path][1], _JSON, st.binary(max_size=40)),
                           st.just({}) | _HEADERS))


def test_dialect_routes_never_5xx(gateway: Gateway) -> None:
    sent: dict[int, int] = {}
    with httpx.Client(base_url=gateway.url, timeout=60) as http:

        @settings(max_examples=600, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(_REQUESTS)
        def probe(request: tuple[str, object, dict[str, str]]) -> None:
            path, body, headers = request
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            # httpx.TransportError here is a dropped connection: a failure like any 5xx.
            resp = http.post(path, headers={"content-type": "application/json", **headers}, **kwargs)
            sent[resp.status_code] = sent.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, (path, body, headers, resp.text)
            if resp.status_code >= 400:
                error = resp.json()
                if path.startswith("/v1/messages"):
                    assert error["type"] == "error" and error["error"]["type"], error
                assert error["error"]["message"] and "Traceback" not in resp.text
            elif resp.headers["content-type"].startswith("text/event-stream"):
                assert b"event: " in resp.content

        probe()
    assert sum(sent.values()) >= 600 and sent.get(200, 0) > 0, sent
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


_PATH_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


def test_retrieving_responses_never_5xx(gateway: Gateway) -> None:
    """`GET /v1/responses/{id}`: any id and headers, stored ids among them, answer 200 with the stored
    response or an OpenAI-shaped error, never a 5xx."""
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        stored = http.post("/v1/responses", json={"model": MODEL_NAME, "input": "hi", "max_output_tokens": 1})
        assert stored.status_code == 200, stored.text
        known = stored.json()["id"]
        sent: dict[int, int] = {}

        @settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(st.sampled_from([known, "resp_", "resp_x", known.replace("resp_", "")]) | _PATH_TEXT,
               st.just({}) | _HEADERS)
        def probe(response_id: str, headers: dict[str, str]) -> None:
            resp = http.get("/v1/responses/" + quote(response_id, safe=""), headers=headers)
            sent[resp.status_code] = sent.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, (response_id, headers, resp.text)
            if resp.status_code == 200:
                assert resp.json()["id"] == response_id == known
            elif resp.is_redirect:  # an id ending in "/" (%2F, decoded): Starlette redirects to the path without it
                assert resp.headers["location"]
            else:
                assert resp.json()["error"]["message"] and "Traceback" not in resp.text

        probe()
    assert sent.get(200, 0) > 0 and sent.get(404, 0) > 0, sent
