"""`reef model build-tiny`: the embedded default model, built from scratch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

COMMANDS = ("model",)


def add_parsers(sub: Any) -> None:
    model = sub.add_parser("model", help="the embedded default model").add_subparsers(dest="model_cmd",
                                                                                    required=True)
    tiny = model.add_parser("build-tiny", help="train the tiny default model from scratch")
    tiny.add_argument("--out", type=Path, default=Path("data/models/tiny"))
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--if-stale", action="store_true",
                      help="build only when --out lacks the model this corpus and seed give")


def run(args: argparse.Namespace) -> int:
    from reef.model.tiny import main_build_tiny

    return main_build_tiny(["--out", str(args.out), "--seed", str(args.seed),
                            *(["--if-stale"] if args.if_stale else [])])
