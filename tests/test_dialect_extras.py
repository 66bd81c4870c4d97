"""vLLM's request extensions in a Responses or Messages body (an SDK's `extra_body`) reach the chat
body the engine gets, as the chat route passes them on; other unknown fields do not."""

from __future__ import annotations

import orjson
import pytest

from reef.gateway.wire import messages, responses

pytestmark = pytest.mark.model_free

_EXTRAS = {"ignore_eos": True, "min_tokens": 2, "seed": 7, "stream_interval": 4, "some_other_field": 1}


def test_responses_pass_vllms_extensions_on() -> None:
    req = responses.parse(orjson.dumps({"model": "m", "input": "hi", "stream": True, **_EXTRAS}))
    body = responses.to_chat(req, "m")
    assert {k: body[k] for k in ("ignore_eos", "min_tokens", "seed", "stream_interval")} == {
        "ignore_eos": True, "min_tokens": 2, "seed": 7, "stream_interval": 4}
    assert "some_other_field" not in body and body["stream"] is True


def test_messages_pass_vllms_extensions_on() -> None:
    req = messages.parse(orjson.dumps({"model": "m", "max_tokens": 8, "stream": True,
                                       "messages": [{"role": "user", "content": "hi"}], **_EXTRAS}))
    body = messages.to_chat(req, "m")
    assert {k: body[k] for k in ("ignore_eos", "min_tokens", "seed", "stream_interval")} == {
        "ignore_eos": True, "min_tokens": 2, "seed": 7, "stream_interval": 4}
    assert "some_other_field" not in body and body["stream"] is True
