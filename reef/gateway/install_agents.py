"""The install scripts of `?adapter=codex`, `?adapter=claude-code` and `?adapter=opencode`
(`reef.gateway.routes.install`), and the agents' config files they write (`reef connect` writes the
same into the agents' own folders: `reef.gateway.connect`).

Each is a POSIX shell script that writes the agent's provider config into a folder of Reef's own
(`$REEF_HOME`, default `~/.reef/codex`, `~/.reef/claude-code` or `~/.reef/opencode`), never into the
agent's own config (`~/.codex`, `~/.claude`, `~/.config/opencode`), and a wrapper (`reef-codex`,
`reef-claude`, `reef-opencode`) in `$REEF_BIN_DIR` (default `~/.local/bin`) that points the agent at
that folder (`CODEX_HOME`, `CLAUDE_CONFIG_DIR`, `OPENCODE_CONFIG`). Undo: delete the folder and the
wrapper. The agent itself is used from PATH (or `$REEF_CODEX`, `$REEF_CLAUDE`, `$REEF_OPENCODE`),
else installed, pinned, from npm into the folder. No secret is written: a data-plane key is read
from `$REEF_API_KEY` when the wrapper runs.

- Codex: a `model_providers.reef` entry with `wire_api = "responses"`, the scenario in
  `http_headers`, the session and the key in `env_http_headers` (sent only when set), and the
  model's context window, so Codex's own budget matches the engine's.
- Claude Code: `settings.json` with `ANTHROPIC_BASE_URL`, `ANTHROPIC_CUSTOM_HEADERS` (the scenario)
  and the served model for every model role Claude Code has, telemetry and updates off.
- OpenCode: `opencode.json` with a `reef` provider on chat completions (`@ai-sdk/openai-compatible`),
  the scenario (and, from the wrapper, the session) in its headers, the model's context and output
  limits, updates and sharing off; below 32k tokens of context a short `build` prompt, and no title
  requests (OpenCode's own prompt alone is ~7.7k tokens).
"""

from __future__ import annotations

import json
import shlex

CODEX_PACKAGE, CODEX_VERSION = "@openai/codex", "0.171.0"
CLAUDE_PACKAGE, CLAUDE_VERSION = "@anthropic-ai/claude-code", "2.1.332"
OPENCODE_PACKAGE, OPENCODE_VERSION = "opencode-ai", "1.18.33"
# What OpenCode's `build` agent gets below 32k tokens of context (its own prompt is ~7.7k tokens).
OPENCODE_SHORT_PROMPT = "You are a coding agent. Use the tools to inspect and change files; answer briefly."


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


# Codex's first request (~20k tokens of instructions, environment and tools) overflows a small
# context: these drop what it can drop; a short `model_instructions_file` does the rest.
_SMALL_CODEX = """include_environment_context = false
include_apps_instructions = false
include_collaboration_mode_instructions = false
include_permissions_instructions = false
project_doc_max_bytes = 0
# model_instructions_file = "/absolute/path/to/short-instructions.md"
"""


def codex_config(url: str, scenario: str, model: str, context: int) -> str:
    """Codex's `config.toml` for a Reef scenario (also what README's Codex page shows)."""
    small = _SMALL_CODEX if context < 32768 else ""
    return f"""# Written by Reef for scenario {scenario}; delete this folder to undo.
{small}model = {_toml(model)}
model_provider = "reef"
model_context_window = {context}
model_auto_compact_token_limit = {max(256, context * 3 // 4)}
show_raw_agent_reasoning = false

[model_providers.reef]
name = "Reef"
base_url = {_toml(url + "/v1")}
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
http_headers = {{ "x-reef-scenario" = {_toml(scenario)} }}
env_http_headers = {{ "x-reef-session" = "REEF_SESSION", "authorization" = "REEF_AUTHORIZATION" }}
"""


def claude_settings(url: str, scenario: str, model: str, context: int) -> dict[str, object]:
    """Claude Code's `settings.json` for a Reef scenario. Its default output budget (32k tokens) is
    more than a small model's whole context: a quarter of the context is asked for instead."""
    env = {
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(min(32000, max(64, context // 4))),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_CUSTOM_HEADERS": f"x-reef-scenario: {scenario}",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    return {"env": env}


def opencode_config(url: str, scenario: str, model: str, context: int, session_header: bool = False) -> dict:
    """OpenCode's `opencode.json` for a Reef scenario. `session_header`: send `$REEF_SESSION` as the
    session (the wrapper always sets it; an empty header would be refused, so a config used without
    the wrapper leaves sessions to be stitched from the messages)."""
    headers = {"x-reef-scenario": scenario}
    if session_header:
        headers["x-reef-session"] = "{env:REEF_SESSION}"
    config: dict[str, object] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"reef": {
            "npm": "@ai-sdk/openai-compatible", "name": "Reef",
            "options": {"baseURL": f"{url}/v1", "apiKey": "{env:REEF_API_KEY}", "headers": headers},
            "models": {model: {"name": f"Reef {scenario}", "tool_call": True,
                               "limit": {"context": context, "output": min(4096, max(64, context // 4))}}},
        }},
        "model": f"reef/{model}", "small_model": f"reef/{model}", "autoupdate": False, "share": "disabled",
    }
    if context < 32768:
        config["agent"] = {"build": {"prompt": OPENCODE_SHORT_PROMPT}, "title": {"disable": True}}
    return config


def pi_models(url: str, scenario: str, model: str, context: int, session_header: bool = True) -> dict:
    """Pi's `models.json` with a `reef` provider. Pi sends a header value that names a set environment
    variable as that variable's value, else as it is: `reef-pi` always sets `REEF_SESSION`; a config
    used without it (`reef connect pi`) sends no session header, and sessions are stitched."""
    headers = {"x-reef-scenario": scenario}
    if session_header:
        headers["x-reef-session"] = "REEF_SESSION"
    return {"providers": {"reef": {
        "baseUrl": f"{url}/v1", "api": "openai-completions",
        "apiKey": "REEF_API_KEY",  # Pi sends $REEF_API_KEY when set, else this literal text
        "headers": headers,
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False, "maxTokensField": "max_tokens"},
        "models": [{"id": model, "name": f"Reef {scenario}", "contextWindow": context,
                    "maxTokens": min(4096, max(64, context // 4))}],
    }}}


def pi_settings(model: str, context: int) -> dict:
    # Pi's default compaction reserve (16k tokens) is more than a small window holds.
    return {"defaultProvider": "reef", "defaultModel": model, "quietStartup": True,
            "compaction": {"enabled": context >= 32768}}


def _script(name: str, folder: str, package: str, version: str, binary: str, override: str,
            files: dict[str, str], wrapper: str, url: str, scenario: str) -> str:
    writes = []
    for target, text in files.items():
        writes.append(f"cat > {target} <<'REEF_EOF'\n{text if text.endswith(chr(10)) else text + chr(10)}REEF_EOF\n")
    spec = shlex.quote(f"{package}@{version}")
    return f"""#!/bin/sh
# Reef: {name} for scenario {scenario} at {url}. Undo: rm -rf "$REEF_HOME" "$REEF_BIN_DIR/{wrapper}".
set -eu
REEF_HOME="${{REEF_HOME:-$HOME/.reef/{folder}}}"
REEF_BIN_DIR="${{REEF_BIN_DIR:-$HOME/.local/bin}}"
mkdir -p "$REEF_HOME/config" "$REEF_BIN_DIR"
cd "$REEF_HOME"
if [ -n "${{{override}:-}}" ]; then agent="${override}"
elif command -v {binary} >/dev/null 2>&1; then agent="$(command -v {binary})"
else
  command -v npm >/dev/null 2>&1 || {{ echo "reef: npm is needed to install {package}" >&2; exit 1; }}
  npm install --prefix "$REEF_HOME/npm" --no-audit --no-fund --loglevel=error {spec}
  agent="$REEF_HOME/npm/node_modules/.bin/{binary}"
fi
printf '%s\\n' "$agent" > agent-path
{"".join(writes)}{{ printf '#!/bin/sh\n# {wrapper}: {name} against Reef scenario {scenario}. Written by Reef.\n'
  printf "REEF_HOME='%s'\n" "$REEF_HOME"
  cat <<'REEF_EOF'
{_WRAPPER_BODY[binary].replace("SCENARIO", shlex.quote(scenario))}
exec "$(cat "$REEF_HOME/agent-path")" "$@"
REEF_EOF
}} > "$REEF_BIN_DIR/{wrapper}"
chmod +x "$REEF_BIN_DIR/{wrapper}"
echo "reef: {wrapper} is ready ($REEF_BIN_DIR/{wrapper}); undo: rm -rf $REEF_HOME $REEF_BIN_DIR/{wrapper}"
case ":$PATH:" in *":$REEF_BIN_DIR:"*) ;; *) echo "reef: add $REEF_BIN_DIR to PATH" >&2 ;; esac
"""


# The wrappers' own lines (a quoted heredoc: nothing is expanded when the install script runs).
_WRAPPER_BODY = {
    "codex": """export CODEX_HOME="$REEF_HOME/config"
export REEF_SESSION="${REEF_SESSION:-codex-$(date +%s)-$$}"
if [ -n "${REEF_API_KEY:-}" ]; then export REEF_AUTHORIZATION="Bearer $REEF_API_KEY"; fi""",
    "claude": """export CLAUDE_CONFIG_DIR="$REEF_HOME/config"
export ANTHROPIC_API_KEY="${REEF_API_KEY:-unused}"
export REEF_SESSION="${REEF_SESSION:-claude-$(date +%s)-$$}"
export ANTHROPIC_CUSTOM_HEADERS="x-reef-scenario: SCENARIO
x-reef-session: $REEF_SESSION\"""",
    "opencode": """export OPENCODE_CONFIG="$REEF_HOME/config/opencode.json"
export REEF_SESSION="${REEF_SESSION:-opencode-$(date +%s)-$$}\"""",
}


def codex_script(url: str, scenario: str, model: str, context: int) -> str:
    files = {"config/config.toml": codex_config(url, scenario, model, context)}
    return _script("the Codex CLI", "codex", CODEX_PACKAGE, CODEX_VERSION, "codex", "REEF_CODEX", files,
                   "reef-codex", url, scenario)


def claude_script(url: str, scenario: str, model: str, context: int) -> str:
    files = {"config/settings.json": json.dumps(claude_settings(url, scenario, model, context), indent=2)}
    return _script("Claude Code", "claude-code", CLAUDE_PACKAGE, CLAUDE_VERSION, "claude", "REEF_CLAUDE", files,
                   "reef-claude", url, scenario)


def opencode_script(url: str, scenario: str, model: str, context: int) -> str:
    config = opencode_config(url, scenario, model, context, session_header=True)
    files = {"config/opencode.json": json.dumps(config, indent=2)}
    return _script("OpenCode", "opencode", OPENCODE_PACKAGE, OPENCODE_VERSION, "opencode", "REEF_OPENCODE", files,
                   "reef-opencode", url, scenario)
