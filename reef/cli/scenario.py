"""`reef scenario list` and `reef scenario check NAME`: what is declared, and does it work."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reef.cli.common import UsageError
from reef.config import resolve
from reef.core.paths import DataDir

COMMANDS = ("scenario",)


def add_parsers(sub: Any) -> None:
    scenario = sub.add_parser("scenario", help="declared scenarios: list them, check one").add_subparsers(
        dest="scenario_cmd", required=True)
    ls = scenario.add_parser("list", help="every declared scenario: where, policy, recipe, eval size, reward")
    ls.add_argument("-c", "--config", type=Path, help="serve.yaml (default: ./serve.yaml if present)")
    check = scenario.add_parser(
        "check", help="validate a scenario and measure the served model's base success on its eval suite")
    check.add_argument("name")
    check.add_argument("-c", "--config", type=Path, help="serve.yaml (default: ./serve.yaml if present)")
    check.add_argument("--url", help="a running reef serve (its engine is asked, so nothing is recorded) or any "
                       "OpenAI-compatible server; unset: start the config's engine for the check")
    check.add_argument("--model", help="model name at --url (default: what it serves for the scenario)")
    check.add_argument("--samples", type=int, help="replies per eval task (default: the scenario's eval.samples)")
    check.add_argument("--limit", type=int, help="check only the first N eval tasks")


def run(args: argparse.Namespace) -> int:
    return _scenario(args)


def _scenario(args: argparse.Namespace) -> int:
    from reef.gate import check as checks
    from reef.scenario import ScenarioError

    config, _ = resolve(config_file=args.config)
    try:
        if args.scenario_cmd == "list":
            print(checks.render_table(checks.list_rows(config)))
            return 0
        if args.url is not None:
            result = checks.check(args.name, config, args.url, args.model, samples=args.samples, limit=args.limit)
        else:
            checks.find_scenario(args.name, config)  # a bad name fails before an engine starts
            if config.model is None and not Path(config.model_path).exists():
                raise UsageError(f"no model at {config.model_path}: build the embedded one (reef model fetch), "
                                 "set `model:` in serve.yaml, or give --url")
            from reef.engine.supervisor import EngineSupervisor

            engine = EngineSupervisor(config, DataDir(config.data_dir).logs / "scenario-check-vllm.log")
            print(f"reef: starting {config.model_path} for the check (give --url to use a running server)",
                  file=sys.stderr, flush=True)
            url = engine.start()
            try:
                result = checks.check(args.name, config, url, args.model, samples=args.samples, limit=args.limit)
            finally:
                engine.stop()
    except ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    except ConnectionError as exc:
        print(f"reef: {exc}", file=sys.stderr)
        return 1
    print(result.render())
    return 0
