"""`reef serve` in front of an OpenAI-compatible server that is not vLLM.

A remote provider cannot run here, so a tiny strict stand-in does: it refuses any field the OpenAI
API does not define (as strict providers do), never returns token ids, and says it is not vLLM on
`GET /v1/models`. Reef must then never send `return_token_ids`, must record the calls with
`has_token_ids: false`, and snapshots must count them as skipped for that reason.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from reef.engine.supervisor import free_port
from reef.experience import load
from reef.recipe.snapshot import ExperienceSpec, select
from reef.serve_process import ServeProcess

pytestmark = [pytest.mark.model_free, pytest.mark.any_model]

OPENAI_FIELDS = {"model", "messages", "stream", "stream_options", "logprobs", "top_logprobs", "max_tokens",
                 "max_completion_tokens", "temperature", "top_p", "n", "tools", "tool_choice", "seed", "stop",
                 "user", "presence_penalty", "frequency_penalty", "response_format"}
REPLY = ["Five", "."]


def _strict_stub(seen: list[dict]) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "stub-provider"}]}

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):  # noqa: ANN202
        body = await request.json()
        seen.append(body)
        unknown = sorted(set(body) - OPENAI_FIELDS)
        if unknown:
            return JSONResponse({"error": {"message": f"Unrecognized request argument supplied: {unknown[0]}",
                                           "type": "invalid_request_error", "param": unknown[0], "code": None}},
                                status_code=400)
        logprobs = {"content": [{"token": t, "logprob": -0.5, "bytes": None, "top_logprobs": []} for t in REPLY]}
        usage = {"prompt_tokens": 7, "completion_tokens": len(REPLY), "total_tokens": 7 + len(REPLY)}
        base = {"id": "chatcmpl-stub", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            return {**base, "object": "chat.completion", "usage": usage, "choices": [{
                "index": 0, "message": {"role": "assistant", "content": "".join(REPLY)}, "finish_reason": "stop",
                "logprobs": logprobs if body.get("logprobs") else None}]}

        def events() -> Iterator[str]:
            for i, token in enumerate(REPLY):
                choice = {"index": 0, "delta": {"content": token}, "finish_reason": "stop" if i else None,
                          "logprobs": {"content": [logprobs["content"][i]]} if body.get("logprobs") else None}
                yield f"data: {json.dumps({**base, 'object': 'chat.completion.chunk', 'choices': [choice]})}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                end = {**base, 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage}
                yield f"data: {json.dumps(end)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[str, list[dict]]]:
    seen: list[dict] = []
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_strict_stub(seen), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}", seen
    server.should_exit = True
    thread.join(10)


def test_strict_provider_gets_no_vllm_fields(stub: tuple[str, list[dict]], tmp_path: Path) -> None:
    url, seen = stub
    gw = ServeProcess(tmp_path, ["--upstream-url", url], {"REEF_STORE__FLUSH_INTERVAL_S": "0.2"}).start()
    try:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0,
                               default_headers={"x-reef-scenario": "remote"})
        raw = client.chat.completions.with_raw_response.create(
            model="stub-model", messages=[{"role": "user", "content": "What is 2 + 3?"}])
        assert raw.parse().choices[0].message.content == "Five."
        assert raw.parse().choices[0].logprobs is None, "logprobs Reef asked for are not shown to the client"
        stream = client.chat.completions.create(model="stub-model", stream=True,
                                                messages=[{"role": "user", "content": "And 3 + 4?"}])
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Five."
        assert seen and all("return_token_ids" not in body for body in seen)
        assert all(body["logprobs"] is True for body in seen), "standard OpenAI fields are still asked for"

        record = httpx.get(f"{gw.url}/reef/records/{raw.headers['x-reef-agent-record-id']}").json()
        assert record["has_token_ids"] is False
        assert record["choices"][0]["token_ids"] == [] and record["choices"][0]["logprobs"] == [-0.5, -0.5]
        for record_id in (raw.headers["x-reef-agent-record-id"], chunks[-1].model_extra["agent_record_id"]):
            httpx.post(f"{gw.url}/reef/report", json={"agent_record_id": record_id, "score": 1.0},
                       headers={"x-reef-scenario": "remote"}).raise_for_status()
        deadline = time.monotonic() + 20
        while httpx.get(f"{gw.url}/reef/status").json()["scenarios"]["remote"]["unflushed_records"]:
            assert time.monotonic() < deadline, "store did not flush"
            time.sleep(0.1)
    finally:
        gw.stop()
    frame = load("remote", gw.data_dir).lazy().collect()
    _, counts = select(frame, ExperienceSpec(scenario="remote"), set())
    assert counts["upstream_without_token_ids"] == 2 and counts["records_seen"] == 2


def test_vllm_upstream_is_probed_as_such(gateway) -> None:  # noqa: ANN001
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="reef-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    record = httpx.get(f"{gateway.url}/reef/records/{raw.headers['x-reef-agent-record-id']}").json()
    assert record["has_token_ids"] is True and record["choices"][0]["token_ids"]
