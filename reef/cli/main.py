"""The `reef` command: its groups, one module each in this package, and how errors exit.

Bad input exits with code 2 and a one-line message; an unreachable server exits with code 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from types import ModuleType

from reef.cli import connect, dashboard, experience, learn, model, releases, scenario, serve, traffic
from reef.cli.common import DEFAULT_URL, UsageError
from reef.config import ConfigError
from reef.model.smollm2 import ModelBuildError

# In `reef --help` order.
GROUPS: tuple[ModuleType, ...] = (serve, model, experience, learn, traffic, scenario, dashboard, releases, connect)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="reef", description="Serve, record, learn, gate and release.")
    sub = top.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        if group is releases:
            group.add_parsers(sub, DEFAULT_URL)
        else:
            group.add_parsers(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("REEF_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per proxied request is noise
    args = parser().parse_args(argv)
    group = next(g for g in GROUPS if args.command in g.COMMANDS)
    try:
        return int(group.run(args))
    except (ConfigError, UsageError, ModelBuildError) as exc:
        print(f"reef: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
