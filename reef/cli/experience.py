"""`reef records tail`, `reef records import` and `reef report`: read what was recorded, import
demonstrations, report a reward for a record."""

from __future__ import annotations

import argparse
import json
import os
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

    imp = records.add_parser("import", help="import demonstrations (JSONL or a Hugging Face dataset) as "
                             "rewarded records a recipe trains on")
    imp.add_argument("path", type=Path, help="a .jsonl file, or a dataset folder/file `datasets` reads; each row "
                     "has `messages` (the prompt), `completion` (the reply), optional `tools` and `score`")
    imp.add_argument("--scenario", required=True)
    imp.add_argument("--url", default=DEFAULT_URL)
    imp.add_argument("--token", default=None, help="admin token (default: REEF_ADMIN_TOKEN)")

    report = sub.add_parser("report", help="report a reward for a record")
    report.add_argument("record_id")
    report.add_argument("--score", type=finite, required=True)
    report.add_argument("--feedback")
    report.add_argument("--correction", help="the reply that was wanted instead (a target rft trains on): text, "
                        "or an assistant message as JSON (a corrected tool call)")
    report.add_argument("--scenario", default="default")
    report.add_argument("--url", default=DEFAULT_URL)


def run(args: argparse.Namespace) -> int:
    if args.command == "report":
        return _report(args)
    return _import(args) if args.records_cmd == "import" else _tail(args)


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise UsageError(f"{path}:{n}: not JSON ({exc})") from exc
        return rows
    import datasets

    try:
        data = (datasets.load_from_disk(str(path)) if path.is_dir() and (path / "dataset_info.json").exists()
                else datasets.load_dataset(str(path), split="train"))
    except Exception as exc:  # datasets raises many types for an unreadable path: all are the user's input
        raise UsageError(f"{path}: not a dataset `datasets` can read ({exc})") from exc
    keep = [c for c in ("messages", "completion", "tools", "score") if c in data.column_names]
    return [{k: row[k] for k in keep if row[k] is not None} for row in data]


def _import(args: argparse.Namespace) -> int:
    rows = _rows(args.path)
    if not rows:
        raise UsageError(f"{args.path}: no demonstrations in it")
    token = args.token or os.environ.get("REEF_ADMIN_TOKEN")
    headers = {"x-reef-scenario": args.scenario, **({"authorization": f"Bearer {token}"} if token else {})}
    imported = 0
    for start in range(0, len(rows), 256):  # the route takes at most 256 per call
        resp = request("POST", f"{args.url}/reef/records", json={"demonstrations": rows[start:start + 256]},
                       headers=headers)
        if resp.status_code >= 400:
            message = resp.json().get("error", {}).get("message", resp.text)
            raise UsageError(f"import refused after {imported} of {len(rows)} (rows {start}+): {message}")
        imported += len(resp.json()["agent_record_ids"])
    print(f"imported {imported} demonstrations into scenario {args.scenario!r}")
    return 0


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
    from reef.experience.schema import correction_message

    body = {"agent_record_id": args.record_id, "score": args.score, "feedback": args.feedback}
    if args.correction is not None:
        body["correction"] = correction_message(args.correction) or args.correction
    resp = request("POST", f"{args.url}/reef/report", json=body, headers={"x-reef-scenario": args.scenario})
    if resp.status_code >= 400:
        message = resp.json().get("error", {}).get("message", resp.text)
        raise UsageError(f"report refused ({resp.status_code}): {message}")
    print(resp.json()["report_id"])
    return 0
