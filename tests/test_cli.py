"""The `reef` command line: config resolution, exit codes, and the helpers against a live gateway."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reef.config import ConfigError
from tests.helpers import MODEL_NAME
from tests.helpers.gateway import Gateway

pytestmark = [pytest.mark.model_free, pytest.mark.any_model]


def reef(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    return subprocess.run([sys.executable, "-m", "reef.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**clean, **(env or {})}, timeout=120)


def test_print_config_precedence(tmp_path: Path) -> None:
    (tmp_path / "serve.yaml").write_text("port: 9001\nhost: 127.0.0.3\nengine:\n  max_model_len: 512\n")
    out = reef("serve", "--print-config", "--host", "127.0.0.5", cwd=tmp_path,
               env={"REEF_PORT": "9002", "REEF_DATA_DIR": "/tmp/reef-x", "REEF_ADMIN_TOKEN": "s3cret"})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["host"] == '"127.0.0.5"  # cli'
    assert lines["port"] == "9001  # file:serve.yaml"
    assert lines["data_dir"] == '"/tmp/reef-x"  # env'
    assert lines["engine.max_model_len"] == "512  # file:serve.yaml"
    assert lines["engine.dtype"] == 'null  # default'
    assert lines["admin_token"] == '"***"  # env', "secrets are never printed"


def test_invalid_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("engine:\n  max_len: 512\n")
    out = reef("serve", "-c", str(tmp_path / "bad.yaml"), cwd=tmp_path)
    assert out.returncode == 2 and "engine.max_len" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "bad2.yaml").write_text("port: high\n")
    out = reef("serve", "-c", str(tmp_path / "bad2.yaml"), cwd=tmp_path)
    assert out.returncode == 2 and "port" in out.stderr
    out = reef("serve", "--print-config", cwd=tmp_path, env={"REEF_STORE__FSYNC": "maybe"})
    assert out.returncode == 2 and "store.fsync" in out.stderr
    out = reef("serve", "-c", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert out.returncode == 2 and "not found" in out.stderr


def test_report_status_and_tail(gateway: Gateway) -> None:
    raw = gateway.client().chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "What is 4 + 4?"}], max_tokens=6)
    record_id = raw.headers["x-reef-agent-record-id"]
    out = reef("report", record_id, "--score", "0.9", "--url", gateway.url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("rep_")
    bad = reef("report", record_id, "--score", "nan", "--url", gateway.url)
    assert bad.returncode == 2 and "finite" in bad.stderr
    unknown = reef("report", "rec_nope", "--score", "1", "--url", gateway.url)
    assert unknown.returncode == 2 and "404" in unknown.stderr
    status = reef("status", "--url", gateway.url)
    assert status.returncode == 0 and "default" in status.stdout and "learner: off" in status.stdout
    # `tail` reads parquet: wait for the flusher to move the record there.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        tail = reef("records", "tail", "--data-dir", str(gateway.data_dir), "-n", "50")
        if record_id in tail.stdout:
            break
        time.sleep(1)
    assert tail.returncode == 0 and record_id in tail.stdout


def test_unreachable_server_is_a_clear_error() -> None:
    out = reef("status", "--url", "http://127.0.0.1:9")
    assert out.returncode == 1 and "cannot reach" in out.stderr and "Traceback" not in out.stderr


def test_scenario_policies_in_serve_yaml(tmp_path: Path) -> None:
    """Per-scenario release policy and canary rule; scenario names may hold dots."""
    from reef.config import resolve

    path = tmp_path / "serve.yaml"
    path.write_text("release: {policy: approval}\n"
                    "scenarios:\n  support.v2: {policy: auto, canary: {fraction: 0.2, min_reports: 5}}\n")
    config, sources = resolve({}, path, {})
    assert config.policy("support.v2") == "auto" and config.policy("other") == "approval"
    assert config.scenario("support.v2").canary.fraction == 0.2 and sources["scenarios"].startswith("file:")
    path.write_text("scenarios:\n  demo-add: {policy: sometimes}\n")
    with pytest.raises(ConfigError, match="policy"):
        resolve({}, path, {})


SEED_LAYOUT = """\
recipes:                       # the seed's layout: named recipes, referenced by scenarios
  fast-rft: {recipe: rft, batch_size: 64, max_staleness: 2, params: {kind: lora, learning_rate: 5.0e-4}}
  mine: {recipe: "my_recipes:Best", min_records: 8}
learner: {enabled: true, min_records: 16}
scenarios:
  support: {policy: approval, recipe: fast-rft}
  triage: {recipe: mine}
  inline: {recipe: {recipe: kto, stale_policy: drop, params: {max_steps: 5}}}
"""


def test_serve_yaml_recipes_layout(tmp_path: Path) -> None:
    """`reef serve -c` takes the seed's `recipes:` block; each scenario's round plan comes from it, a
    module next to serve.yaml is a valid recipe reference, and `--print-config` shows the recipes."""
    from reef.config import resolve
    from reef.learn.plan import min_records, plan_for_scenario

    (tmp_path / "my_recipes.py").write_text("# a user's recipe module next to serve.yaml\n")
    path = tmp_path / "serve.yaml"
    path.write_text(SEED_LAYOUT)
    out = reef("serve", "-c", str(path), "--print-config", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert '"fast-rft": {"recipe": "rft", "batch_size": 64, "max_staleness": 2' in lines["recipes"]
    assert lines["recipes"].endswith(f"# file:{path}") and "learner.params" not in lines

    config, _ = resolve({}, path, {})
    plan = plan_for_scenario(config, "support")
    assert plan is not None and plan.recipe == "rft"
    assert plan.params == {"kind": "lora", "learning_rate": 5.0e-4, "batch_size": 64, "max_staleness": 2}
    data = config.data_dir.resolve()
    assert (plan.snapshot_dir, plan.candidate_dir, plan.ledger_root) == (
        data / "snapshots" / "support", data / "candidates" / "support", data / "ledger")
    assert (min_records(config, "support"), min_records(config, "triage")) == (16, 8)
    assert plan_for_scenario(config, "inline").params == {"max_steps": 5, "stale_policy": "drop"}
    assert plan_for_scenario(config, "undeclared") is None


def test_bad_recipe_reference_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    cases = {
        "scenarios:\n  support: {recipe: fast-rf}\nrecipes:\n  fast-rft: {recipe: rft}\n": "scenarios.support.recipe",
        "recipes:\n  mine: {recipe: rtf}\n": "recipes.mine.recipe",
        "recipes:\n  mine: {recipe: 'nowhere.to.be:Found'}\n": "recipes.mine.recipe",
        "scenarios:\n  s: {recipe: {recipe: rft, batch_size: 0}}\n": "scenarios.s.recipe.RecipeSpec.batch_size",
        "learner: {enabled: true, params: params.yaml}\n": "learner.params was removed",
    }
    for text, key in cases.items():
        path.write_text(text)
        out = reef("serve", "-c", str(path), "--print-config", cwd=tmp_path)
        assert out.returncode == 2 and key in out.stderr and "Traceback" not in out.stderr, (text, out.stderr)
    # A recipe that resolves but cannot take its params fails when the learner loads it, before vLLM starts.
    path.write_text("learner: {enabled: true}\nrecipes:\n  r: {recipe: rft, params: {max_stepz: 3}}\n"
                    "scenarios:\n  s: {recipe: r}\n")
    out = reef("serve", "-c", str(path), "--upstream-url", "http://127.0.0.1:9", cwd=tmp_path)
    assert out.returncode == 2 and "recipes.r" in out.stderr and "max_stepz" in out.stderr, out.stderr


def test_an_unknown_params_yaml_key_exits_2_naming_it(tmp_path: Path) -> None:
    """`reef learn --once` and `reef recipe run` read params.yaml with the same strict types as serve.yaml."""
    path = tmp_path / "params.yaml"
    cases = {
        "scenarios: {demo-add: {}}\ntrain: {recipe: rft, max_stepz: 3}\n": "params.yaml: train.max_stepz: unknown key",
        "scenarios: {demo-add: {}}\ntrain: {recipe: rft}\nevaluate: {sampels: 2}\n":
            "params.yaml: evaluate.sampels: unknown key",
    }
    for text, named in cases.items():
        path.write_text(text)
        for args in (("learn", "--once", "--no-dvc"), ("recipe", "run", "rft")):
            out = reef(*args, cwd=tmp_path)
            assert out.returncode == 2 and named in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
    path.write_text("scenarios: {demo-add: {}}\ntrain: {recipe: rft}\n")
    out = reef("recipe", "run", "rft", "--set", "max_stepz=3", cwd=tmp_path)
    assert out.returncode == 2 and "--set max_stepz: unknown key" in out.stderr, out.stderr
    assert not (tmp_path / "data").exists()  # refused before any work
