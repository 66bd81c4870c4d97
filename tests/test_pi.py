"""The Pi coding agent (npm `@mariozechner/pi-coding-agent`, pinned) as a real client of `reef serve`.

Pi runs one-shot with its default tools (read, bash, edit, write) in a throwaway folder, bounded by
`timeout` and by a turn cap (the Pi extension `reef-pi` installs, `reef.gateway.routes.install.RECEIPTS_TS`:
Pi itself never stops while a model keeps calling tools), offline, with retries off. `make test`
installs Pi first (`make pi`); this test installs it too when missing, and fails (never skips) when
it cannot.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from reef.gateway.routes.install import RECEIPTS_TS
from tests.helpers import MODEL_NAME, REPO
from tests.helpers.gateway import Gateway

PI_VERSION = "0.73.1"
PI = REPO / ".pi-agent" / "node_modules" / ".bin" / "pi"


def models_json(gateway_url: str) -> dict:
    """Exactly what docs/01-serving.md ("Pi, configured by hand") tells users to write."""
    return {"providers": {"reef": {
        "baseUrl": f"{gateway_url}/v1",
        "api": "openai-completions",
        "apiKey": "unused",
        "headers": {"x-reef-scenario": "pi"},
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False, "maxTokensField": "max_tokens"},
        "models": [{"id": MODEL_NAME, "name": "Reef tiny", "contextWindow": 4096, "maxTokens": 256}],
    }}}


SETTINGS = {"defaultProvider": "reef", "defaultModel": MODEL_NAME, "quietStartup": True,
            # A 5xx must show, not be retried 4 x 3 times; the tiny model's window is smaller than
            # Pi's default compaction reserve (16k tokens), which would summarise after every turn.
            "retry": {"enabled": False}, "compaction": {"enabled": False}}


@pytest.fixture(scope="module")
def pi() -> Path:
    done = subprocess.run(["make", "-s", "pi"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"`make pi` could not install Pi:\n{done.stdout}\n{done.stderr}"
    version = subprocess.run([str(PI), "--version"], capture_output=True, text=True, timeout=60)
    assert (version.stdout + version.stderr).strip() == PI_VERSION, version  # pi prints it on stderr
    return PI


def run_pi(pi: Path, gw: Gateway, home: Path, prompt: str, *args: str, turns: int = 4) -> list[dict]:
    """Pi one-shot in a throwaway folder; returns the receipts (status, record id) per model response."""
    agent, work, log = home / "agent", home / "work", home / "responses.jsonl"
    agent.mkdir(parents=True, exist_ok=True)
    (home / "receipts.ts").write_text(RECEIPTS_TS)
    (agent / "models.json").write_text(json.dumps(models_json(gw.url), indent=2))
    (agent / "settings.json").write_text(json.dumps(SETTINGS))
    work.mkdir(exist_ok=True)
    (work / "notes.txt").write_text("Buy milk and bread.\n")
    (work / "todo.md").write_text("Fix the login bug.\n")
    env = {**os.environ, "PI_CODING_AGENT_DIR": str(agent), "PI_OFFLINE": "1", "PI_TELEMETRY": "0",
           "REEF_PI_MAX_TURNS": str(turns), "REEF_PI_RECEIPTS": str(log), "HOME": str(home)}
    cmd = ["timeout", "-k", "5", "120", str(pi), "--provider", "reef", "--model", MODEL_NAME, "--no-session",
           "--no-context-files", "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes",
           "-e", str(home / "receipts.ts"), "--mode", "json", *args, "-p", prompt]
    done = subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=150)
    assert done.returncode != 124, f"Pi ran into the timeout:\n{done.stderr[-2000:]}"
    responses = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert responses, f"Pi made no model call (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    # Pi prints a model error on stderr and ends; a cap abort says so and is not an error here.
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    errors = [e for e in events if e.get("type") == "message_end"
              and (e.get("message") or {}).get("stopReason") == "error"]
    assert not errors, errors
    return responses


def _non_200(gw: Gateway) -> list[str]:
    metrics = httpx.get(f"{gw.url}/metrics").text
    return [line for line in metrics.splitlines()
            if line.startswith("reef_chat_requests_total{") and not re.search(r'status="200"', line)]


def test_pi_with_default_tools_against_reef_serve(pi: Path, make_gateway, tmp_path: Path) -> None:
    gw = make_gateway("pi").start()

    # 1. Pi as it comes: its own ~2.3 KB system prompt and four tools (~3 KB of JSON schemas).
    first = run_pi(pi, gw, tmp_path / "default", "What is in notes.txt?", turns=2)
    # 2. A short system prompt: the tiny model, trained on tool use, calls `bash` and Pi runs it.
    second = run_pi(pi, gw, tmp_path / "short", "List the files.", "--system-prompt", "You are a coding agent.")

    for response in first + second:
        assert response["status"] == 200, (first, second)
    assert _non_200(gw) == []
    log = gw.log_path.read_text()
    assert "Traceback" not in log and " 500 " not in log

    records = {}
    for response in first + second:
        resp = httpx.get(f"{gw.url}/reef/records/{response['record_id']}", headers={"x-reef-scenario": "pi"})
        assert resp.status_code == 200, resp.text
        records[response["record_id"]] = resp.json()
    for rec in records.values():
        assert rec["scenario"] == "pi" and rec["stream"]
        assert {t["name"] for t in rec["tools"]} == {"read", "bash", "edit", "write"}
        user = next(m for m in rec["messages"] if m["role"] == "user")
        assert user["parts"] and user["parts"][0]["type"] == "text" and user["content"] == user["parts"][0]["text"]
        assert rec["choices"][0]["token_ids"]

    # The short-prompt run: a tool call, its result sent back, all turns one (stitched) session.
    turns = [records[r["record_id"]] for r in second]
    assert len(turns) >= 2, [t["choices"][0] for t in turns]
    assert turns[0]["choices"][0]["tool_calls"][0]["name"] == "bash"
    assert any(m["role"] == "tool" for m in turns[1]["messages"])
    sessions = {t["gen_ai.conversation.id"] for t in turns}
    assert len(sessions) == 1, sessions
    assert turns[0]["gen_ai.conversation.id"] != records[first[0]["record_id"]]["gen_ai.conversation.id"]

    # A reward for the whole session.
    (session,) = sessions
    resp = httpx.post(f"{gw.url}/reef/report", headers={"x-reef-scenario": "pi"},
                      json={"session_id": session, "score": 1.0, "feedback": "listed the files"})
    assert resp.status_code == 200, resp.text
    assert set(resp.json()["agent_record_ids"]) == {t["record_id"] for t in turns}
