"""Real `reef serve` gateway processes for the tests, and what they ask of a running one."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai

from reef.serve_process import ServeProcess
from tests.helpers import MODEL_NAME


class Gateway(ServeProcess):
    """A `reef serve` recording in front of the session's vLLM."""

    def __init__(self, workdir: Path, upstream_url: str, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None):
        extra_args = extra_args or []
        if "--model" not in extra_args:
            # The session's engine serves the test model under MODEL_NAME, not the default model's name.
            env = {"REEF_SERVED_MODEL_NAME": MODEL_NAME, **(env or {})}
        super().__init__(workdir, ["--upstream-url", upstream_url, *extra_args], env)

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", default_headers=headers or None,
                             max_retries=0)


def get_record(gw: Gateway, record_id: str) -> dict:
    resp = httpx.get(f"{gw.url}/reef/records/{record_id}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def wait_flushed(gw: Gateway, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        scenarios = httpx.get(f"{gw.url}/reef/status").json()["scenarios"]
        if all(s["unflushed_records"] == 0 and s["unflushed_reports"] == 0 for s in scenarios.values()):
            return
        time.sleep(0.2)
    raise AssertionError("store did not flush")
