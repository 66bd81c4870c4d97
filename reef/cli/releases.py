"""`reef releases | release | rollback | lineage | candidates | gate`: the release chain from the shell.

Reads (`releases`, `lineage`, `candidates`) come from the data directory (the chains from PostgreSQL
when REEF_STATE__URL, serve.yaml's `state.url`, is set), so they work without a server; changes
(`release`, `rollback`) go through the running server's API, which swaps the engine, with the admin
token from `--token` or REEF_ADMIN_TOKEN. `gate` registers a recipe's candidate folder and evaluates
it locally against the scenario's head.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.cli.common import UsageError
from reef.core.paths import DEFAULT_DATA_DIR, DataDir

if TYPE_CHECKING:
    from reef.registry.schema import Release

COMMANDS = ("releases", "release", "rollback", "lineage", "candidates", "gate", "track")


def add_parsers(sub: Any, default_url: str) -> None:
    def common(p: argparse.ArgumentParser, url: bool = False) -> None:
        p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("REEF_DATA_DIR") or DEFAULT_DATA_DIR))
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if url:
            p.add_argument("--url", default=default_url)
            p.add_argument("--token", default=None, help="admin token (default: REEF_ADMIN_TOKEN)")
            p.add_argument("--by", default=os.environ.get("USER"), help="who approves (recorded in the release)")

    p = sub.add_parser("releases", help="each scenario's release chain, newest last")
    p.add_argument("--scenario", default=None, help="default: every scenario with a release chain")
    common(p)
    p = sub.add_parser("release", help="release a gate-selected candidate (moves the head, hot-swaps)")
    p.add_argument("candidate", help="candidate id or unique prefix (see `reef candidates`)")
    p.add_argument("--expect", required=True, metavar="HEAD", help="the head you are replacing, e.g. sentiment@r3")
    p.add_argument("--scenario", default=None, help="default: the candidate's scenario")
    common(p, url=True)
    p = sub.add_parser("rollback", help="serve an older release's content again, as a new release")
    p.add_argument("release", metavar="RELEASE", help="e.g. sentiment@r1")
    p.add_argument("--expect", required=True, metavar="HEAD")
    common(p, url=True)
    p = sub.add_parser("lineage", help="a release and its ancestors, with where each came from")
    p.add_argument("release", metavar="RELEASE")
    common(p)
    p = sub.add_parser("candidates", help="registered candidates and the gate's decisions")
    p.add_argument("--scenario", default=None)
    common(p)
    p = sub.add_parser("track", help="DVC-track the artifact store (the weights releases serve); then dvc push")
    common(p)
    p = sub.add_parser("gate", help="register a candidate folder and evaluate it against the head")
    p.add_argument("path", type=Path, help="a recipe's candidate folder (with candidate.json)")
    p.add_argument("--samples", type=int, default=None, help="replies per task and arm; unset: the scenario's")
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--engine-url", default=None,
                   help="the serving vLLM's OpenAI server (not the gateway) to sample through; unset: transformers")
    p.add_argument("--engine-model", default=None, help="the base model's name on that server")
    common(p)


def run(args: argparse.Namespace) -> int:
    import sys

    import httpx

    from reef.client import ReefAPIError
    from reef.registry.candidates import CandidateError
    from reef.registry.chain import ReleaseError

    try:
        return _COMMANDS[args.command](args)
    except httpx.HTTPError as exc:
        print(f"reef: cannot reach {getattr(args, 'url', 'the server')}: {exc}", file=sys.stderr)
        return 1
    except (ReefAPIError, ReleaseError, CandidateError, LookupError, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def _scenario_of(release_id: str) -> str:
    from reef.registry.schema import RELEASE_ID_RE

    match = RELEASE_ID_RE.match(release_id)
    if match is None:
        raise UsageError(f"{release_id!r} is not a release id like sentiment@r3")
    return match["scenario"]


def _print(args: argparse.Namespace, data: Any, rows: list[list[str]], header: list[str], title: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.width = max(console.width, 150)  # ids stay readable when stdout is not a terminal
    console.print(table)


def _releases(args: argparse.Namespace) -> int:
    from reef.registry.state import ReleaseState

    state = ReleaseState(args.data_dir)
    where = "the state database" if state.url else args.data_dir
    if args.scenario is not None:
        if not state.has_chain(args.scenario):
            raise UsageError(f"scenario {args.scenario} has no releases in {where}")
        names = [args.scenario]
    else:
        names = state.scenarios()
        if not names:
            raise UsageError(f"no scenario has releases in {where}")
    chains = {name: state.chain(name).releases() for name in names}
    if args.json:  # one scenario: its list, as before; every scenario: lists by scenario
        data: Any = {name: [r.model_dump(mode="json") for r in rs] for name, rs in chains.items()}
        print(json.dumps(data[names[0]] if args.scenario else data, indent=2, default=str))
        return 0
    for name, releases in chains.items():
        rows = [[r.release_id, r.operation, r.kind, r.content_id[:12], (r.harness_id or "")[:12], _split(r),
                 r.approved_by or "", r.restores or "", _gate_line(r.evaluation), f"{r.created_at:%m-%d %H:%M:%S}"]
                for r in releases]
        _print(args, None, rows,
               ["release", "operation", "kind", "content", "harness", "split", "approved by", "restores",
                "evaluation", "created"],
               f"{name}: head {releases[-1].release_id}")
    return 0


def _gate_line(evaluation: dict[str, Any] | None) -> str:
    if not evaluation or evaluation.get("delta") is None:
        return ""
    return (f"{evaluation['candidate_success']:.2f} vs {evaluation['head_success']:.2f}, "
            f"CI [{evaluation['ci_low']:+.2f}, {evaluation['ci_high']:+.2f}]")


def _release(args: argparse.Namespace) -> int:
    from reef.client import ReefClient
    from reef.registry.candidates import find_candidate

    scenario = args.scenario or find_candidate(args.data_dir, args.candidate).scenario
    out = ReefClient(args.url, args.token).release(scenario, args.candidate, args.expect, approved_by=args.by)
    release = out["release"]
    print(json.dumps(out, indent=2) if args.json else
          f"{release['release_id']} serves {release['content_id'][:12]} ({release['kind']}); "
          f"swap {out['swap']['ms']:.0f} ms")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from reef.client import ReefClient

    out = ReefClient(args.url, args.token).rollback(_scenario_of(args.release), args.release, args.expect,
                                                    approved_by=args.by)
    release = out["release"]
    print(json.dumps(out, indent=2) if args.json else
          f"{release['release_id']} serves {args.release}'s content again ({release['content_id'][:12]})")
    return 0


def _split(release: Release) -> str:
    """A routing release's canary arm: `30% -> <candidate>`."""
    split = release.split()
    return f"{split.share:.0%} -> {split.content_id[:12]}" if split else ""


def _lineage(args: argparse.Namespace) -> int:
    from reef.registry.state import open_chain

    releases = open_chain(args.data_dir, _scenario_of(args.release)).lineage(args.release)
    rows = []
    for r in releases:
        lin = r.lineage
        rows.append([r.release_id, r.operation, r.content_id[:12], (r.harness_id or "")[:12], _split(r),
                     (lin.recipe or "").split(":")[-1] if lin else "",
                     (lin.snapshot_id or "") if lin else "", (lin.parent_release or "") if lin else "",
                     (lin.code_commit or "")[:12] if lin else ""])
    _print(args, [r.model_dump(mode="json") for r in releases], rows,
           ["release", "operation", "content", "harness", "split", "recipe", "snapshot", "trained on traffic of",
            "code"],
           f"lineage of {args.release} (--json for params and versions)")
    return 0


def _candidates(args: argparse.Namespace) -> int:
    from reef.registry.candidates import CandidateRegistry

    scenarios = [args.scenario] if args.scenario else CandidateRegistry.scenarios(args.data_dir)
    views = sorted((v for s in scenarios for v in CandidateRegistry(args.data_dir, s).list()),
                   key=lambda v: v.created_at, reverse=True)
    rows = [[v.candidate_id[:12], v.scenario, v.kind, v.status, v.release_id or "",
             (v.lineage.recipe or "").split(":")[-1] if v.lineage else "",
             _gate_line(v.gate.summary()) if v.gate else ""] for v in views]
    _print(args, [v.model_dump(mode="json") for v in views], rows,
           ["candidate", "scenario", "kind", "status", "release", "recipe", "gate: success vs head, CI"],
           "candidates")
    return 0


def _gate(args: argparse.Namespace) -> int:
    from reef.config import GateSettings
    from reef.gate.evaluate import evaluate_candidate
    from reef.registry.candidates import register_candidate
    from reef.registry.schema import Candidate
    from reef.sampling.engine import engine_of

    if Candidate.read_if_any(args.path) is None:
        raise UsageError(f"{args.path} is not a candidate folder (no candidate.json)")
    try:
        engine = engine_of(args.engine_url, args.engine_model)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    view = register_candidate(args.data_dir, args.path)
    result = evaluate_candidate(args.data_dir, view.candidate_id,
                                GateSettings(samples=args.samples, min_delta=args.min_delta), engine=engine)
    if args.json:
        print(json.dumps({"candidate_id": view.candidate_id, **result.summary()}, indent=2))
    else:
        print(f"candidate {view.candidate_id[:12]} ({view.scenario}): {result.decision}: {result.reason}")
    return 0 if result.decision == "select" else 1


def _track(args: argparse.Namespace) -> int:
    """`dvc add <data_dir>/artifacts`: the weights go to DVC's cache and remote, a small pointer file
    (with the release chains, plain text) goes to git. Run it in the project's DVC repository."""
    import subprocess

    artifacts = DataDir(args.data_dir).artifacts
    if not artifacts.is_dir():
        raise UsageError(f"no artifact store at {artifacts}")
    if not Path(".dvc").is_dir():
        raise UsageError("not a DVC repository here: run `dvc init` (or cd to the project root)")
    done = subprocess.run(["dvc", "add", str(artifacts)], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"dvc add failed: {done.stderr.strip() or done.stdout.strip()}")
    pointer = artifacts.with_name("artifacts.dvc")
    print(f"tracked {artifacts} in DVC ({pointer}); next: git add {pointer} && git commit && dvc push")
    return 0


_COMMANDS = {"track": _track, "releases": _releases, "release": _release, "rollback": _rollback, "lineage": _lineage,
             "candidates": _candidates, "gate": _gate}
