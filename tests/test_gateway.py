"""The gateway through the real `openai` SDK, against a real vLLM serving the tiny model."""

from __future__ import annotations

import json
import time

import datasets
import httpx
import openai
import polars as pl
import pytest

from reef.experience.schema import RECORD_FEATURES
from tests.helpers import MODEL_NAME, state_pass
from tests.helpers.gateway import Gateway, get_record, wait_flushed

pytestmark = [pytest.mark.model_free, pytest.mark.any_model, pytest.mark.start_early(13)]

HELLO = [{"role": "user", "content": "What is 2 + 3?"}]


def test_non_streaming_records_tokens_and_hides_them(gateway: Gateway) -> None:
    raw = gateway.client().chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=12, temperature=1.0
    )
    completion = raw.parse()
    record_id = raw.headers["x-reef-agent-record-id"]
    choice = completion.choices[0]
    assert choice.logprobs is None, "logprobs leak to a client that did not ask"
    assert "token_ids" not in (choice.model_extra or {})
    assert "prompt_token_ids" not in (completion.model_extra or {})
    assert completion.model == MODEL_NAME

    rec = get_record(gateway, record_id)
    assert rec["record_id"] == record_id
    assert rec["scenario"] == "default"
    assert rec["release_id"] == "default@r0"
    assert rec["messages"][0]["content"] == "What is 2 + 3?"
    stored = rec["choices"][0]
    assert stored["content"] == choice.message.content
    assert len(stored["token_ids"]) == completion.usage.completion_tokens == rec["gen_ai.usage.output_tokens"]
    assert len(stored["logprobs"]) == len(stored["token_ids"])
    assert all(lp <= 0.0 for lp in stored["logprobs"])
    assert len(rec["prompt_token_ids"]) == completion.usage.prompt_tokens
    assert rec["gen_ai.request.max_tokens"] == 12
    assert rec["gen_ai.response.finish_reasons"] == [choice.finish_reason]
    assert len(rec["content_hash"]) == 64


def test_logprobs_and_token_ids_kept_when_client_asks(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=8, logprobs=True,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None and len(choice.logprobs.content) == completion.usage.completion_tokens
    assert len(choice.model_extra["token_ids"]) == completion.usage.completion_tokens


def test_streaming_receipt_after_durable(gateway: Gateway) -> None:
    client = gateway.client()
    with client.chat.completions.with_streaming_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=16, stream=True
    ) as response:
        header_id = response.headers["x-reef-agent-record-id"]
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    receipts = [c.model_extra.get("agent_record_id") for c in chunks if (c.model_extra or {}).get("agent_record_id")]
    assert receipts == [header_id], "exactly one receipt, the header's id, at the end"
    assert chunks[-1].model_extra["agent_record_id"] == header_id
    assert all(c.usage is None for c in chunks), "usage chunk leaks to a client that did not ask"
    assert all(ch.logprobs is None for c in chunks for ch in c.choices)
    rec = get_record(gateway, header_id)
    assert rec["stream"] is True
    assert rec["choices"][0]["content"] == text
    assert len(rec["choices"][0]["token_ids"]) == len(rec["choices"][0]["logprobs"]) > 0
    assert rec["gen_ai.usage.output_tokens"] == len(rec["choices"][0]["token_ids"])
    assert rec["prompt_token_ids"]
    assert rec["ttft_ms"] is not None


def test_streaming_usage_when_asked(gateway: Gateway) -> None:
    stream = gateway.client().chat.completions.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    usages = [c.usage for c in stream if c.usage is not None]
    assert len(usages) == 1 and usages[0].completion_tokens > 0


def test_n_2_records_both_choices(gateway: Gateway) -> None:
    raw = gateway.client().chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=8, n=2, temperature=1.0
    )
    completion = raw.parse()
    assert len(completion.choices) == 2
    rec = get_record(gateway, raw.headers["x-reef-agent-record-id"])
    assert rec["gen_ai.request.choice.count"] == 2
    assert [c["index"] for c in rec["choices"]] == [0, 1]
    for stored, served in zip(rec["choices"], completion.choices, strict=True):
        assert stored["content"] == served.message.content
        assert len(stored["token_ids"]) == len(stored["logprobs"]) > 0


def test_streaming_n_2(gateway: Gateway) -> None:
    client = gateway.client()
    with client.chat.completions.with_streaming_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=8, n=2, stream=True
    ) as response:
        record_id = response.headers["x-reef-agent-record-id"]
        chunks = list(response.parse())
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    rec = get_record(gateway, record_id)
    assert [c["content"] for c in rec["choices"]] == [texts[0], texts[1]]


def test_tools_pass_through_and_tags(gateway: Gateway) -> None:
    tools = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
                                               "parameters": {"type": "object", "properties": {}}}}]
    raw = gateway.client(**{"x-reef-tag-team": "blue", "x-reef-tag-exp": "7"}).chat.completions \
        .with_raw_response.create(model=MODEL_NAME, messages=HELLO, max_tokens=4, tools=tools, tool_choice="none")
    rec = get_record(gateway, raw.headers["x-reef-agent-record-id"])
    assert json.loads(rec["params_json"])["tools"] == tools
    assert {t["name"]: t["value"] for t in rec["tags"]} == {"team": "blue", "exp": "7"}


def test_three_turns_stitched_into_one_session(gateway: Gateway) -> None:
    client = gateway.client()
    messages = [{"role": "user", "content": "Hello there, what is 1 + 1?"}]
    ids = []
    for turn in range(3):
        raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=messages, max_tokens=8)
        ids.append(raw.headers["x-reef-agent-record-id"])
        reply = raw.parse().choices[0].message
        messages = [*messages, {"role": "assistant", "content": reply.content},
                    {"role": "user", "content": f"turn {turn + 2}, again please"}]
    sessions = {get_record(gateway, i)["gen_ai.conversation.id"] for i in ids}
    assert len(sessions) == 1
    # An unrelated conversation gets a session of its own.
    other = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=HELLO, max_tokens=4)
    assert get_record(gateway, other.headers["x-reef-agent-record-id"])["gen_ai.conversation.id"] not in sessions


def test_session_header_wins(gateway: Gateway) -> None:
    raw = gateway.client(**{"x-reef-session": "my-session-1"}).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=4)
    assert get_record(gateway, raw.headers["x-reef-agent-record-id"])["gen_ai.conversation.id"] == "my-session-1"


def test_idempotent_retry_returns_stored_response(gateway: Gateway) -> None:
    client = gateway.client(**{"x-reef-agent-record-id": "client-chosen-id-1"})
    kwargs = dict(model=MODEL_NAME, messages=HELLO, max_tokens=16, temperature=1.0)
    first = client.chat.completions.with_raw_response.create(**kwargs)
    again = client.chat.completions.with_raw_response.create(**kwargs)
    assert first.headers["x-reef-agent-record-id"] == again.headers["x-reef-agent-record-id"] == "client-chosen-id-1"
    assert again.headers.get("x-reef-replayed") == "true"
    assert again.parse().model_dump() == first.parse().model_dump()
    # As a stream, the retry replays the stored text and the same receipt.
    stream = client.chat.completions.create(**kwargs, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        first.parse().choices[0].message.content
    assert chunks[-1].model_extra["agent_record_id"] == "client-chosen-id-1"
    with pytest.raises(openai.ConflictError) as exc:
        client.chat.completions.create(**{**kwargs, "max_tokens": 5})
    assert exc.value.body["type"] == "conflict_error"
    # A bad session header is refused on a retry too, not answered from the store (schemathesis found it).
    bad = httpx.post(f"{gateway.url}/v1/chat/completions", json=kwargs, timeout=30,
                     headers={"x-reef-agent-record-id": "client-chosen-id-1", "x-reef-session": "no spaces"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-reef-session"


def test_concurrent_retries_call_the_model_once(gateway: Gateway) -> None:
    import concurrent.futures

    client = gateway.client(**{"x-reef-agent-record-id": "client-chosen-id-2"})

    def call() -> str:
        return client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=16,
                                              temperature=1.0).choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: call(), range(4)))
    assert len(set(replies)) == 1


def test_report_round_trip_and_conflicts(gateway: Gateway) -> None:
    raw = gateway.client().chat.completions.with_raw_response.create(model=MODEL_NAME, messages=HELLO, max_tokens=4)
    record_id = raw.headers["x-reef-agent-record-id"]
    body = {"agent_record_id": record_id, "score": 0.75, "feedback": "close", "metadata": {"k": 1},
            "report_id": "rep-roundtrip-1"}
    first = httpx.post(f"{gateway.url}/reef/report", json=body)
    assert first.status_code == 200 and first.json()["duplicate"] is False
    same = httpx.post(f"{gateway.url}/reef/report", json=body)
    assert same.status_code == 200 and same.json()["duplicate"] is True
    other = httpx.post(f"{gateway.url}/reef/report", json={**body, "score": 0.1})
    assert other.status_code == 409 and other.json()["error"]["param"] == "report_id"
    # references: one report for several records
    multi = httpx.post(f"{gateway.url}/reef/report", json={"references": [record_id], "score": 1})
    assert multi.status_code == 200 and multi.json()["agent_record_ids"] == [record_id]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"agent_record_id": "rec_doesnotexist", "score": 1.0}, 404, "agent_record_id"),
        ({"score": 1.0}, 422, None),
        ({"agent_record_id": "x"}, 422, "score"),
        ({"agent_record_id": "x", "score": "high"}, 422, "score"),
        ({"agent_record_id": "x", "score": True}, 422, "score"),
        ({"agent_record_id": "x", "score": 1.0, "bogus": 1}, 422, "bogus"),
        ({"agent_record_id": "x", "score": 1.0, "metadata": [1]}, 422, "metadata"),
    ],
)
def test_report_errors(gateway: Gateway, body: dict, status: int, param: str | None) -> None:
    resp = httpx.post(f"{gateway.url}/reef/report", json=body)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["message"]
    if param:
        assert error["param"] == param


def test_report_non_finite_and_invalid_json(gateway: Gateway) -> None:
    for raw in (b'{"agent_record_id": "x", "score": NaN}', b'{"agent_record_id": "x", "score": Infinity}'):
        resp = httpx.post(f"{gateway.url}/reef/report", content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["param"] == "score"
    resp = httpx.post(f"{gateway.url}/reef/report", content=b"{nope", headers={"content-type": "application/json"})
    assert resp.status_code == 422 and "error" in resp.json()
    # A lone surrogate is valid JSON but no UTF-8: refused, never a 500 (schemathesis found it).
    raw = b'{"agent_record_id": "x", "score": 1, "report_id": "rep_s", "metadata": {"k": "\\ud800"}}'
    resp = httpx.post(f"{gateway.url}/reef/report", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 422 and "UTF-8" in resp.json()["error"]["message"], resp.text


def test_report_for_another_scenario_is_404(gateway: Gateway) -> None:
    raw = gateway.client(**{"x-reef-scenario": "alpha"}).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=4)
    record_id = raw.headers["x-reef-agent-record-id"]
    assert get_record(gateway, record_id)["scenario"] == "alpha"
    wrong = httpx.post(f"{gateway.url}/reef/report", json={"agent_record_id": record_id, "score": 1},
                       headers={"x-reef-scenario": "beta"})
    assert wrong.status_code == 404
    right = httpx.post(f"{gateway.url}/reef/report", json={"agent_record_id": record_id, "score": 1},
                       headers={"x-reef-scenario": "alpha"})
    assert right.status_code == 200


def test_report_waits_for_a_streaming_record(gateway: Gateway) -> None:
    """The header id arrives before the record is durable; a report sent then is not lost."""
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={"model": MODEL_NAME, "messages": HELLO, "max_tokens": 32, "stream": True}) as resp:
            record_id = resp.headers["x-reef-agent-record-id"]
            report = httpx.post(f"{gateway.url}/reef/report", json={"agent_record_id": record_id, "score": 0.5})
            assert report.status_code == 200, report.text
            body = b"".join(resp.iter_bytes())
    assert record_id.encode() in body


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        (b"not json", {}, 400),
        (b"[1, 2]", {}, 400),
        (b'{"model": "reef-tiny"}', {}, 400),
        (b'{"model": "reef-tiny", "messages": []}', {}, 400),
        (b'{"model": "reef-tiny", "messages": [{"content": "hi"}]}', {}, 400),
        (b'{"model": "reef-tiny", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', {}, 400),
        (b'{"model": "reef-tiny", "messages": [{"role": "user", "content": "hi"}]}',
         {"x-reef-scenario": "../etc"}, 400),
        (b'{"model": "reef-tiny", "messages": [{"role": "user", "content": "hi"}]}',
         {"x-reef-agent-record-id": "bad id with spaces"}, 400),
        (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}', {}, 404),
        (b'{"model": "reef-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}', {}, 400),
    ],
)
def test_chat_errors_are_openai_style(gateway: Gateway, content: bytes, headers: dict, status: int) -> None:
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", content=content,
                      headers={"content-type": "application/json", **headers})
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["message"]
    assert "Traceback" not in resp.text


def test_sdk_raises_typed_errors(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError):
        gateway.client().chat.completions.create(model="no-such-model", messages=HELLO)
    with pytest.raises(openai.BadRequestError):
        gateway.client().chat.completions.create(model=MODEL_NAME, messages=[{"role": "user"}], max_tokens=-1)
    missing = httpx.get(f"{gateway.url}/reef/records/rec_missing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_models_status_metrics(gateway: Gateway) -> None:
    assert [m.id for m in gateway.client().models.list().data] == [MODEL_NAME]
    gateway.client().chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2)  # a record of its own
    status = httpx.get(f"{gateway.url}/reef/status").json()
    assert status["engine"]["healthy"] is True
    assert status["scenarios"]["default"]["records"] > 0
    assert status["scenarios"]["default"]["serving_release"] == "default@r0"
    # The state tests' second pass (tests/helpers/state_pass.py) must reach the gateway's process.
    assert status["state"] == {"backend": "postgresql" if state_pass.enabled() else "files"}
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert "reef_records_total" in metrics and "reef_request_latency_seconds_bucket" in metrics


def test_experience_readable_by_datasets_and_polars(gateway: Gateway) -> None:
    client = gateway.client(**{"x-reef-scenario": "readers"})
    ids = {client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=HELLO, max_tokens=4)
           .headers["x-reef-agent-record-id"] for _ in range(3)}
    for record_id in ids:
        httpx.post(f"{gateway.url}/reef/report", json={"agent_record_id": record_id, "score": 1.0},
                   headers={"x-reef-scenario": "readers"}).raise_for_status()
    wait_flushed(gateway)
    root = gateway.data_dir / "experience" / "readers"
    ds = datasets.load_dataset("parquet", data_files=str(root / "records" / "*.parquet"), split="train")
    assert set(ds["record_id"]) == ids
    assert ds.features == RECORD_FEATURES, "shards carry the one declared schema"
    frame = pl.scan_parquet(str(root / "reports" / "*.parquet")).collect()
    assert frame.height == 3 and set(frame["record_ids"].explode().to_list()) == ids

    from reef.experience import load

    joined = load("readers", gateway.data_dir).lazy().collect()
    assert set(joined["record_id"]) == ids and joined["score"].to_list() == [1.0, 1.0, 1.0]
    assert load("readers", gateway.data_dir).to_dataset().num_rows == 3


def test_client_disconnect_mid_stream_still_records(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json={
            # Long enough that the hang-up lands mid-stream on a CPU; a faster machine may finish first,
            # and the record must exist either way.
            "model": MODEL_NAME, "messages": HELLO, "max_tokens": 900, "ignore_eos": True, "stream": True,
        }) as resp:
            record_id = resp.headers["x-reef-agent-record-id"]
            next(resp.iter_bytes())  # one event, then hang up
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = httpx.get(f"{gateway.url}/reef/records/{record_id}")
        if found.status_code == 200:
            break
        time.sleep(0.2)
    assert found.status_code == 200, "what was generated before the hang-up is experience too"
    rec = found.json()
    # The hang-up may come before the first token: then the record holds the prompt and no tokens.
    assert rec["stream"] is True and len(rec["choices"][0]["token_ids"]) <= 900
