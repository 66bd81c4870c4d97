"""`reef.traffic.simulate` scores what its users were served the way the gate and exploration do: a
reply that is a tool call (no content, a parsed `tool_calls`) reaches the scenario's reward as the
template writes it (`<tool_call>` markup), so a rewards-only tool scenario's live traffic earns its
reward once the model calls the tool. A stand-in engine answers every weather question with the
right call; `examples/weather` is declared as a user would."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from reef.config import resolve
from reef.serve_process import ServeProcess
from reef.traffic.simulate import simulate
from tests.helpers import REPO
from tests.helpers.stand_in import StandInUpstream, fake_model

pytestmark = pytest.mark.model_free


def weather_caller(cities: dict[str, str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Caller(StandInUpstream):
        """Calls get_weather for the first user message's city, as a model that learned the tool would."""

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            city = cities[body["messages"][0]["content"]]
            call = {"id": "call_0", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
            self._send({"id": "c1", "object": "chat.completion", "created": 0, "model": "stand-in",
                        "choices": [{"index": 0, "finish_reason": "tool_calls",
                                     "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    return Caller


def test_a_tool_call_reply_is_scored_by_the_reward(tmp_path: Path) -> None:
    work = Path(shutil.copytree(REPO / "examples" / "weather", tmp_path / "weather"))
    tasks = [json.loads(line) for line in (work / "tasks.jsonl").read_text().splitlines() if line.strip()]
    upstream = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), weather_caller({t["messages"][0]["content"]: t["city"] for t in tasks}))
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    gateway = ServeProcess(work, ["--upstream-url", f"http://127.0.0.1:{upstream.server_address[1]}",
                                  "--model", str(fake_model(tmp_path / "model"))],
                           {"REEF_LEARNER__ENABLED": "false"})
    try:
        gateway.start(timeout_s=120)
        summary = simulate(gateway.url, "weather", config=resolve(config_file=work / "serve.yaml")[0], requests=6,
                           concurrency=2, progress=False, corrections=False)
    finally:
        gateway.stop()
        upstream.shutdown()
    assert summary.errors == 0 and summary.reports == summary.requests == 6
    assert summary.scores == [1.0] * 6, summary.scores
