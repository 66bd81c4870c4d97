"""What every `reef` command group shares: the exit-code-2 error, the server URL, one HTTP call."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

import httpx

DEFAULT_URL = os.environ.get("REEF_URL", "http://127.0.0.1:8900")


class UsageError(Exception):
    """Bad input from the command line, or an operation the server refused: exit code 2."""


def finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("must be a finite number")
    return value


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One call to a running server; an unreachable one exits with code 1."""
    try:
        return httpx.request(method, url, timeout=30.0, **kwargs)
    except httpx.HTTPError as exc:
        print(f"reef: cannot reach {url}: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
