"""kill -9 the gateway while 8 clients send requests: every record id a client received is stored."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway

pytestmark = [pytest.mark.model_free, pytest.mark.any_model, pytest.mark.start_early(15)]


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


def _small_filesystem(path: Path, size: str) -> None:
    """A tmpfs of `size` at `path`: a disk that really fills up (as root, or through sudo)."""
    path.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    if os.geteuid() != 0:
        cmd = ["sudo", "-n", *cmd]
    subprocess.run(cmd, check=True, capture_output=True)


def _report(gw: Gateway, record_id: str, report_id: str, feedback: str) -> httpx.Response:
    return httpx.post(f"{gw.url}/reef/report", headers={"x-reef-scenario": "crash"}, timeout=30,
                      json={"agent_record_id": record_id, "score": 1.0, "feedback": feedback, "report_id": report_id})


def test_a_full_wal_disk_refuses_with_507_and_acknowledges_only_what_is_durable(make_gateway, tmp_path: Path) -> None:
    gw: Gateway = make_gateway("full", env={"REEF_STORE__FLUSH_INTERVAL_S": "5"})
    wal = gw.data_dir / "wal"
    _small_filesystem(wal, "1m")
    try:
        gw.start()
        raw = gw.client(**{"x-reef-scenario": "crash"}).chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        record_id = raw.headers["x-reef-agent-record-id"]
        feedback = "x" * 30_000  # about 30 reports fill the WAL's megabyte
        acknowledged, refused, statuses = [], [], []
        for i in range(400):
            r = _report(gw, record_id, f"rep-full-{i}", feedback)
            statuses.append(r.status_code)
            if r.status_code == 200:
                acknowledged.append(f"rep-full-{i}")
            else:
                assert r.status_code == 507, r.text
                error = r.json()["error"]
                assert (error["code"], error["type"]) == ("storage_full", "insufficient_storage")
                assert r.headers["retry-after"]
                refused.append(f"rep-full-{i}")
                if len(refused) >= 5:
                    break
        assert refused and acknowledged, statuses
        # The flusher moves the WAL into parquet (on another disk) and frees it: appends work again.
        deadline = time.monotonic() + 30
        while (r := _report(gw, record_id, refused[0], feedback)).status_code == 507:
            assert time.monotonic() < deadline, "never recovered from the full disk"
            time.sleep(0.2)
        assert r.status_code == 200 and r.json()["duplicate"] is False, r.text  # it had not been stored
        acknowledged.append(refused.pop(0))
        gw.kill()
        gw.start()
        for report_id in acknowledged:  # every acknowledged report survived the crash ...
            r = _report(gw, record_id, report_id, feedback)
            assert r.status_code == 200 and r.json()["duplicate"] is True, (report_id, r.text)
        for report_id in refused:  # ... and none that was refused was stored
            r = _report(gw, record_id, report_id, feedback)
            assert r.status_code == 200 and r.json()["duplicate"] is False, (report_id, r.text)
    finally:
        if gw.process is not None:
            gw.stop()
        subprocess.run(["umount", "-l", str(wal)] if os.geteuid() == 0 else ["sudo", "-n", "umount", "-l", str(wal)],
                       check=False)
