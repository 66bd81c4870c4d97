"""`GET /reef/harness/install?adapter=A&scenario=S`: set up an agent (`ADAPTERS`) against this server.

`codex`, `claude-code` and `opencode` are described in `reef.gateway.install_agents`.

    curl -fsS 'http://127.0.0.1:8900/reef/harness/install?adapter=pi&scenario=support' | sh

`pi` is a POSIX shell script: it installs the pinned Pi coding agent from npm into
`$REEF_HOME/npm` (or uses a `pi` already on PATH, or `$REEF_PI`), writes Pi's `models.json` and
`settings.json` into its own agent folder (`$REEF_HOME/agent`, default `~/.reef/pi/agent`), writes
the scenario's served harness where Pi reads it (system.md -> SYSTEM.md, rules.md -> AGENTS.md,
skills/ -> skills/), and puts `reef-pi` on PATH (`$REEF_BIN_DIR`, default `~/.local/bin`).
`openai` prints the environment for any OpenAI SDK. The base URL is the one the client reached
(`x-forwarded-proto`/`-host` honoured behind a proxy). No secret is written: the admin token never,
a data-plane key only as the name of the environment variable Pi reads it from (`REEF_API_KEY`).
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse

from reef.gateway.harness import current_harness
from reef.gateway.install_agents import claude_script, codex_script, opencode_script, pi_models, pi_settings
from reef.gateway.state import get_state
from reef.gateway.wire.contract import errors
from reef.gateway.wire.errors import ReefError
from reef.registry.schema import SCENARIO_RE

router = APIRouter()

PI_PACKAGE = "@mariozechner/pi-coding-agent"
PI_VERSION = "0.73.1"
DEFAULT_CONTEXT = 4096  # when neither serve.yaml nor a local model config says
ADAPTERS = ("claude-code", "codex", "opencode", "openai", "pi")
_HOST_RE = re.compile(r"^[A-Za-z0-9.\-\[\]:]{1,255}$")
# Where each harness file goes in Pi's agent folder; other files are kept under reef-harness/.
_PI_PLACES = {"system.md": "SYSTEM.md", "rules.md": "AGENTS.md"}

# The `reef-pi` wrapper. Node, because Pi needs it anyway: JSON and HTTP without curl or jq.
REEF_PI = r"""#!/usr/bin/env node
// reef-pi: Pi against a Reef scenario, with receipts. Written by Reef's install script.
//   reef-pi [pi arguments]                  run Pi (each run is one Reef session)
//   reef-pi report --score N [--feedback T]  reward the last run's session
//   reef-pi update                          pull the scenario's current harness and settings again
const fs = require("node:fs"), path = require("node:path"), { spawnSync } = require("node:child_process");
const home = process.env.REEF_HOME || path.join(require("node:os").homedir(), ".reef", "pi");
const conf = JSON.parse(fs.readFileSync(path.join(home, "reef.json"), "utf8"));
const receipts = path.join(home, "receipts.jsonl"), last = path.join(home, "last-session");
const pi = fs.readFileSync(path.join(home, "pi-path"), "utf8").trim();
const headers = { "content-type": "application/json", "x-reef-scenario": conf.scenario };
if (process.env.REEF_API_KEY) headers.authorization = `Bearer ${process.env.REEF_API_KEY}`;
const fail = (msg, code) => { console.error(`reef-pi: ${msg}`); process.exit(code); };
const args = process.argv.slice(2);

async function report() {
  let score, feedback;
  for (let i = 1; i < args.length; i++) {
    if (args[i] === "--score") score = Number(args[++i]);
    else if (args[i] === "--feedback") feedback = args[++i];
    else fail(`unknown argument ${args[i]}; usage: reef-pi report --score N [--feedback TEXT]`, 2);
  }
  if (score === undefined || !Number.isFinite(score)) fail("--score N (a number) is required", 2);
  if (!fs.existsSync(last)) fail("no run to report on yet: run reef-pi first", 2);
  const session = fs.readFileSync(last, "utf8").trim();
  const ids = (fs.existsSync(receipts) ? fs.readFileSync(receipts, "utf8").split("\n") : [])
    .filter(Boolean).map((l) => JSON.parse(l)).filter((r) => r.session === session && r.record_id)
    .map((r) => r.record_id);
  if (!ids.length) fail(`the last run (session ${session}) has no recorded model call`, 1);
  const body = { references: ids, score, ...(feedback === undefined ? {} : { feedback }) };
  const res = await fetch(`${conf.url}/reef/report`, { method: "POST", headers, body: JSON.stringify(body) });
  const text = await res.text();
  console.log(text);
  process.exit(res.ok ? 0 : 1);
}

async function update() {
  const res = await fetch(conf.install_url);
  if (!res.ok) fail(`${conf.install_url}: HTTP ${res.status}: ${await res.text()}`, 1);
  const done = spawnSync("sh", ["-s"], { input: await res.text(), stdio: ["pipe", "inherit", "inherit"] });
  process.exit(done.status ?? 1);
}

function run() {
  const session = `pi-${Date.now()}-${process.pid}`;
  fs.writeFileSync(last, session + "\n");
  const env = { ...process.env, PI_CODING_AGENT_DIR: path.join(home, "agent"), REEF_SESSION: session,
    REEF_PI_RECEIPTS: receipts, PI_TELEMETRY: process.env.PI_TELEMETRY || "0",
    PI_OFFLINE: process.env.PI_OFFLINE || "1" };
  const done = spawnSync(pi, ["--provider", "reef", "--model", conf.model,
    "-e", path.join(home, "reef-receipts.ts"), ...args], { stdio: "inherit", env });
  if (done.error) fail(`${pi}: ${done.error.message}`, 1);
  process.exit(done.status ?? 1);
}

if (args[0] === "report") report();
else if (args[0] === "update") update();
else run();
"""

# A Pi extension: each model response's Reef record id goes into the receipts, and a run ends after
# REEF_PI_MAX_TURNS turns (Pi has no turn limit; a small model may call tools forever).
RECEIPTS_TS = r"""import { appendFileSync } from "node:fs";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

export default function (pi: ExtensionAPI) {
	const file = process.env.REEF_PI_RECEIPTS;
	const maxTurns = Number(process.env.REEF_PI_MAX_TURNS ?? "16");
	let turns = 0;
	pi.on("after_provider_response", (event) => {
		const headers = event.headers as Record<string, string>;
		if (file) appendFileSync(file, JSON.stringify({
			session: process.env.REEF_SESSION, status: event.status, at: new Date().toISOString(),
			record_id: headers["x-reef-agent-record-id"] ?? null, release_id: headers["x-reef-release-id"] ?? null,
		}) + "\n", "utf8");
	});
	pi.on("turn_end", async (_event, ctx) => {
		turns += 1;
		if (turns >= maxTurns) ctx.abort();
	});
}
"""


def base_url(request: Request) -> str:
    proto = request.headers.get("x-forwarded-proto", request.url.scheme).split(",")[0].strip()
    host = request.headers.get("x-forwarded-host", request.headers.get("host", "")).split(",")[0].strip()
    if proto not in ("http", "https") or not _HOST_RE.match(host):
        raise ReefError(400, "cannot tell this server's address from host / x-forwarded-host", param="host")
    return f"{proto}://{host}"


def _heredoc(target: str, text: str) -> str:
    """A shell command writing `text` to `target` (a shell word) with no expansion inside."""
    mark = f"REEF_{secrets.token_hex(8).upper()}"
    return f"cat > {target} <<'{mark}'\n{text if text.endswith(chr(10)) else text + chr(10)}{mark}\n"


def _pi_script(url: str, scenario: str, model: str, context: int, files: dict[str, str], release_id: str,
               install_url: str) -> str:
    provider = pi_models(url, scenario, model, context)
    settings = pi_settings(model, context)
    conf = {"url": url, "scenario": scenario, "model": model, "install_url": install_url,
            "release_id": release_id}
    writes = []
    for rel, text in sorted(files.items()):
        top = rel.split("/")[0]
        dest = _PI_PLACES.get(rel) or (rel if top == "skills" else f"reef-harness/{rel}")
        target = shlex.quote(f"agent/{dest}")
        writes.append(f'mkdir -p "$(dirname {target})"\n' + _heredoc(target, text))
    package = shlex.quote(f"{PI_PACKAGE}@{PI_VERSION}")
    head = f"""#!/bin/sh
# Reef: the Pi coding agent for scenario {scenario} at {url} (harness of {release_id}).
# Re-run it (or `reef-pi update`) to pull a newer harness. Nothing secret is written.
set -eu
REEF_HOME="${{REEF_HOME:-$HOME/.reef/pi}}"
REEF_BIN_DIR="${{REEF_BIN_DIR:-$HOME/.local/bin}}"
mkdir -p "$REEF_HOME/agent" "$REEF_BIN_DIR"
cd "$REEF_HOME"
if [ -n "${{REEF_PI:-}}" ]; then PI="$REEF_PI"
elif [ -x "$REEF_HOME/npm/node_modules/.bin/pi" ]; then PI="$REEF_HOME/npm/node_modules/.bin/pi"
elif command -v pi >/dev/null 2>&1; then PI="$(command -v pi)"
else
  command -v npm >/dev/null 2>&1 || {{ echo "reef: Pi needs Node.js and npm" >&2; exit 1; }}
  echo "reef: installing {PI_PACKAGE}@{PI_VERSION} into $REEF_HOME/npm" >&2
  npm install --prefix "$REEF_HOME/npm" --no-audit --no-fund --loglevel=error {package} >&2
  PI="$REEF_HOME/npm/node_modules/.bin/pi"
fi
printf '%s\\n' "$PI" > pi-path
"""
    tail = f"""chmod +x "$REEF_BIN_DIR/reef-pi"
echo "reef: reef-pi is in $REEF_BIN_DIR (scenario {scenario}, Pi at $PI)" >&2
case ":$PATH:" in *":$REEF_BIN_DIR:"*) ;; *) echo "reef: add $REEF_BIN_DIR to PATH" >&2 ;; esac
"""
    return "".join([
        head,
        _heredoc("agent/models.json", json.dumps(provider, indent=2)),
        _heredoc("agent/settings.json", json.dumps(settings, indent=2)),
        "# The served harness replaces what an earlier run of this script wrote.\n",
        "rm -rf agent/skills agent/reef-harness agent/SYSTEM.md agent/AGENTS.md\n",
        *writes,
        _heredoc("reef-receipts.ts", RECEIPTS_TS),
        _heredoc("reef.json", json.dumps(conf, indent=2)),
        _heredoc('"$REEF_BIN_DIR/reef-pi"', REEF_PI),
        tail,
    ])


def _openai_env(url: str, scenario: str) -> str:
    return f"""# Reef: environment for any OpenAI SDK, scenario {scenario}.  eval "$(curl -fsS '<this url>')"
export OPENAI_BASE_URL={shlex.quote(url + "/v1")}
export OPENAI_API_KEY="${{REEF_API_KEY:-unused}}"
export REEF_SCENARIO={shlex.quote(scenario)}
# Send `x-reef-scenario: $REEF_SCENARIO` with each request (and `x-reef-session` to group turns), e.g.
#   openai.OpenAI(default_headers={{"x-reef-scenario": os.environ["REEF_SCENARIO"]}})
# Rewards: POST $OPENAI_BASE_URL/../reef/report {{"agent_record_id": <x-reef-agent-record-id>, "score": 1}}
"""


def _json_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    # The script is text/plain, its errors are JSON: say so, or the document claims text/plain errors.
    ref = {"schema": {"$ref": "#/components/schemas/ErrorBody"}}
    return {s: {"description": e["description"], "content": {"application/json": ref}}
            for s, e in errors(*statuses).items()}


def _context_window(config: Any) -> int:
    """The engine's context length: `engine.max_model_len`, else the model's own (its config.json)."""
    if config.engine.max_model_len:
        return int(config.engine.max_model_len)
    try:
        model_config = json.loads((Path(config.model_path) / "config.json").read_text())
        return int(model_config.get("max_position_embeddings") or DEFAULT_CONTEXT)
    except (OSError, ValueError, TypeError):  # a hub id or an upstream's model: no local config to read
        return DEFAULT_CONTEXT


@router.get("/reef/harness/install", response_class=PlainTextResponse, responses=_json_errors(400, 422, 503))
async def install(request: Request, adapter: str = Query(description="pi | codex | claude-code | opencode | openai",
                                                         json_schema_extra={"enum": list(ADAPTERS)}),
                  scenario: str = Query(default="default", pattern=SCENARIO_RE.pattern)) -> PlainTextResponse:
    if adapter not in ADAPTERS:
        raise ReefError(400, f"unknown adapter {adapter!r}; known adapters: {', '.join(ADAPTERS)}", param="adapter",
                        code="unknown_adapter")
    st = get_state(request)
    url = base_url(request)
    if adapter == "openai":
        return PlainTextResponse(_openai_env(url, scenario))
    if adapter == "codex":
        return PlainTextResponse(codex_script(url, scenario, st.config.model_name, _context_window(st.config)))
    if adapter == "claude-code":
        return PlainTextResponse(claude_script(url, scenario, st.config.model_name, _context_window(st.config)))
    if adapter == "opencode":
        return PlainTextResponse(opencode_script(url, scenario, st.config.model_name, _context_window(st.config)))
    release_id, files = current_harness(st, scenario)
    install_url = f"{url}/reef/harness/install?adapter=pi&scenario={scenario}"
    script = _pi_script(url, scenario, st.config.model_name, _context_window(st.config), files, release_id,
                        install_url)
    return PlainTextResponse(script)  # text/plain: what curl | sh and a browser both take

