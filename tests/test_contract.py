"""The gateway's contract at its edges: the issue's malformed bodies, 405 with Allow, size limits,
scenario limits and data-plane API keys, through real `reef serve` processes and the openai SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from reef.scenario import packaged_scenarios
from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway

pytestmark = [pytest.mark.model_free, pytest.mark.any_model, pytest.mark.start_early(17)]

HELLO = [{"role": "user", "content": "What is 2 + 3?"}]
ALPHA_KEY = "key-alpha-only-1"
ANY_KEY = "key-any-scenario-2"
ADMIN = "contract-admin-token"


@pytest.mark.parametrize(("body", "param"), [
    ({"model": 7, "messages": HELLO}, "model"),
    ({"messages": HELLO, "stream": True, "stream_options": "usage please"}, "stream_options"),
    ({"messages": [{"role": "tool", "content": {"value": 3}, "tool_call_id": "c1"}]}, "messages.0.content"),
    ({"messages": [{"role": "tool", "content": "3"}]}, "messages.0.tool_call_id"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": HELLO, "n": "2"}, "n"),
    ({"messages": HELLO, "n": True}, "n"),
    ({"messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"messages": HELLO, "logprobs": "yes"}, "logprobs"),
    ({"messages": HELLO, "max_tokens": 2.5}, "max_tokens"),
    ({"messages": HELLO, "tools": {"type": "function"}}, "tools"),
    ({"messages": HELLO, "tool_choice": "auto"}, None),  # tool_choice without tools
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}, "messages.0.tool_calls.0.function"),
])
def test_client_mistakes_are_400_naming_the_field(gateway: Gateway, body: dict, param: str | None) -> None:
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert "x-reef-error-source" not in resp.headers, "Reef refused it, not the engine"


def test_valid_openai_shapes_pass_through(gateway: Gateway) -> None:
    """Content-part arrays, tool calls and tool results, and fields Reef does not know reach the engine."""
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "content": "5", "tool_call_id": "c1"},
    ]
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60, json={
        "model": MODEL_NAME, "messages": messages, "max_tokens": 2.0, "seed": 3, "n": 1.0,
        "vendor_extension": {"anything": [1, 2]}})
    assert resp.status_code == 200, resp.text
    record = httpx.get(f"{gateway.url}/reef/records/{resp.headers['x-reef-agent-record-id']}").json()
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant", "tool"]
    assert json.loads(record["params_json"])["vendor_extension"] == {"anything": [1, 2]}


def test_engine_refusals_say_so(gateway: Gateway) -> None:
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 10**6})
    assert resp.status_code == 400
    assert resp.headers["x-reef-error-source"] == "upstream"


def test_405_names_every_method(gateway: Gateway) -> None:
    resp = httpx.put(f"{gateway.url}/reef/scenarios/default/releases")
    assert resp.status_code == 405
    assert set(resp.headers["allow"].split(", ")) >= {"GET", "POST"}
    assert resp.json()["error"]["message"]


def test_openapi_documents_the_chat_body_and_errors(gateway: Gateway) -> None:
    doc = httpx.get(f"{gateway.url}/reef/openapi.json").json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert {"400", "404", "409", "413", "431", "502", "503"} <= set(chat["responses"])
    request = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert request["additionalProperties"] is True and "messages" in request["required"]
    assert "HTTPValidationError" not in json.dumps(doc), "every 422 is documented with Reef's own error body"


@pytest.fixture(scope="module")
def guarded(vllm_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    keys = [{"key": ALPHA_KEY, "name": "alpha team", "scenarios": ["alpha"]}, {"key": ANY_KEY}]
    gw = Gateway(tmp_path_factory.mktemp("guarded"), vllm_url, env={
        "REEF_API_KEYS": json.dumps(keys), "REEF_ADMIN_TOKEN": ADMIN,
        "REEF_LIMITS__MAX_BODY_BYTES": "4096", "REEF_LIMITS__MAX_HEADER_BYTES": "2048",
    }).start()
    yield gw
    gw.stop()


def _client(gw: Gateway, key: str, scenario: str = "default") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0,
                         default_headers={"x-reef-scenario": scenario})


def test_api_keys(guarded: Gateway) -> None:
    missing = httpx.get(f"{guarded.url}/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(openai.AuthenticationError) as wrong:
        _client(guarded, "not-a-key-at-all").chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=1)
    assert wrong.value.body["code"] == "invalid_api_key" and wrong.value.body["type"] == "authentication_error"
    with pytest.raises(openai.PermissionDeniedError) as other:
        _client(guarded, ALPHA_KEY, "beta").chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=1)
    assert other.value.body["code"] == "scenario_not_allowed"

    raw = _client(guarded, ALPHA_KEY, "alpha").chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=2)
    record_id = raw.headers["x-reef-agent-record-id"]
    report = {"agent_record_id": record_id, "score": 1.0}
    unkeyed = httpx.post(f"{guarded.url}/reef/report", json=report, headers={"x-reef-scenario": "alpha"})
    assert unkeyed.status_code == 401
    # The key is checked before the body: a bad body without a key is still a 401.
    assert httpx.post(f"{guarded.url}/reef/report", json={"score": "x"}).status_code == 401
    ok = httpx.post(f"{guarded.url}/reef/report", json=report,
                    headers={"x-reef-scenario": "alpha", "authorization": f"Bearer {ALPHA_KEY}"})
    assert ok.status_code == 200, ok.text
    # Records: visible to a key of their scenario, and to keys for every scenario; the admin token works too.
    for key in (ALPHA_KEY, ANY_KEY, ADMIN):
        assert httpx.get(f"{guarded.url}/reef/records/{record_id}",
                         headers={"authorization": f"Bearer {key}"}).status_code == 200
    assert httpx.get(f"{guarded.url}/reef/records/{record_id}").status_code == 401
    # Health stays open for probes.
    assert httpx.get(f"{guarded.url}/healthz").status_code == 200
    doc = httpx.get(f"{guarded.url}/reef/openapi.json").json()
    assert doc["paths"]["/v1/chat/completions"]["post"]["security"] == [{"apiKey": []}]


def test_body_and_header_limits(guarded: Gateway) -> None:
    auth = {"authorization": f"Bearer {ANY_KEY}"}
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    resp = httpx.post(f"{guarded.url}/v1/chat/completions", json=big, headers=auth)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    resp = httpx.post(f"{guarded.url}/v1/chat/completions", content=chunks(), headers=auth)
    assert resp.status_code == 413, resp.text
    resp = httpx.post(f"{guarded.url}/reef/report", content=chunks(), headers=auth)
    assert resp.status_code == 413, resp.text
    resp = httpx.get(f"{guarded.url}/reef/status", headers={"x-padding": "p" * 3000})
    assert resp.status_code == 431 and resp.json()["error"]["code"] == "headers_too_large"


def test_scenario_limit(make_gateway) -> None:  # noqa: ANN001
    # Known from the start: default and the packaged scenarios; one slot is left.
    known = {"default", *packaged_scenarios()}
    gw = make_gateway("limited", env={"REEF_LIMITS__MAX_SCENARIOS": str(len(known) + 1)}).start()
    codes = {}
    for name in ("lim-1", "lim-2", "lim-1", "default"):
        resp = httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1}, timeout=60,
                          headers={"x-reef-scenario": name})
        codes.setdefault(name, []).append(resp.status_code)
        if resp.status_code == 403:
            error = resp.json()["error"]
            assert error["code"] == "max_scenarios_reached" and "limits.max_scenarios" in error["message"]
    assert codes == {"lim-1": [200, 200], "lim-2": [403], "default": [200]}


def test_new_scenarios_off(make_gateway) -> None:  # noqa: ANN001
    gw = make_gateway("closed", env={"REEF_LIMITS__ALLOW_NEW_SCENARIOS": "false"}).start()
    ok = httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1}, timeout=60)
    assert ok.status_code == 200, ok.text  # default, and the packaged demo scenario, are known
    packaged = httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1}, timeout=60,
                          headers={"x-reef-scenario": "demo-add"})
    assert packaged.status_code == 200, packaged.text
    new = httpx.post(f"{gw.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1},
                     headers={"x-reef-scenario": "brand-new"})
    assert new.status_code == 403
    assert new.json()["error"]["code"] == "new_scenarios_disabled"
    assert "allow_new_scenarios" in new.json()["error"]["message"]
