"""`reef dashboard`: the Streamlit dashboard on loopback, over a data dir and a running server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from reef.cli.common import DEFAULT_URL, UsageError
from reef.core.paths import DEFAULT_DATA_DIR

COMMANDS = ("dashboard",)


def add_parsers(sub: Any) -> None:
    dash = sub.add_parser("dashboard", help="the Streamlit dashboard on 127.0.0.1 (admin token: REEF_ADMIN_TOKEN)")
    dash.add_argument("--data-dir", type=Path, default=Path(os.environ.get("REEF_DATA_DIR") or DEFAULT_DATA_DIR))
    dash.add_argument("--url", default=DEFAULT_URL, help="the running reef serve")
    dash.add_argument("--port", type=int, default=8501)


def run(args: argparse.Namespace) -> int:
    return _dashboard(args)


def _dashboard(args: argparse.Namespace) -> int:
    """`streamlit run dashboard/app.py` on loopback; the dashboard folder sits at the repository root
    (next to reef/), found from the working directory first, then from this package's location."""
    candidates = [Path.cwd() / "dashboard" / "app.py", Path(__file__).resolve().parents[2] / "dashboard" / "app.py"]
    app = next((p for p in candidates if p.is_file()), None)
    if app is None:
        raise UsageError("dashboard/app.py not found: run reef dashboard from the Reef repository")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", "127.0.0.1",
           "--server.headless", "true", "--server.port", str(args.port), "--browser.gatherUsageStats", "false",
           "--", "--data-dir", str(args.data_dir.resolve()), "--url", args.url]
    print(f"reef dashboard: http://127.0.0.1:{args.port} (data {args.data_dir}, server {args.url})", flush=True)
    os.execv(sys.executable, cmd)  # streamlit takes over this process: signals go straight to it
