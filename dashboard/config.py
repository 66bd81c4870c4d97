"""Where the dashboard reads from and talks to: the data dir, the server URL and the admin token.

Precedence: command line (`streamlit run dashboard/app.py -- --data-dir data --url ...`, which is
what `reef dashboard` runs) > environment (REEF_DATA_DIR, REEF_URL, REEF_ADMIN_TOKEN) > defaults.
The token is taken from the environment only (a command line is visible to every local user);
without one, the Release page asks for it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_URL = "http://127.0.0.1:8900"


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    url: str
    admin_token: str | None


def settings(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--url")
    # Known args only: under `streamlit run` argv is what follows `--`; under pytest it is pytest's.
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    data_dir = args.data_dir or Path(os.environ.get("REEF_DATA_DIR") or "data")
    url = (args.url or os.environ.get("REEF_URL") or DEFAULT_URL).rstrip("/")
    return Settings(data_dir=data_dir.resolve(), url=url, admin_token=os.environ.get("REEF_ADMIN_TOKEN") or None)
