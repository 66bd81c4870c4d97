"""params.yaml is parsed by the config layer's pydantic types: an unknown key, in a fixed section or
among the recipe's fields, exits 2 naming it; the keys DVC tracks are the file's own; and the
pipeline plans a round with the learner's planner, so the same recipe settings give the same plan."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reef.config import ParamsError, PipelineParams, ServeConfig
from reef.learn import pipeline
from reef.learn.plan import RoundPlan, plan_for_scenario

pytestmark = pytest.mark.model_free

REPO = Path(__file__).resolve().parents[1]


def write_params(folder: Path, **sections: object) -> Path:
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump({"scenarios": {"demo-add": {}}, "train": {"recipe": "rft"}, **sections}))
    return path


def test_the_repository_params_yaml_parses_and_keeps_the_keys_dvc_tracks() -> None:
    params = PipelineParams.read(REPO / "params.yaml")
    assert params.scenario_names == ["sentiment"] and params.train.recipe == "recipes.rft.recipe:RFT"
    assert params.train.own["max_steps"] == 12 and params.train.experience.min_score == 1.0
    dvc = (REPO / "dvc.yaml").read_text()
    for key in ("base_model.path", "demo_traffic", "source", "train.recipe", "train.experience", "evaluate"):
        assert f"- {key}\n" in dvc  # tracked by dotted path: each is a key of the schema too
        section, _, field = key.partition(".")
        assert section in PipelineParams.model_fields
        assert not field or field in type(getattr(params, section)).model_fields


@pytest.mark.parametrize(("sections", "named"), [
    ({"evaluate": {"sampels": 2}}, "params.yaml: evaluate.sampels: unknown key"),
    ({"source": {"data_dir": "d", "ledger": "l"}}, "params.yaml: source.ledger: unknown key"),
    ({"train": {"experience": {"min_scor": 1}}}, "params.yaml: train.experience.min_scor: unknown key"),
    ({"tarin": {}}, "params.yaml: tarin: unknown key"),
    ({"scenarios": {"a.b": {}}}, "DVC cannot track a scenario name with a dot"),
    ({"scenario": "demo-add"}, "`scenario: demo-add` is now `scenarios: {demo-add: {}}`"),
])
def test_an_unknown_or_bad_key_is_an_error_naming_it(sections: dict[str, object], named: str) -> None:
    with pytest.raises(ParamsError) as info:
        PipelineParams.parse({"scenarios": {"demo-add": {}}, **sections})
    assert named in str(info.value) and "\n" not in str(info.value)


def test_a_recipe_field_the_recipe_lacks_is_named_where_it_was_written() -> None:
    params = PipelineParams.parse({"train": {"recipe": "rft", "max_stepz": 3},
                                   "scenarios": {"a": {}}})
    with pytest.raises(ParamsError, match=r"^params.yaml: train.max_stepz: unknown key$"):
        pipeline.checked(params, "a")
    fixed = PipelineParams.parse({"train": {"recipe": "rft"}, "scenarios": {"b": {"lora_rr": 4}}})
    with pytest.raises(ParamsError, match=r"^params.yaml: scenarios.b.lora_rr: unknown key$"):
        pipeline.checked(fixed, "b")


def test_an_unknown_key_exits_2_from_the_pipeline_stages(tmp_path: Path) -> None:
    write_params(tmp_path, train={"recipe": "rft", "max_stepz": 3})
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for stage in ("snapshot", "train", "pending", "learn"):
        done = subprocess.run([sys.executable, "-m", "reef.learn.pipeline", stage], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "params.yaml: train.max_stepz: unknown key" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "data").exists()


def test_the_pipeline_and_the_learner_plan_the_same_round_from_the_same_recipe_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve.yaml's `recipes.<name>` and params.yaml's `train` written for one setting: the same spec,
    and the same RoundPlan but for what only the pipeline decides (no head to continue from, the
    paths as DVC names them, relative to the project)."""
    monkeypatch.chdir(tmp_path)
    config = ServeConfig.model_validate({
        "model": "data/models/base",
        "recipes": {"fast": {"recipe": "rft", "batch_size": 64, "max_staleness": 2,
                             "params": {"kind": "lora", "learning_rate": 5e-4, "min_score": 1.0}}},
        "scenarios": {"support": {"recipe": "fast"}},
    })
    params = PipelineParams.parse({
        "base_model": {"path": "data/models/base"},
        "train": {"recipe": "rft", "experience": {"batch_size": 64, "max_staleness": 2, "min_score": 1.0},
                  "kind": "lora", "learning_rate": 5e-4},
        "scenarios": {"support": {}},
    })
    assert params.recipe_spec("support") == config.scenario("support").recipe_spec(config.recipes)
    learner = plan_for_scenario(config, "support")
    ours = pipeline.checked(params, "support")
    assert learner is not None and ours.params == learner.params == {
        "kind": "lora", "learning_rate": 5e-4, "min_score": 1.0, "batch_size": 64, "max_staleness": 2}
    assert absolute(ours).model_copy(update={"continue_from_head": True}) == learner
    assert (ours.snapshot_dir, ours.candidate_dir) == (Path("data/snapshots/support"), Path("data/candidates/support"))


def absolute(plan: RoundPlan) -> RoundPlan:
    return plan.model_copy(update={key: value.resolve() for key, value in plan if isinstance(value, Path)})
