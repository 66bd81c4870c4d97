"""Real agents against `reef serve` on the default model (SmolLM2-135M-Instruct, an 8192-token window),
one dialect each: the Codex CLI (`@openai/codex`, Responses), Claude Code
(`@anthropic-ai/claude-code`, Anthropic Messages), the OpenAI Agents SDK (`openai-agents`, its
Responses model and its chat-completions model, one function tool each), OpenCode (`opencode-ai`,
chat completions through an OpenAI-compatible provider) and Pi (`@mariozechner/pi-coding-agent`,
chat completions).

The CLIs are pinned and installed by the Makefile (`make codex`, `make claude-code`, `make opencode`,
`make pi`) in project folders; one that cannot be installed fails its test, never skips it. Each is
configured with what the install adapters and `reef connect` write (`reef.gateway.install_agents`),
runs under `timeout` in a throwaway HOME, is recorded in its own scenario, and gets a report on its
session, which must be accepted and name its records. Where an agent's first prompt is larger than
the window (Codex, Claude Code), it is first run as it comes: the dialect's typed context error,
shown cleanly by the client, counted in `/reef/status`; then trimmed to fit.

SmolLM2 has not learned these agents' tools: it mostly answers in text. Each test reads its records
and says which happened (`tests.helpers.agents.tool_calls`): a parsed call that the agent ran, or no
call at all, cross-checked with what the agent itself reports having run. All share one server.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from reef.config import DEFAULT_MODEL_NAME as MODEL
from reef.gateway.install_agents import (
    CLAUDE_VERSION,
    CODEX_VERSION,
    OPENCODE_VERSION,
    claude_settings,
    codex_config,
    opencode_config,
    pi_models,
)
from reef.gateway.routes.install import PI_VERSION, RECEIPTS_TS
from reef.serve_process import ServeProcess
from tests.helpers import REPO
from tests.helpers.agents import (
    CONTEXT,
    OUTPUT_TOKENS,
    dialect,
    installed,
    record,
    refused,
    report_session,
    run,
    smollm2_server,
    tool_calls,
    workspace,
)

pytestmark = pytest.mark.start_early(2)  # one SmolLM2 server and six agents: minutes

CODEX = REPO / ".codex-cli" / "node_modules" / ".bin" / "codex"
CLAUDE = REPO / ".claude-code" / "node_modules" / ".bin" / "claude"
OPENCODE = REPO / ".opencode-cli" / "node_modules" / ".bin" / "opencode"
PI = REPO / ".pi-agent" / "node_modules" / ".bin" / "pi"
PROMPT = "List the files."
CLAUDE_OUTPUT_TOKENS = 64


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    srv = smollm2_server(tmp_path_factory.mktemp("smollm2"))
    yield srv
    assert srv.stop() == 0
    log = srv.log_path.read_text()
    assert "Traceback" not in log and " 500 " not in log


def test_codex_exec_through_a_model_provider(server: ServeProcess, tmp_path: Path,
                                             record_property: pytest.RecordProperty) -> None:
    codex = installed("codex", CODEX, CODEX_VERSION)

    # As `reef connect codex` writes it for this window: Codex's own prompt (instructions, tools) fits
    # SmolLM2's 8192 tokens once the adapter drops the environment and collaboration parts.
    home, work = workspace(tmp_path)
    (home / "config.toml").write_text(codex_config(server.url, "codex", MODEL, CONTEXT))
    session = "codex-session-1"
    done = run([str(codex), "exec", "--skip-git-repo-check", "--json", PROMPT], work,
               {"CODEX_HOME": str(home), "HOME": str(home), "REEF_SESSION": session})
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert any(e.get("type") == "turn.completed" for e in events), events
    records = [record(server.url, i, "codex") for i in report_session(server.url, "codex", session)]
    assert all(r["stream"] and dialect(r) == "responses" for r in records)
    assert all("exec_command" in {t["name"] for t in r["tools"]} for r in records)
    ran = any((e.get("item") or {}).get("type") == "command_execution" for e in events)
    record_property("smollm2", tool_calls(records, ran))


def test_claude_code_print_mode(server: ServeProcess, tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    claude = installed("claude-code", CLAUDE, CLAUDE_VERSION)

    def claude_run(home: Path, work: Path, session: str | None, *args: str) -> dict:
        settings = claude_settings(server.url, "claude-code", MODEL, CONTEXT)
        # Claude Code sends no temperature (SmolLM2 samples at 1) and takes a reply cut at its output
        # cap for an error, asked again up to 3 times: a question with a short answer, and a cap
        # that bounds the run's time when SmolLM2 rambles all the same.
        settings["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(CLAUDE_OUTPUT_TOKENS)  # type: ignore[index]
        if session:  # what reef-claude adds per run
            settings["env"]["ANTHROPIC_CUSTOM_HEADERS"] += f"\nx-reef-session: {session}"  # type: ignore[index]
        (home / "config").mkdir(exist_ok=True)
        (home / "config" / "settings.json").write_text(json.dumps(settings))
        done = run([str(claude), "-p", "What is 2 + 2?", "--output-format", "stream-json", "--verbose", *args], work,
                   {"CLAUDE_CONFIG_DIR": str(home / "config"), "HOME": str(home), "ANTHROPIC_API_KEY": "unused"})
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        result = events[-1]
        assert result["type"] == "result", done.stdout[-2000:] + done.stderr[-2000:]
        result["exit"] = done.returncode
        # A tool that Claude Code ran comes back to the model as a user turn's tool_result block.
        blocks = [b for e in events if e["type"] == "user" for b in (e.get("message") or {}).get("content") or []]
        result["ran_tool"] = any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks)
        return result

    # 1. As it comes: Claude Code's own ~48 KB prompt; Anthropic's "prompt is too long", shown cleanly.
    before = refused(server.url, "messages")
    first = claude_run(*workspace(tmp_path / "as-it-comes"), None)
    assert first["exit"] == 1 and first["is_error"] and first["api_error_status"] == 400, first
    assert "Prompt is too long" in first["result"], first["result"]
    assert refused(server.url, "messages") == before + 1

    # 2. Trimmed to fit: a short system prompt and one tool, a few turns at most.
    session = "claude-session-1"
    second = claude_run(*workspace(tmp_path / "trimmed"), session, "--system-prompt", "You are a coding agent.",
                        "--tools", "Bash", "--max-turns", "3")
    records = [record(server.url, i, "claude-code") for i in report_session(server.url, "claude-code", session)]
    assert all(dialect(r) == "messages" for r in records)
    if second["exit"] != 0:  # every reply ran into the cap: Anthropic's stop_reason max_tokens, as Claude Code read it
        assert second["api_error"] == "max_output_tokens", json.dumps(second)
        assert all(r["gen_ai.response.finish_reasons"] == ["length"] for r in records), records
        print(f"claude-code on {MODEL}: no reply ended within {CLAUDE_OUTPUT_TOKENS} tokens in {len(records)} tries")
    else:
        assert not second["is_error"], json.dumps(second)
    assert all("Bash" in {t["name"] for t in r["tools"]} for r in records)  # beside Claude Code's placeholder
    record_property("smollm2", tool_calls(records, second["ran_tool"]))


@pytest.mark.parametrize("model_class", ["OpenAIResponsesModel", "OpenAIChatCompletionsModel"])
def test_openai_agents_sdk_with_a_function_tool(server: ServeProcess, model_class: str,
                                                record_property: pytest.RecordProperty) -> None:
    import agents

    agents.set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    scenario = "agents-sdk" if model_class == "OpenAIResponsesModel" else "agents-sdk-chat"
    session = f"{scenario}-session-1"
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                                default_headers={"x-reef-scenario": scenario, "x-reef-session": session})
    calls: list[str] = []

    @agents.function_tool
    def bash(command: str) -> str:
        """Execute a bash command."""
        calls.append(command)
        return "notes.txt\ntodo.md"

    model = getattr(agents, model_class)(model=MODEL, openai_client=client)
    agent = agents.Agent(name="coder", instructions="You are a coding agent.", tools=[bash], model=model,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=OUTPUT_TOKENS))

    async def go() -> str:
        streamed = agents.Runner.run_streamed(agent, PROMPT, max_turns=3)
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)

    try:
        final = asyncio.run(go())
    except agents.MaxTurnsExceeded:  # a model that keeps calling the tool
        assert calls, "the turn cap ended a run that made no tool call"
        final = ""
    records = [record(server.url, i, scenario) for i in report_session(server.url, scenario, session)]
    want = "responses" if model_class == "OpenAIResponsesModel" else "chat"
    assert all(r["stream"] and dialect(r) == want for r in records)
    assert [t["name"] for t in records[0]["tools"]] == ["bash"]
    outcome = tool_calls(records, bool(calls))
    assert calls or final, "no tool call and no answer"
    record_property("smollm2", outcome)


def test_opencode_run_through_chat_completions(server: ServeProcess, tmp_path: Path,
                                               record_property: pytest.RecordProperty) -> None:
    opencode = installed("opencode", OPENCODE, OPENCODE_VERSION)
    home, work = workspace(tmp_path)
    # What the install script's reef-opencode uses (the session from $REEF_SESSION), one tool and a
    # few steps, in a throwaway HOME and XDG folders; nothing is fetched (models.dev, updates).
    config = opencode_config(server.url, "opencode", MODEL, CONTEXT, session_header=True)
    config["provider"]["reef"]["models"][MODEL]["limit"]["output"] = OUTPUT_TOKENS  # type: ignore[index]
    config["agent"]["build"].update(steps=3, tools={t: t == "bash" for t in (  # type: ignore[index]
        "bash", "edit", "glob", "grep", "list", "patch", "read", "skill", "task", "todowrite", "webfetch", "write")})
    (home / "opencode.json").write_text(json.dumps(config))
    xdg = {f"XDG_{d.upper()}_HOME": str(home / d) for d in ("config", "data", "cache", "state")}
    session = "opencode-session-1"
    done = run([str(opencode), "run", "--format", "json", PROMPT], work, {
        "HOME": str(home), **xdg, "OPENCODE_CONFIG": str(home / "opencode.json"), "REEF_SESSION": session,
        "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"})
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and not any(e.get("type") == "error" for e in events), (
        done.stdout[-3000:] + done.stderr[-2000:])
    assert any(e.get("type") == "step_finish" for e in events), events
    records = [record(server.url, i, "opencode") for i in report_session(server.url, "opencode", session)]
    assert all(r["stream"] and dialect(r) == "chat" for r in records)
    assert all({t["name"] for t in r["tools"]} == {"bash"} for r in records)
    ran = any(e.get("type") == "tool_use" for e in events)
    record_property("smollm2", tool_calls(records, ran))


def test_pi_with_default_tools(server: ServeProcess, tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    """Pi as it comes (its ~2.3 KB system prompt, four tools), set up by `reef connect pi` (which asks
    the running server for its model and window), one-shot, bounded by the turn cap of the extension
    `reef-pi` installs (Pi never stops while a model keeps calling tools), offline, retries off:
    each model response's receipt (status, record id) is written by that extension."""
    pi = installed("pi", PI, PI_VERSION)
    home, work = workspace(tmp_path)
    agent, receipts = home / "agent", home / "responses.jsonl"
    connect = [sys.executable, "-m", "reef.cli", "connect", "pi", "--url", server.url, "--scenario", "pi"]
    env = {"HOME": str(home), "PI_CODING_AGENT_DIR": str(agent)}
    assert run(connect, work, env, limit_s=60).returncode == 0
    models = json.loads((agent / "models.json").read_text())
    assert models == pi_models(server.url, "pi", MODEL, CONTEXT, session_header=False)  # the server's model, window
    (home / "receipts.ts").write_text(RECEIPTS_TS)
    models["providers"]["reef"]["models"][0]["maxTokens"] = OUTPUT_TOKENS
    (agent / "models.json").write_text(json.dumps(models))
    # A 5xx must show, not be retried 4 x 3 times; compaction is off already (its reserve exceeds the window).
    settings = json.loads((agent / "settings.json").read_text())
    assert settings["defaultModel"] == MODEL and settings["compaction"] == {"enabled": False}
    (agent / "settings.json").write_text(json.dumps({**settings, "retry": {"enabled": False}}))
    done = run([str(pi), "--provider", "reef", "--model", MODEL, "--no-session", "--no-context-files",
                "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes",
                "-e", str(home / "receipts.ts"), "--mode", "json", "-p", "What is in notes.txt?"], work,
               {"PI_CODING_AGENT_DIR": str(agent), "PI_OFFLINE": "1", "PI_TELEMETRY": "0", "REEF_PI_MAX_TURNS": "2",
                "REEF_PI_RECEIPTS": str(receipts), "HOME": str(home)})
    responses = [json.loads(line) for line in receipts.read_text().splitlines()] if receipts.exists() else []
    assert responses, f"Pi made no model call (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    errors = [e for e in events if e.get("type") == "message_end"
              and (e.get("message") or {}).get("stopReason") == "error"]
    assert not errors, errors  # Pi prints a model error and ends; the cap's abort is not an error
    assert all(r["status"] == 200 for r in responses), responses
    metrics = httpx.get(f"{server.url}/metrics").text
    assert not [line for line in metrics.splitlines() if line.startswith('reef_chat_requests_total{scenario="pi"')
                and not re.search(r'status="200"', line)]

    turns = [record(server.url, r["record_id"], "pi") for r in responses]
    for rec in turns:
        assert rec["stream"] and dialect(rec) == "chat"
        assert {t["name"] for t in rec["tools"]} == {"read", "bash", "edit", "write"}
        user = next(m for m in rec["messages"] if m["role"] == "user")
        assert user["parts"] and user["parts"][0]["type"] == "text" and user["content"] == user["parts"][0]["text"]
    sessions = {t["gen_ai.conversation.id"] for t in turns}
    assert len(sessions) == 1, sessions  # no session header: the turns are stitched into one
    (session,) = sessions
    assert set(report_session(server.url, "pi", session)) == {t["record_id"] for t in turns}
    ran = any(str(e.get("type", "")).startswith("tool_execution") for e in events)
    record_property("smollm2", tool_calls(turns, ran))
    assert run([*connect, "--undo"], work, env, limit_s=60).returncode == 0
    assert not (agent / "models.json").exists() and not (agent / "settings.json").exists()
