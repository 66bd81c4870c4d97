"""What the real-agent tests share: the pinned installs, one `reef serve` on the default model,
running an agent bounded in time, reporting on its session, and reading what its records say about
tool calls."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from reef.config import DEFAULT_MODEL, DEFAULT_MODEL_NAME
from reef.serve_process import ServeProcess
from tests.helpers import REPO

# The default model's own window (SmolLM2-135M-Instruct: 8192 tokens), which the agents are told.
CONTEXT = 8192
# Codex and the Agents SDK name no output length: the gateway's default bounds each of their turns;
# the others are configured with OUTPUT_TOKENS. SmolLM2 writes until the bound, so it is the time.
SERVER_ENV = {"REEF_LIMITS__DEFAULT_MAX_TOKENS": "48"}
OUTPUT_TOKENS = 48


def installed(target: str, binary: Path, version: str) -> Path:
    """`make <target>` (a no-op once installed), then the binary's version; fails, never skips."""
    done = subprocess.run(["make", "-s", target], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"`make {target}` could not install it:\n{done.stdout}\n{done.stderr}"
    # A big binary (OpenCode's is ~180 MB) can take a minute to start on a loaded machine.
    shown = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=180)
    assert version in shown.stdout + shown.stderr, shown
    return binary


def smollm2_server(workdir: Path) -> ServeProcess:
    """`reef serve` on the default model, as a user runs it, recording every scenario."""
    from reef.model.smollm2 import convert, is_current

    if not is_current(DEFAULT_MODEL):
        convert(DEFAULT_MODEL)
    env = {"REEF_SERVED_MODEL_NAME": DEFAULT_MODEL_NAME, **SERVER_ENV}
    return ServeProcess(workdir, ["--model", str(DEFAULT_MODEL.resolve())], env).start(timeout_s=900)


def run(cmd: list[str], work: Path, env: dict[str, str], limit_s: int = 150) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["timeout", "-k", "5", str(limit_s), *cmd], cwd=work, env={**os.environ, **env},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=limit_s + 20)
    assert done.returncode != 124, f"ran into the timeout:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def workspace(tmp: Path) -> tuple[Path, Path]:
    """A throwaway HOME and a work folder with two files to list or read."""
    home, work = tmp / "home", tmp / "work"
    work.mkdir(parents=True)
    home.mkdir()
    (work / "notes.txt").write_text("Buy milk and bread.\n")
    (work / "todo.md").write_text("Fix the login bug.\n")
    return home, work


def refused(url: str, dialect: str) -> int:
    return httpx.get(f"{url}/reef/status").json()["context_refused"].get(dialect, 0)


def report_session(url: str, scenario: str, session: str) -> list[str]:
    """A reward for the whole session: accepted, and naming the session's records."""
    resp = httpx.post(f"{url}/reef/report", headers={"x-reef-scenario": scenario},
                      json={"session_id": session, "score": 1.0, "feedback": "ran"})
    assert resp.status_code == 200, resp.text
    ids = resp.json()["agent_record_ids"]
    assert ids
    return ids


def record(url: str, record_id: str, scenario: str) -> dict:
    resp = httpx.get(f"{url}/reef/records/{record_id}", headers={"x-reef-scenario": scenario})
    assert resp.status_code == 200, resp.text
    rec = resp.json()
    assert rec["scenario"] == scenario and rec["choices"][0]["token_ids"] and rec["prompt_token_ids"]
    return rec


def dialect(rec: dict) -> str:
    return json.loads(rec["params_json"]).get("reef.dialect") or "chat"


def tool_calls(records: list[dict], executed: bool) -> str:
    """What the model did with its tools, from the records, checked against what the agent says it
    ran (`executed`): a parsed call was made and the agent ran it (its result is in the next turn's
    prompt when there is one), or no call was made and the agent ran nothing. Returns the sentence
    the test reports; it never passes a run that only looks like tool use."""
    records = sorted(records, key=lambda r: r["created_at"])
    calls = [(i, call) for i, rec in enumerate(records) for call in rec["choices"][0]["tool_calls"] or []]
    if not calls:
        assert not executed, "the agent ran a tool although no record holds a parsed tool call"
        return _say(records, f"no tool call: the model answered in text in {len(records)} turn(s)")
    assert executed, f"the model called {[c['name'] for _, c in calls]} but the agent ran nothing"
    offered = {t["name"] for t in records[calls[0][0]]["tools"]}
    assert all(call["name"] in offered for _, call in calls), (calls, offered)
    for i, _ in calls:
        if i + 1 < len(records):  # the turn after a call carries the call's result
            assert any(m["role"] == "tool" for m in records[i + 1]["messages"]), records[i + 1]["messages"]
    return _say(records, f"tool calls made and executed: {[c['name'] for _, c in calls]} in {len(records)} turn(s)")


def _say(records: list[dict], sentence: str) -> str:
    # Shown by `pytest -rP`; the test also keeps it as a property (the junit XML).
    prompts = [len(r["prompt_token_ids"]) for r in records]
    print(f"{records[0]['scenario']} on {records[0]['gen_ai.response.model']}: {sentence}; prompt tokens {prompts}")
    return sentence
