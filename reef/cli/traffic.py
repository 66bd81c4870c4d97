"""`reef simulate`: play a scenario's users (its tasks and reward) through a running gateway."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reef.cli.common import DEFAULT_URL, UsageError
from reef.config import resolve

COMMANDS = ("simulate",)


def add_parsers(sub: Any) -> None:
    simulate = sub.add_parser("simulate", help="play a scenario's users (its tasks and reward) through the gateway")
    simulate.add_argument("--scenario", required=True, help="a scenario declared by a package or serve.yaml")
    simulate.add_argument("-c", "--config", type=Path, help="serve.yaml declaring it (default: ./serve.yaml)")
    simulate.add_argument("--requests", type=int, default=200)
    simulate.add_argument("--concurrency", type=int, default=8)
    simulate.add_argument("--url", default=DEFAULT_URL)
    simulate.add_argument("--follow-up-share", type=float, default=0.2,
                          help="share of users who react to the reply (a doubt when wrong, a thank-you when right)")
    simulate.add_argument("--reactions", type=int, default=1, help="reactions per reacting user at most")
    simulate.add_argument("--no-reports", action="store_true", help="never POST /reef/report (next-turn signals only)")


def run(args: argparse.Namespace) -> int:
    return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    from reef.scenario import ScenarioError
    from reef.traffic.simulate import simulate

    if not 0.0 <= args.follow_up_share <= 1.0 or args.reactions < 0:
        raise UsageError("--follow-up-share must be in [0, 1] and --reactions >= 0")
    config, _ = resolve(config_file=args.config)
    try:
        summary = simulate(args.url, args.scenario, requests=args.requests, concurrency=args.concurrency,
                           config=config, follow_up_share=args.follow_up_share, reactions=args.reactions,
                           report=not args.no_reports)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    print(summary.render())
    return 0
