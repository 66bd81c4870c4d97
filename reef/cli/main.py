"""The `reef` command line. Each subcommand is a thin wrapper over a module that does the work.

Bad input exits with code 2 and a one-line message; an unreachable server exits with code 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from reef.cli.releases import ReleaseUsageError
from reef.config import ConfigError, describe, resolve

DEFAULT_URL = os.environ.get("REEF_URL", "http://127.0.0.1:8900")


class UsageError(Exception):
    """Bad input from the command line: exit code 2."""


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("must be a finite number")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reef", description="Serve, record, learn, gate and release.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start vLLM and the recording gateway")
    serve.add_argument("-c", "--config", type=Path, help="serve.yaml (default: ./serve.yaml if present)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--model", help="HF model id or local path (default: the embedded tiny model)")
    serve.add_argument("--upstream-url", help="record in front of this OpenAI-compatible server instead")
    serve.add_argument("--print-config", action="store_true", help="print the resolved config and exit")

    model = sub.add_parser("model", help="the embedded default model").add_subparsers(dest="model_cmd",
                                                                                    required=True)
    tiny = model.add_parser("build-tiny", help="train the tiny default model from scratch")
    tiny.add_argument("--out", type=Path, default=Path("data/models/tiny"))
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--if-stale", action="store_true",
                      help="build only when --out lacks the model this corpus and seed give")

    status = sub.add_parser("status", help="what a running server records and serves")
    status.add_argument("--url", default=DEFAULT_URL)

    records = sub.add_parser("records", help="browse recorded experience").add_subparsers(dest="records_cmd",
                                                                                         required=True)
    tail = records.add_parser("tail", help="the latest records of a scenario")
    tail.add_argument("--scenario", default="default")
    tail.add_argument("-n", type=int, default=10)
    tail.add_argument("--data-dir", type=Path, default=Path("data"))
    tail.add_argument("--follow", "-f", action="store_true")

    report = sub.add_parser("report", help="report a reward for a record")
    report.add_argument("record_id")
    report.add_argument("--score", type=_finite, required=True)
    report.add_argument("--feedback")
    report.add_argument("--scenario", default="default")
    report.add_argument("--url", default=DEFAULT_URL)

    recipe = sub.add_parser("recipe", help="learning recipes").add_subparsers(dest="recipe_cmd", required=True)
    run = recipe.add_parser("run", help="snapshot, train, register and gate one recipe (no DVC)")
    run.add_argument("name", help="short name (rft) or reference (recipes.rft.recipe:RFT)")
    run.add_argument("--params", type=Path, default=Path("params.yaml"))
    run.add_argument("--scenario", help="default: the only scenario params.yaml declares")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe param")
    run.add_argument("--no-eval", action="store_true", help="neither register nor gate the candidate")
    run.add_argument("--quiet", action="store_true")

    learn = sub.add_parser("learn", help="run a learning round (snapshot -> train -> evaluate)")
    learn.add_argument("--once", action="store_true", required=True, help="one round, by hand")
    learn.add_argument("--params", type=Path, default=Path("params.yaml"))
    learn.add_argument("--scenario", help="default: every scenario params.yaml declares, in turn")
    learn.add_argument("--no-dvc", action="store_true", help="run the stages directly, not via dvc repro")
    learn.add_argument("--quiet", action="store_true")

    simulate = sub.add_parser("simulate", help="play a scenario's users (its tasks and reward) through the gateway")
    simulate.add_argument("--scenario", required=True, help="a scenario declared by a package or serve.yaml")
    simulate.add_argument("-c", "--config", type=Path, help="serve.yaml declaring it (default: ./serve.yaml)")
    simulate.add_argument("--requests", type=int, default=200)
    simulate.add_argument("--concurrency", type=int, default=8)
    simulate.add_argument("--url", default=DEFAULT_URL)
    simulate.add_argument("--follow-up-share", type=float, default=0.2,
                          help="share of users who react to the reply (a doubt when wrong, a thank-you when right)")
    simulate.add_argument("--reactions", type=int, default=1, help="reactions per reacting user at most")
    simulate.add_argument("--no-reports", action="store_true", help="never POST /reef/report (next-turn signals only)")
    _add_scenario_parser(sub)
    _add_dashboard_parser(sub)
    from reef.cli import releases as release_cli

    release_cli.add_parsers(sub, DEFAULT_URL)
    return parser


def _serve(args: argparse.Namespace) -> int:
    cli = {"host": args.host, "port": args.port, "data_dir": args.data_dir, "model": args.model,
           "upstream.url": args.upstream_url}
    config, sources = resolve(cli=cli, config_file=args.config)
    if args.print_config:
        print(describe(config, sources))
        return 0
    from reef.server import serve

    serve(config)
    return 0


def _request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    try:
        return httpx.request(method, url, timeout=30.0, **kwargs)
    except httpx.HTTPError as exc:
        print(f"reef: cannot reach {url}: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    data = _request("GET", f"{args.url}/reef/status").json()
    table = Table(title=f"reef at {args.url} — model {data['model']}, up {data['uptime_s']:.0f} s")
    for col in ("scenario", "records", "reports", "unflushed", "flush lag s", "serving release"):
        table.add_column(col)
    for name, s in data["scenarios"].items():
        table.add_row(name, str(s["records"]), str(s["reports"]), str(s["unflushed_records"]),
                      f"{s['flush_lag_s']:.2f}", s["serving_release"])
    console = Console()
    console.print(table)
    engine = data["engine"]
    console.print(f"engine: {engine['url']} healthy={engine['healthy']} managed={engine.get('managed')}")
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
    body = {"agent_record_id": args.record_id, "score": args.score, "feedback": args.feedback}
    resp = _request("POST", f"{args.url}/reef/report", json=body, headers={"x-reef-scenario": args.scenario})
    if resp.status_code >= 400:
        message = resp.json().get("error", {}).get("message", resp.text)
        raise UsageError(f"report refused ({resp.status_code}): {message}")
    print(resp.json()["report_id"])
    return 0


def _recipe(args: argparse.Namespace) -> int:
    from reef.learn.pipeline import parse_overrides, run_recipe
    from reef.recipe.snapshot import EmptySnapshotError

    try:
        overrides = parse_overrides(args.set)
        out = run_recipe(args.name, args.params, overrides, scenario=args.scenario, evaluate=not args.no_eval,
                         progress=not args.quiet)
    except (ValueError, TypeError, LookupError, ModuleNotFoundError, EmptySnapshotError) as exc:
        raise UsageError(str(exc)) from exc
    print(json.dumps(out, indent=2, default=str))
    return 0


def _learn(args: argparse.Namespace) -> int:
    from reef.learn.pipeline import Params, learn_once

    if not args.params.is_file():
        raise UsageError(f"params file not found: {args.params}")
    try:
        params = Params.read(args.params)
        names = [params.scenario(args.scenario)] if args.scenario else params.scenarios
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    out = {name: learn_once(args.params, name, use_dvc=False if args.no_dvc else None, progress=not args.quiet)
           for name in names}
    # One scenario: its round, as before; several: one round each, by scenario.
    print(json.dumps(out[names[0]] if len(names) == 1 else out, indent=2, default=str))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from reef.scenario import ScenarioError
    from reef.traffic.simulate import simulate

    if not 0.0 <= args.follow_up_share <= 1.0 or args.reactions < 0:
        raise UsageError("--follow-up-share must be in [0, 1] and --reactions >= 0")
    config, _ = resolve(config_file=args.config)
    try:
        summary = simulate(args.url, args.scenario, requests=args.requests, concurrency=args.concurrency,
                           config=config, follow_up_share=args.follow_up_share, reactions=args.reactions,
                           report=not args.no_reports)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    print(summary.render())
    return 0


def _add_scenario_parser(sub: Any) -> None:
    scenario = sub.add_parser("scenario", help="declared scenarios: list them, check one").add_subparsers(
        dest="scenario_cmd", required=True)
    ls = scenario.add_parser("list", help="every declared scenario: where, policy, recipe, eval size, reward")
    ls.add_argument("-c", "--config", type=Path, help="serve.yaml (default: ./serve.yaml if present)")
    check = scenario.add_parser(
        "check", help="validate a scenario and measure the served model's base success on its eval suite")
    check.add_argument("name")
    check.add_argument("-c", "--config", type=Path, help="serve.yaml (default: ./serve.yaml if present)")
    check.add_argument("--url", help="a running reef serve (its engine is asked, so nothing is recorded) or any "
                       "OpenAI-compatible server; unset: start the config's engine for the check")
    check.add_argument("--model", help="model name at --url (default: what it serves for the scenario)")
    check.add_argument("--samples", type=int, help="replies per eval task (default: the scenario's eval.samples)")
    check.add_argument("--limit", type=int, help="check only the first N eval tasks")


def _scenario(args: argparse.Namespace) -> int:
    from reef.gate import check as checks
    from reef.scenario import ScenarioError

    config, _ = resolve(config_file=args.config)
    try:
        if args.scenario_cmd == "list":
            print(checks.render_table(checks.list_rows(config)))
            return 0
        if args.url is not None:
            result = checks.check(args.name, config, args.url, args.model, samples=args.samples, limit=args.limit)
        else:
            checks.find_scenario(args.name, config)  # a bad name fails before an engine starts
            if config.model is None and not Path(config.model_path).exists():
                raise UsageError(f"no model at {config.model_path}: build the embedded one (reef model build-tiny), "
                                 "set `model:` in serve.yaml, or give --url")
            from reef.engine.supervisor import EngineSupervisor

            engine = EngineSupervisor(config, Path(config.data_dir) / "logs" / "scenario-check-vllm.log")
            print(f"reef: starting {config.model_path} for the check (give --url to use a running server)",
                  file=sys.stderr, flush=True)
            url = engine.start()
            try:
                result = checks.check(args.name, config, url, args.model, samples=args.samples, limit=args.limit)
            finally:
                engine.stop()
    except ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    except ConnectionError as exc:
        print(f"reef: {exc}", file=sys.stderr)
        return 1
    print(result.render())
    return 0


def _add_dashboard_parser(sub: Any) -> None:
    dash = sub.add_parser("dashboard", help="the Streamlit dashboard on 127.0.0.1 (admin token: REEF_ADMIN_TOKEN)")
    dash.add_argument("--data-dir", type=Path, default=Path(os.environ.get("REEF_DATA_DIR") or "data"))
    dash.add_argument("--url", default=DEFAULT_URL, help="the running reef serve")
    dash.add_argument("--port", type=int, default=8501)


def _dashboard(args: argparse.Namespace) -> int:
    """`streamlit run dashboard/app.py` on loopback; the dashboard folder sits at the repository root
    (next to reef/), found from the working directory first, then from this package's location."""
    candidates = [Path.cwd() / "dashboard" / "app.py", Path(__file__).resolve().parents[1] / "dashboard" / "app.py"]
    app = next((p for p in candidates if p.is_file()), None)
    if app is None:
        raise UsageError("dashboard/app.py not found: run reef dashboard from the Reef repository")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", "127.0.0.1",
           "--server.headless", "true", "--server.port", str(args.port), "--browser.gatherUsageStats", "false",
           "--", "--data-dir", str(args.data_dir.resolve()), "--url", args.url]
    print(f"reef dashboard: http://127.0.0.1:{args.port} (data {args.data_dir}, server {args.url})", flush=True)
    os.execv(sys.executable, cmd)  # streamlit takes over this process: signals go straight to it


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("REEF_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per proxied request is noise
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "model":
            from reef.model.tiny import main_build_tiny

            return main_build_tiny(["--out", str(args.out), "--seed", str(args.seed),
                                    *(["--if-stale"] if args.if_stale else [])])
        if args.command == "status":
            return _status(args)
        if args.command == "records":
            return _tail(args)
        if args.command == "report":
            return _report(args)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "dashboard":
            return _dashboard(args)
        if args.command == "scenario":
            return _scenario(args)
        if args.command == "recipe":
            return _recipe(args)
        if args.command == "learn":
            return _learn(args)
        from reef.cli import releases as release_cli

        if args.command in release_cli.COMMANDS:
            return release_cli.run(args)
    except (ConfigError, UsageError, ReleaseUsageError) as exc:
        print(f"reef: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
