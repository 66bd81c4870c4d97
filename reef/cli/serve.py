"""`reef serve` and `reef status`: start the gateway (and its engine), ask a running one what it serves."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reef.cli.common import DEFAULT_URL, request
from reef.config import describe, resolve

COMMANDS = ("serve", "status")


def add_parsers(sub: Any) -> None:
    serve = sub.add_parser("serve", help="start vLLM and the recording gateway")
    serve.add_argument("-c", "--config", type=Path, help="serve.yaml (default: ./serve.yaml if present)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--model", help="HF model id or local path (default: the embedded SmolLM2-135M-Instruct)")
    serve.add_argument("--upstream-url", help="record in front of this OpenAI-compatible server instead")
    serve.add_argument("--print-config", action="store_true", help="print the resolved config and exit")

    status = sub.add_parser("status", help="what a running server records and serves")
    status.add_argument("--url", default=DEFAULT_URL)


def run(args: argparse.Namespace) -> int:
    return _serve(args) if args.command == "serve" else _status(args)


def _serve(args: argparse.Namespace) -> int:
    cli = {"host": args.host, "port": args.port, "data_dir": args.data_dir, "model": args.model,
           "upstream.url": args.upstream_url}
    config, sources = resolve(cli=cli, config_file=args.config)
    if args.print_config:
        print(describe(config, sources))
        return 0
    from reef.server import serve

    serve(config)
    return 0


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    data = request("GET", f"{args.url}/reef/status").json()
    table = Table(title=f"reef at {args.url} — model {data['model']}, up {data['uptime_s']:.0f} s")
    for col in ("scenario", "records", "reports", "unflushed", "flush lag s", "serving release"):
        table.add_column(col)
    for name, s in data["scenarios"].items():
        table.add_row(name, str(s["records"]), str(s["reports"]), str(s["unflushed_records"]),
                      f"{s['flush_lag_s']:.2f}", s["serving_release"])
    console = Console()
    console.print(table)
    engine = data["engine"]
    console.print(f"engine: {engine['url']} healthy={engine['healthy']} managed={engine.get('managed')}")
    learner = data.get("learner") or {}
    if not learner.get("enabled"):
        console.print("learner: off", markup=False)
    for name, one in (learner.get("scenarios") or {}).items():
        rnd = one.get("round") or {}
        rung = one.get("harness") or one.get("exploring")  # the ladder's rung due or running, and why
        running = "running a round" + (f" ({rung})" if rung else "")
        state = (running if one.get("running") else rung or one.get("waiting")
                 or ("due" if one.get("pending") is not None else "not counted yet"))
        last = f"; round {rnd['round_id']} {rnd['state']}" if rnd else ""
        warm = one.get("warm") or {}  # the learner's warm-up of the next gate (reef.gate.warm)
        if warm.get("tasks"):
            kept = warm["kept_before"] + warm["sampled"]
            last += f"; next gate: the head's replies to {kept} of {warm['tasks']} tasks kept"
        console.print(f"learner {name} ({one.get('recipe')}): {state}; {one.get('rounds', 0)} rounds{last}",
                      markup=False, soft_wrap=True)
    return 0
