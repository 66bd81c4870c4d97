"""The learning pipeline under real DVC in a temporary git repository: base-model -> demo-traffic ->
snapshot -> train -> evaluate (once per scenario: `snapshot@demo-add`, ...); a second `dvc repro` is
a no-op, `dvc exp run -S train.<param>` reruns only train and evaluate, new traffic in one of
two scenarios reruns only that scenario's stages, and `reef learn --once` takes only new records.
Every stage is a process of its own, so each test runs as few of them as its assertions need.

The repository's params.yaml runs the pipeline on the default model with examples/sentiment; here
the same dvc.yaml runs on the tests' 1M model and demo-add (tests/helpers/tiny): on SmolLM2 with
sentiment (LoRA rft, 4 steps) this file passed in 905 s against 254 s on the tiny model, on a
machine shared with a CI run (issue 35), more than `make test`'s budget allows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reef.traffic.offline import record_offline_traffic
from tests.helpers import REPO, gated_tasks
from tests.helpers.models import copy_tiny
from tests.helpers.tiny import HERE as TINY_HELPERS

TINY_DATA = TINY_HELPERS / "data"

pytestmark = pytest.mark.start_early(1)

ENV = {
    **os.environ,
    "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "GIT_AUTHOR_NAME": "reef-test", "GIT_AUTHOR_EMAIL": "test@reef.invalid",
    "GIT_COMMITTER_NAME": "reef-test", "GIT_COMMITTER_EMAIL": "test@reef.invalid",
}
STAGES = ["base-model", "demo-traffic", "snapshot", "train", "evaluate"]


def run(repo: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=repo, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def sh(repo: Path, *cmd: str) -> str:
    done = run(repo, *cmd)
    return done.stdout + done.stderr


def ran_items(output: str) -> list[str]:
    """The stages DVC ran, per item (`snapshot@demo-add`)."""
    return re.findall(r"Running stage '([^']+)'", output)


def ran(output: str) -> list[str]:
    """The stages DVC ran, by name (a foreach stage's items count as the stage)."""
    names = {item.split("@")[0] for item in ran_items(output)}
    return [s for s in STAGES if s in names]


@pytest.fixture(scope="module")
def first_repro(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A project after its first `dvc repro`, and that run's output: every test of the module
    starts from a trained candidate, whichever runs first."""
    root = make_project(tmp_path_factory.mktemp("dvc") / "project")
    return root, sh(root, "dvc", "repro")


@pytest.fixture(scope="module")
def repo(first_repro: tuple[Path, str]) -> Path:
    return first_repro[0]


def make_project(root: Path, scenarios: dict[str, Any] | None = None, serve_yaml: str | None = None) -> Path:
    """A fresh project: the pipeline files and code, the tiny model committed as the base-model
    stage's output (rebuilding it would take minutes), small params: the repository's, on the tiny
    model and demo-add (declared by the tests' entry points) instead of SmolLM2 and sentiment."""
    root.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".dvcignore", ".gitignore"):
        shutil.copy2(REPO / name, root / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=ignore)
    shutil.copytree(REPO / "reef", root / "reef", ignore=ignore)
    shutil.copytree(REPO / "examples" / "sentiment", root / "examples" / "sentiment", ignore=ignore)
    copy_tiny(root / "data" / "models" / "tiny")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["base_model"] = {"path": "data/models/tiny"}
    params["demo_traffic"].update(scenario="demo-add", prompts=16, samples=4)
    params["train"] = {**params["train"], "kind": "full", "learning_rate": 0.0005, "max_steps": 4,
                       "per_device_batch_size": 8}
    params["scenarios"] = {"demo-add": {}}
    params["gate"].update(samples=1)
    if scenarios is not None:
        params["scenarios"] = scenarios
        params["source"]["data_dir"] = "data/live"
    if serve_yaml is not None:
        (root / "serve.yaml").write_text(serve_yaml)
        params["source"]["serve_yaml"] = "serve.yaml"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(root, "git", "init", "-q")
    sh(root, "dvc", "init", "-q")
    sh(root, "dvc", "commit", "-f", "base-model")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-qm", "project")
    return root


def test_repro_then_noop_then_param_change(first_repro: tuple[Path, str]) -> None:
    repo, first = first_repro
    assert ran(first) == ["demo-traffic", "snapshot", "train", "evaluate"]
    metrics = json.loads((repo / "data" / "metrics" / "demo-add.json").read_text())
    assert metrics["prompts"] == gated_tasks(metrics, 80) and 0.0 <= metrics["candidate_success"] <= 1.0

    snapshot = json.loads((repo / "data" / "snapshots" / "demo-add" / "manifest.json").read_text())
    candidate = json.loads((repo / "data" / "candidates" / "demo-add" / "candidate.json").read_text())
    lineage = candidate["lineage"]
    head = sh(repo, "git", "rev-parse", "HEAD").strip()
    assert lineage["snapshot_hash"] == snapshot["hash"] and lineage["recipe"] == "recipes.rft.recipe:RFT"
    assert lineage["params"]["max_steps"] == 4 and lineage["code_commit"].removesuffix("+dirty") == head
    assert lineage["parent_release"] == "demo-add@r0"  # no release chain yet: the base model serves r0
    assert (repo / "data" / "candidates" / "demo-add" / "model.safetensors").exists()
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "round 1")

    second = sh(repo, "dvc", "repro")
    assert ran(second) == [] and "Data and pipelines are up to date" in sh(repo, "dvc", "status")

    exp = sh(repo, "dvc", "exp", "run", "-S", "train.max_steps=2")
    assert ran(exp) == ["train", "evaluate"]
    again = json.loads((repo / "data" / "candidates" / "demo-add" / "candidate.json").read_text())
    assert again["lineage"]["params"]["max_steps"] == 2
    assert again["lineage"]["snapshot_hash"] == snapshot["hash"]  # same round: sibling candidate
    dag = sh(repo, "dvc", "dag")
    assert "+-------" in dag and "train@demo-add" in dag


def _learn(repo: Path, scenario: str) -> tuple[dict[str, Any], str]:
    """`reef learn --once`'s summary, and all it printed (the stages its `dvc repro` ran)."""
    done = run(repo, "python", "-m", "reef.learn.pipeline", "learn", "--scenario", scenario, "--quiet")
    out = done.stdout
    return json.loads(out[out.rindex("\n{") :]), out + done.stderr  # the JSON summary printed last


def test_gate_then_track_puts_release_weights_in_dvc(repo: Path) -> None:
    """The pipeline's candidate is registered and gated (`reef gate`), and `reef track` hands the
    artifact store to DVC: a pointer file for git, the weights in DVC's cache and remote."""
    gate = subprocess.run(["python", "-m", "reef.cli", "gate", "data/candidates/demo-add", "--samples", "1",
                           "--json"], cwd=repo, env=ENV, capture_output=True, text=True)
    assert gate.returncode in (0, 1), gate.stderr  # 0 selected, 1 rejected: both are decisions
    decision = json.loads(gate.stdout)
    assert decision["decision"] in ("select", "reject") and decision["head_release_id"] == "demo-add@r0"
    sh(repo, "python", "-m", "reef.cli", "track")
    pointer = yaml.safe_load((repo / "data" / "artifacts.dvc").read_text())
    assert pointer["outs"][0]["path"] == "artifacts" and pointer["outs"][0]["nfiles"] >= 2
    remote = repo.parent / "remote"
    sh(repo, "dvc", "remote", "add", "-f", "-d", "store", str(remote))
    sh(repo, "dvc", "push")
    stored = {p.name for p in remote.rglob("*") if p.is_file()}
    weights = json.loads(next((repo / "data" / "artifacts").glob(f"{decision['candidate_id']}/manifest.json"))
                         .read_text())["files"]
    assert any(f["sha256"] for f in weights) and stored, "dvc push stored nothing"


def test_new_traffic_in_one_scenario_reruns_only_its_stages_and_learn_once_takes_only_new_records(
        tmp_path: Path) -> None:
    """Two scenarios (the second declared in the project's serve.yaml, with its own smaller eval
    suite and its own recipe params), live traffic (a store outside DVC, as `reef serve` writes):
    one `dvc repro evaluate` learns for both; `reef learn --once` then finds nothing new, and after
    new traffic in one scenario runs a round (through `dvc repro`) of only that scenario's
    snapshot, train and evaluate, over only the records that arrived since, with its own ledger."""
    serve_yaml = ("scenarios:\n  second:\n    reward: tests.helpers.tiny.task:reward\n"
                  f"    eval: {{path: {TINY_DATA / 'eval.jsonl'}, max_new_tokens: 16, limit: 16}}\n")
    repo = make_project(tmp_path / "project", {"demo-add": {}, "second": {"max_steps": 2}}, serve_yaml)
    live, tiny = repo / "data" / "live", repo / "data" / "models" / "tiny"
    from reef.scenario import get_scenario

    second_users = get_scenario("demo-add").model_copy(update={"name": "second"})  # the demo's tasks and reward
    for seed, scenario in ((1, "demo-add"), (2, second_users)):
        record_offline_traffic(tiny, live, scenario, prompts=8, samples=4, seed=seed)

    first = ran_items(sh(repo, "dvc", "repro", "evaluate"))
    assert sorted(first) == sorted(f"{stage}@{s}" for stage in ("snapshot", "train", "evaluate")
                                   for s in ("demo-add", "second")), first
    metrics = {s: json.loads((repo / "data" / "metrics" / f"{s}.json").read_text()) for s in ("demo-add", "second")}
    assert (metrics["demo-add"]["prompts"], metrics["second"]["prompts"]) == (
        gated_tasks(metrics["demo-add"], 80), gated_tasks(metrics["second"], 16))
    lineage = json.loads((repo / "data" / "candidates" / "second" / "candidate.json").read_text())["lineage"]
    assert lineage["params"]["max_steps"] == 2 and lineage["params"]["scenario"] == "second"
    taken = {s: set(json.loads((repo / "data" / "snapshots" / s / "manifest.json").read_text())["record_ids"])
             for s in ("demo-add", "second")}
    assert taken["demo-add"] and taken["second"] and not taken["demo-add"] & taken["second"]
    assert "Data and pipelines are up to date" in sh(repo, "dvc", "status", "evaluate")

    idle = _learn(repo, "demo-add")[0]  # `reef learn --once` with nothing new
    assert idle["status"] == "nothing_new" and idle["pending"]["consumed"] == len(taken["demo-add"])

    record_offline_traffic(tiny, live, second_users, prompts=8, samples=4, seed=3)
    learned, output = _learn(repo, "second")  # a round through `dvc repro`, over only the new records
    assert ran_items(output) == ["snapshot@second", "train@second", "evaluate@second"], output
    assert "Data and pipelines are up to date" in sh(repo, "dvc", "status", "evaluate")  # demo-add's never went stale
    assert learned["status"] == "trained" and learned["pending"]["consumed"] == len(taken["second"])
    assert learned["metrics"]["prompts"] == gated_tasks(learned["metrics"], 16)
    snapshot = json.loads((repo / "data" / "snapshots" / "second" / "manifest.json").read_text())
    assert learned["candidate"]["lineage"]["snapshot_hash"] == snapshot["hash"]
    again = set(snapshot["record_ids"])
    assert again and not again & taken["second"]  # only the records that arrived since
    from reef.recipe import ledger

    consumed = {s: set(ledger.consumed(repo / "data" / "ledger", s)["record_id"].to_list())
                for s in ("demo-add", "second")}
    assert consumed == {"demo-add": taken["demo-add"], "second": taken["second"] | again}
