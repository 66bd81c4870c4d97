"""`reef connect <agent>`: point Claude Code, Codex, OpenCode or Pi at a running `reef serve`;
`reef connect <agent> --undo` puts the agent's config back (`reef.gateway.connect`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from reef.cli.common import DEFAULT_URL, UsageError, request
from reef.registry.schema import SCENARIO_RE

COMMANDS = ("connect",)
DEFAULT_CONTEXT = 4096  # when the server does not say (an upstream without max_model_len)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("connect", help="point an agent's own config at a running reef serve (--undo: put it back)")
    p.add_argument("agent", help="claude-code | codex | opencode | pi")
    p.add_argument("--undo", action="store_true", help="restore the agent's config as it was before reef connect")
    p.add_argument("--url", default=DEFAULT_URL, help="the running reef serve")
    p.add_argument("--scenario", default="default", help="the scenario the agent's calls are recorded in")
    p.add_argument("--model", help="the served model (default: what the server's /v1/models lists first)")
    p.add_argument("--context", type=int, help="the model's context window (default: the server's max_model_len)")


def _served(url: str) -> tuple[str, int]:
    resp = request("GET", f"{url}/v1/models")
    if resp.status_code != 200 or not resp.json().get("data"):
        raise UsageError(f"{url}/v1/models answered {resp.status_code}: {resp.text[:200]}")
    first = resp.json()["data"][0]
    return str(first["id"]), int(first.get("max_model_len") or DEFAULT_CONTEXT)


def run(args: argparse.Namespace) -> int:
    # Imported here: the other commands of `reef` load no module of the gateway (tests/test_layers.py).
    from reef.gateway.connect import AGENTS, ConnectError, connect, undo

    home = Path.home()
    try:
        if args.agent not in AGENTS:
            raise ConnectError(f"unknown agent {args.agent!r}; known agents: {', '.join(AGENTS)}")
        if args.undo:
            for path in undo(args.agent, home):
                print(f"reef: restored {path}")
            return 0
        if not SCENARIO_RE.fullmatch(args.scenario):
            raise UsageError(f"--scenario must match {SCENARIO_RE.pattern}")
        if args.context is not None and args.context < 256:
            raise UsageError("--context must be at least 256 tokens")
        url = args.url.rstrip("/")
        model, context = (args.model, args.context) if args.model and args.context else _served(url)
        model, context = args.model or model, args.context or context
        for path in connect(args.agent, url, args.scenario, model, context, home, os.environ):
            print(f"reef: wrote {path}")
    except ConnectError as exc:
        raise UsageError(str(exc)) from exc
    print(f"reef: {args.agent} -> {url} (scenario {args.scenario}); undo: reef connect {args.agent} --undo")
    return 0
