"""`reef records tail` and `reef report`: read what was recorded, report a reward for a record."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from reef.cli.common import DEFAULT_URL, UsageError, finite, request
from reef.core.paths import DEFAULT_DATA_DIR

COMMANDS = ("records", "report")


def add_parsers(sub: Any) -> None:
    records = sub.add_parser("records", help="browse recorded experience").add_subparsers(dest="records_cmd",
                                                                                         required=True)
    tail = records.add_parser("tail", help="the latest records of a scenario")
    tail.add_argument("--scenario", default="default")
    tail.add_argument("-n", type=int, default=10)
    tail.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    tail.add_argument("--follow", "-f", action="store_true")

    report = sub.add_parser("report", help="report a reward for a record")
    report.add_argument("record_id")
    report.add_argument("--score", type=finite, required=True)
    report.add_argument("--feedback")
    report.add_argument("--scenario", default="default")
    report.add_argument("--url", default=DEFAULT_URL)


def run(args: argparse.Namespace) -> int:
    return _tail(args) if args.command == "records" else _report(args)


def _tail(args: argparse.Namespace) -> int:
    from reef.experience.load import load

    seen: set[str] = set()
    while True:
        frame = load(args.scenario, args.data_dir).lazy().sort("created_at").tail(args.n).collect()
        for row in frame.iter_rows(named=True):
            if row["record_id"] in seen:
                continue
            seen.add(row["record_id"])
            prompt = (row["messages"] or [{}])[-1].get("content") or ""
            reply = ((row["choices"] or [{}])[0].get("content") or "").replace("\n", " ")
            score = row.get("score")
            print(f"{row['created_at']:%H:%M:%S} {row['record_id']} {row['release_id']} "
                  f"score={'-' if score is None else f'{score:g}'} | {prompt[:40]!r} -> {reply[:60]!r}")
        if not args.follow:
            return 0
        time.sleep(1.0)


def _report(args: argparse.Namespace) -> int:
    body = {"agent_record_id": args.record_id, "score": args.score, "feedback": args.feedback}
    resp = request("POST", f"{args.url}/reef/report", json=body, headers={"x-reef-scenario": args.scenario})
    if resp.status_code >= 400:
        message = resp.json().get("error", {}).get("message", resp.text)
        raise UsageError(f"report refused ({resp.status_code}): {message}")
    print(resp.json()["report_id"])
    return 0
