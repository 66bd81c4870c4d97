"""kill -9 the gateway while 8 clients send requests: every record id a client received is stored."""

from __future__ import annotations

import threading
import time

import httpx
import openai

from tests.conftest import MODEL_NAME, Gateway


def _client_loop(gw: Gateway, worker: int, stop: threading.Event, acknowledged: dict[str, str]) -> None:
    client = gw.client(**{"x-reef-scenario": "crash"})
    i = 0
    while not stop.is_set():
        messages = [{"role": "user", "content": f"What is {worker} + {i % 10}?"}]
        try:
            if i % 2:
                # A stream is acknowledged only by its receipt event, sent once the record is durable.
                text, receipt = "", None
                for chunk in client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16,
                                                            stream=True):
                    if chunk.choices:
                        text += chunk.choices[0].delta.content or ""
                    receipt = (chunk.model_extra or {}).get("agent_record_id") or receipt
                if receipt:
                    acknowledged[receipt] = text
            else:
                raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=messages,
                                                                       max_tokens=16)
                acknowledged[raw.headers["x-reef-agent-record-id"]] = raw.parse().choices[0].message.content
        except (openai.APIError, httpx.HTTPError):
            return  # the gateway is gone
        i += 1


def test_kill_9_loses_no_acknowledged_record(make_gateway) -> None:
    # A long flush interval keeps acknowledged records in the WAL only, the case that matters.
    gw: Gateway = make_gateway("crash", env={"REEF_STORE__FLUSH_INTERVAL_S": "3600"}).start()
    acknowledged: dict[str, str] = {}
    stop = threading.Event()
    workers = [threading.Thread(target=_client_loop, args=(gw, w, stop, acknowledged)) for w in range(8)]
    for t in workers:
        t.start()
    deadline = time.monotonic() + 60
    while len(acknowledged) < 60 and time.monotonic() < deadline:
        time.sleep(0.05)
    gw.kill()
    stop.set()
    for t in workers:
        t.join(timeout=60)
    assert len(acknowledged) >= 20, "too little traffic before the crash to mean anything"

    gw.start()
    with httpx.Client(base_url=gw.url) as http:
        for record_id, text in acknowledged.items():
            resp = http.get(f"/reef/records/{record_id}")
            assert resp.status_code == 200, f"acknowledged record {record_id} lost"
            assert resp.json()["choices"][0]["content"] == text
    # And the restarted gateway still answers and records.
    raw = gw.client(**{"x-reef-scenario": "crash"}).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert httpx.get(f"{gw.url}/reef/records/{raw.headers['x-reef-agent-record-id']}").status_code == 200
