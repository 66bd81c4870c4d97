"""`reef recipe run` and `reef learn --once`: a recipe or a learning round by hand, from params.yaml."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from reef.cli.common import UsageError

COMMANDS = ("recipe", "learn")


def add_parsers(sub: Any) -> None:
    recipe = sub.add_parser("recipe", help="learning recipes").add_subparsers(dest="recipe_cmd", required=True)
    run = recipe.add_parser("run", help="snapshot, train, register and gate one recipe (no DVC)")
    run.add_argument("name", help="short name (rft) or reference (recipes.rft.recipe:RFT)")
    run.add_argument("--params", type=Path, default=Path("params.yaml"))
    run.add_argument("--scenario", help="default: the only scenario params.yaml declares")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe param")
    run.add_argument("--no-eval", action="store_true", help="neither register nor gate the candidate")
    run.add_argument("--launcher", choices=["process", "accelerate"], default="process",
                     help="accelerate: train through `accelerate launch`, several processes (reef.learn.launch)")
    run.add_argument("--num-processes", type=int, default=2, help="with --launcher accelerate (default 2)")
    run.add_argument("--accelerate-config", type=Path, help="with --launcher accelerate: an accelerate config "
                     "file (DDP, FSDP, DeepSpeed); it decides the processes")
    run.add_argument("--quiet", action="store_true")

    learn = sub.add_parser("learn", help="run a learning round (snapshot -> train -> evaluate)")
    learn.add_argument("--once", action="store_true", required=True, help="one round, by hand")
    learn.add_argument("--params", type=Path, default=Path("params.yaml"))
    learn.add_argument("--scenario", help="default: every scenario params.yaml declares, in turn")
    learn.add_argument("--no-dvc", action="store_true", help="run the stages directly, not via dvc repro")
    learn.add_argument("--quiet", action="store_true")


def run(args: argparse.Namespace) -> int:
    return _recipe(args) if args.command == "recipe" else _learn(args)


def _recipe(args: argparse.Namespace) -> int:
    from reef.config import parse_overrides
    from reef.config.learner import AccelerateSettings
    from reef.learn.pipeline import run_recipe
    from reef.recipe.snapshot import EmptySnapshotError

    try:
        overrides = parse_overrides(args.set)
        launcher = (AccelerateSettings(num_processes=args.num_processes, config_file=args.accelerate_config)
                    if args.launcher == "accelerate" else None)
        out = run_recipe(args.name, args.params, overrides, scenario=args.scenario, evaluate=not args.no_eval,
                         progress=not args.quiet, launcher=launcher)
    except (ValueError, TypeError, LookupError, ModuleNotFoundError, EmptySnapshotError) as exc:
        raise UsageError(str(exc)) from exc
    print(json.dumps(out, indent=2, default=str))
    return 0


def _learn(args: argparse.Namespace) -> int:
    from reef.config import PipelineParams
    from reef.learn.pipeline import checked, learn_once

    if not args.params.is_file():
        raise UsageError(f"params file not found: {args.params}")
    try:
        params = PipelineParams.read(args.params)
        names = [params.scenario(args.scenario)] if args.scenario else params.scenario_names
        for name in names:  # every scenario's recipe fields, before the first round
            checked(params, name)
    except (ValueError, LookupError, ImportError) as exc:
        raise UsageError(str(exc)) from exc
    out = {name: learn_once(args.params, name, use_dvc=False if args.no_dvc else None, progress=not args.quiet)
           for name in names}
    # One scenario: its round, as before; several: one round each, by scenario.
    print(json.dumps(out[names[0]] if len(names) == 1 else out, indent=2, default=str))
    return 0
