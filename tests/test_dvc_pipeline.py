"""The learning pipeline under real DVC in a temporary git repository, on the default model and
examples/sentiment: base-model -> demo-traffic -> snapshot -> train -> evaluate (once per scenario:
`snapshot@sentiment`, ...); a second `dvc repro` is
a no-op, `dvc exp run -S train.<param>` reruns only train and evaluate, new traffic in one of
two scenarios reruns only that scenario's stages, and `reef learn --once` takes only new records.
Every stage is a process of its own, so each test runs as few of them as its assertions need."""

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

from reef.config import DEFAULT_MODEL, resolve
from reef.model.smollm2 import convert, is_current
from reef.traffic.offline import record_offline_traffic
from tests.helpers import REPO

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
    """The stages DVC ran, per item (`snapshot@sentiment`)."""
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


def base_model(dest: Path) -> Path:
    """The default model in `dest`, hard-linked where the file system allows (it is 0.5 GB and
    nothing writes into it), built first on a fresh clone."""
    if not is_current(DEFAULT_MODEL):
        convert(DEFAULT_MODEL)
    dest.parent.mkdir(parents=True, exist_ok=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    return Path(shutil.copytree(REPO / DEFAULT_MODEL, dest, copy_function=link))


def make_project(root: Path, scenarios: dict[str, Any] | None = None, serve_yaml: str | None = None) -> Path:
    """A fresh project: the pipeline files and code, examples/sentiment (where params.yaml's
    scenarios are declared), the default model committed as the base-model stage's output (fetching
    it again would take a minute), small params. `serve_yaml`: more scenarios, added to that file."""
    root.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".dvcignore", ".gitignore"):
        shutil.copy2(REPO / name, root / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=ignore)
    shutil.copytree(REPO / "reef", root / "reef", ignore=ignore)
    shutil.copytree(REPO / "examples" / "sentiment", root / "examples" / "sentiment", ignore=ignore)
    base_model(root / DEFAULT_MODEL)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["demo_traffic"].update(prompts=16, samples=4)
    params["train"].update(max_steps=4, per_device_batch_size=8)
    params["gate"].update(samples=1)
    if scenarios is not None:
        params["scenarios"] = scenarios
        params["source"]["data_dir"] = "data/live"
    if serve_yaml is not None:
        declared = root / params["source"]["serve_yaml"]
        config = yaml.safe_load(declared.read_text())
        config["scenarios"].update(yaml.safe_load(serve_yaml)["scenarios"])
        declared.write_text(yaml.safe_dump(config, sort_keys=False))
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
    metrics = json.loads((repo / "data" / "metrics" / "sentiment.json").read_text())
    assert metrics["prompts"] == 48 and 0.0 <= metrics["candidate_success"] <= 1.0

    snapshot = json.loads((repo / "data" / "snapshots" / "sentiment" / "manifest.json").read_text())
    candidate = json.loads((repo / "data" / "candidates" / "sentiment" / "candidate.json").read_text())
    lineage = candidate["lineage"]
    head = sh(repo, "git", "rev-parse", "HEAD").strip()
    assert lineage["snapshot_hash"] == snapshot["hash"] and lineage["recipe"] == "recipes.rft.recipe:RFT"
    assert lineage["params"]["max_steps"] == 4 and lineage["code_commit"].removesuffix("+dirty") == head
    assert lineage["parent_release"] == "sentiment@r0"  # no release chain yet: the base model serves r0
    assert (repo / "data" / "candidates" / "sentiment" / "adapter_model.safetensors").exists()
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "round 1")

    second = sh(repo, "dvc", "repro")
    assert ran(second) == [] and "Data and pipelines are up to date" in sh(repo, "dvc", "status")

    exp = sh(repo, "dvc", "exp", "run", "-S", "train.max_steps=2")
    assert ran(exp) == ["train", "evaluate"]
    again = json.loads((repo / "data" / "candidates" / "sentiment" / "candidate.json").read_text())
    assert again["lineage"]["params"]["max_steps"] == 2
    assert again["lineage"]["snapshot_hash"] == snapshot["hash"]  # same round: sibling candidate
    dag = sh(repo, "dvc", "dag")
    assert "+-------" in dag and "train@sentiment" in dag


def _learn(repo: Path, scenario: str) -> tuple[dict[str, Any], str]:
    """`reef learn --once`'s summary, and all it printed (the stages its `dvc repro` ran)."""
    done = run(repo, "python", "-m", "reef.learn.pipeline", "learn", "--scenario", scenario, "--quiet")
    out = done.stdout
    return json.loads(out[out.rindex("\n{") :]), out + done.stderr  # the JSON summary printed last


def test_gate_then_track_puts_release_weights_in_dvc(repo: Path) -> None:
    """The pipeline's candidate is registered and gated (`reef gate`), and `reef track` hands the
    artifact store to DVC: a pointer file for git, the weights in DVC's cache and remote."""
    gate = subprocess.run(["python", "-m", "reef.cli", "gate", "data/candidates/sentiment", "--samples", "1",
                           "--json"], cwd=repo, env={**ENV, "REEF_CONFIG": "examples/sentiment/serve.yaml"},
                          capture_output=True, text=True)
    assert gate.returncode in (0, 1), gate.stderr  # 0 selected, 1 rejected: both are decisions
    decision = json.loads(gate.stdout)
    assert decision["decision"] in ("select", "reject") and decision["head_release_id"] == "sentiment@r0"
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
    serve_yaml = ("scenarios:\n  second:\n    reward: reward:reward\n"
                  "    eval: {path: eval.jsonl, max_new_tokens: 12, limit: 16}\n")
    repo = make_project(tmp_path / "project", {"sentiment": {}, "second": {"max_steps": 2}}, serve_yaml)
    live, model = repo / "data" / "live", repo / DEFAULT_MODEL
    from reef.scenario import get_scenario

    config, _ = resolve(config_file=repo / "examples" / "sentiment" / "serve.yaml")
    users = get_scenario("sentiment", config)
    second_users = users.model_copy(update={"name": "second"})  # sentiment's tasks and reward
    for seed, scenario in ((1, users), (2, second_users)):
        record_offline_traffic(model, live, scenario, prompts=8, samples=4, seed=seed)

    first = ran_items(sh(repo, "dvc", "repro", "evaluate"))
    assert sorted(first) == sorted(f"{stage}@{s}" for stage in ("snapshot", "train", "evaluate")
                                   for s in ("sentiment", "second")), first
    metrics = {s: json.loads((repo / "data" / "metrics" / f"{s}.json").read_text()) for s in ("sentiment", "second")}
    assert (metrics["sentiment"]["prompts"], metrics["second"]["prompts"]) == (48, 16)
    lineage = json.loads((repo / "data" / "candidates" / "second" / "candidate.json").read_text())["lineage"]
    assert lineage["params"]["max_steps"] == 2 and lineage["params"]["scenario"] == "second"
    taken = {s: set(json.loads((repo / "data" / "snapshots" / s / "manifest.json").read_text())["record_ids"])
             for s in ("sentiment", "second")}
    assert taken["sentiment"] and taken["second"] and not taken["sentiment"] & taken["second"]
    assert "Data and pipelines are up to date" in sh(repo, "dvc", "status", "evaluate")

    idle = _learn(repo, "sentiment")[0]  # `reef learn --once` with nothing new
    assert idle["status"] == "nothing_new" and idle["pending"]["consumed"] == len(taken["sentiment"])

    record_offline_traffic(model, live, second_users, prompts=8, samples=4, seed=3)
    learned, output = _learn(repo, "second")  # a round through `dvc repro`, over only the new records
    assert ran_items(output) == ["snapshot@second", "train@second", "evaluate@second"], output
    assert "Data and pipelines are up to date" in sh(repo, "dvc", "status", "evaluate")  # sentiment's never went stale
    assert learned["status"] == "trained" and learned["pending"]["consumed"] == len(taken["second"])
    assert learned["metrics"]["prompts"] == 16
    snapshot = json.loads((repo / "data" / "snapshots" / "second" / "manifest.json").read_text())
    assert learned["candidate"]["lineage"]["snapshot_hash"] == snapshot["hash"]
    again = set(snapshot["record_ids"])
    assert again and not again & taken["second"]  # only the records that arrived since
    from reef.recipe import ledger

    consumed = {s: set(ledger.consumed(repo / "data" / "ledger", s)["record_id"].to_list())
                for s in ("sentiment", "second")}
    assert consumed == {"sentiment": taken["sentiment"], "second": taken["second"] | again}
