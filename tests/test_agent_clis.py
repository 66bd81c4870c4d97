"""Real agents on the gateway's other dialects: the Codex CLI (`@openai/codex`, the Responses API),
Claude Code (`@anthropic-ai/claude-code`, Anthropic's Messages API) and the OpenAI Agents SDK
(`openai-agents`, its Responses model with one function tool).

The CLIs are pinned and installed by the Makefile (`make codex`, `make claude-code`), in project
folders like Pi; a client that cannot be installed fails its test, never skips it. Each is
configured with what the install adapters write (`reef.gateway.install_agents`), runs under
`timeout` in a throwaway HOME, and is tried twice: as it comes (its first prompt is larger than the
tiny model's context: the dialect's typed context error, reported cleanly by the client, counted in
`/reef/status`), then trimmed to fit, which is recorded in its own scenario and rewarded by session.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from reef.gateway.install_agents import CLAUDE_VERSION, CODEX_VERSION, claude_settings, codex_config
from tests.helpers import MODEL_NAME, REPO
from tests.helpers.gateway import Gateway

CODEX = REPO / ".codex-cli" / "node_modules" / ".bin" / "codex"
CLAUDE = REPO / ".claude-code" / "node_modules" / ".bin" / "claude"
CONTEXT = 4096
# Neither Codex nor the Agents SDK names an output length: the gateway's default bounds each turn.
GATEWAY_ENV = {"REEF_LIMITS__DEFAULT_MAX_TOKENS": "48"}


def _installed(target: str, binary: Path, version: str) -> Path:
    done = subprocess.run(["make", "-s", target], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"`make {target}` could not install it:\n{done.stdout}\n{done.stderr}"
    shown = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version in shown.stdout + shown.stderr, shown
    return binary


@pytest.fixture(scope="module")
def gw(vllm_url: str, tmp_path_factory: pytest.TempPathFactory) -> Gateway:
    gateway = Gateway(tmp_path_factory.mktemp("agents"), vllm_url, env=GATEWAY_ENV).start()
    yield gateway
    gateway.stop()


def _refused(gw: Gateway, dialect: str) -> int:
    return httpx.get(f"{gw.url}/reef/status").json()["context_refused"].get(dialect, 0)


def _report_session(gw: Gateway, scenario: str, session: str) -> list[str]:
    resp = httpx.post(f"{gw.url}/reef/report", headers={"x-reef-scenario": scenario},
                      json={"session_id": session, "score": 1.0, "feedback": "ran"})
    assert resp.status_code == 200, resp.text
    ids = resp.json()["agent_record_ids"]
    assert ids
    return ids


def _record(gw: Gateway, record_id: str, scenario: str) -> dict:
    resp = httpx.get(f"{gw.url}/reef/records/{record_id}", headers={"x-reef-scenario": scenario})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _home(tmp: Path) -> tuple[Path, Path]:
    home, work = tmp / "home", tmp / "work"
    work.mkdir(parents=True)
    home.mkdir()
    (work / "notes.txt").write_text("Buy milk and bread.\n")
    return home, work


def _run(cmd: list[str], work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["timeout", "-k", "5", "150", *cmd], cwd=work, env={**os.environ, **env},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=170)
    assert done.returncode != 124, f"ran into the timeout:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_codex_exec_through_a_model_provider(gw: Gateway, tmp_path: Path) -> None:
    codex = _installed("codex", CODEX, CODEX_VERSION)

    # 1. As it comes (a large window declared: Codex's own ~20k-token first prompt is sent whole).
    home, work = _home(tmp_path / "as-it-comes")
    (home / "config.toml").write_text(codex_config(gw.url, "codex", MODEL_NAME, 200_000))
    before = _refused(gw, "responses")
    done = _run([str(codex), "exec", "--skip-git-repo-check", "--json", "List the files."], work,
                {"CODEX_HOME": str(home), "HOME": str(home)})
    assert done.returncode != 0 and "context window" in done.stdout + done.stderr, done.stdout[-2000:]
    assert _refused(gw, "responses") == before + 1

    # 2. What the codex adapter writes for this context, plus a short instructions file.
    home, work = _home(tmp_path / "trimmed")
    (home / "short.md").write_text("You are a coding agent.\n")
    config = codex_config(gw.url, "codex", MODEL_NAME, CONTEXT)
    (home / "config.toml").write_text(f'model_instructions_file = "{home / "short.md"}"\n' + config)
    session = "codex-session-1"
    done = _run([str(codex), "exec", "--skip-git-repo-check", "--json", "List the files."], work,
                {"CODEX_HOME": str(home), "HOME": str(home), "REEF_SESSION": session})
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert any(e.get("type") == "turn.completed" for e in events), events
    ids = _report_session(gw, "codex", session)
    for record_id in ids:
        rec = _record(gw, record_id, "codex")
        assert rec["stream"] and json.loads(rec["params_json"])["reef.dialect"] == "responses"
        assert rec["choices"][0]["token_ids"] and rec["prompt_token_ids"]
        assert "exec_command" in {t["name"] for t in rec["tools"]} or rec["tools"] == []


def test_claude_code_print_mode(gw: Gateway, tmp_path: Path) -> None:
    claude = _installed("claude-code", CLAUDE, CLAUDE_VERSION)

    def run(home: Path, work: Path, session: str | None, *args: str) -> dict:
        settings = claude_settings(gw.url, "claude-code", MODEL_NAME, CONTEXT)
        if session:  # what reef-claude adds per run
            settings["env"]["ANTHROPIC_CUSTOM_HEADERS"] += f"\nx-reef-session: {session}"  # type: ignore[index]
        (home / "config").mkdir(exist_ok=True)
        (home / "config" / "settings.json").write_text(json.dumps(settings))
        done = _run([str(claude), "-p", "List the files.", "--output-format", "json", *args], work,
                    {"CLAUDE_CONFIG_DIR": str(home / "config"), "HOME": str(home), "ANTHROPIC_API_KEY": "unused"})
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["exit"] = done.returncode
        return result

    # 1. As it comes: Claude Code's own ~27k-token prompt; Anthropic's "prompt is too long", shown cleanly.
    before = _refused(gw, "messages")
    first = run(*_home(tmp_path / "as-it-comes"), None)
    assert first["exit"] == 1 and first["is_error"] and first["api_error_status"] == 400, first
    assert "Prompt is too long" in first["result"], first["result"]
    assert _refused(gw, "messages") == before + 1

    # 2. Trimmed to fit: a short system prompt and one tool; a tool round trip in a few turns.
    session = "claude-session-1"
    second = run(*_home(tmp_path / "trimmed"), session, "--system-prompt", "You are a coding agent.",
                 "--tools", "Bash", "--max-turns", "3")
    assert second["exit"] == 0 and not second["is_error"], second
    ids = _report_session(gw, "claude-code", session)
    for record_id in ids:
        rec = _record(gw, record_id, "claude-code")
        assert json.loads(rec["params_json"])["reef.dialect"] == "messages"
        assert rec["choices"][0]["token_ids"] and rec["prompt_token_ids"]
        assert "Bash" in {t["name"] for t in rec["tools"]}  # beside Claude Code's own placeholder tool


def test_openai_agents_sdk_responses_model_with_a_function_tool(gw: Gateway) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    session = "agents-sdk-session-1"
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0,
                                default_headers={"x-reef-scenario": "agents-sdk", "x-reef-session": session})
    calls: list[str] = []

    @function_tool
    def bash(command: str) -> str:
        """Execute a bash command."""
        calls.append(command)
        return "notes.txt\ntodo.md"

    agent = Agent(name="coder", instructions="You are a coding agent.", tools=[bash],
                  model=OpenAIResponsesModel(model=MODEL_NAME, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=48))

    async def run() -> str:
        streamed = Runner.run_streamed(agent, "List the files.", max_turns=3)
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)

    try:
        final = asyncio.run(run())
    except Exception as exc:  # the turn cap: the tiny model may keep calling the tool
        assert type(exc).__name__ == "MaxTurnsExceeded", repr(exc)
        final = ""
    ids = _report_session(gw, "agents-sdk", session)
    records = [_record(gw, i, "agents-sdk") for i in ids]
    assert all(r["stream"] and json.loads(r["params_json"])["reef.dialect"] == "responses" for r in records)
    assert all(r["choices"][0]["token_ids"] for r in records)
    assert [t["name"] for t in records[0]["tools"]] == ["bash"]
    if calls:  # the model's call ran, and its result went back in the next turn
        assert len(records) >= 2 and any(m["role"] == "tool" for m in records[1]["messages"]), records
    else:
        assert final
