"""`learner.launcher: accelerate` (reef.learn.launch): a round's rft trains through `accelerate
launch` on two CPU processes (DDP over gloo), writes one candidate and marks its records consumed
once, and the gate selects it as it selects the one-process candidate of the same snapshot."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from reef.config import ServeConfig
from reef.config.learner import AccelerateSettings
from reef.gate.evaluate import gate_folders
from reef.learn.launch import accelerate_command, launches
from reef.learn.plan import plan_round
from reef.learn.round import run_round
from reef.recipe import ledger, load_recipe
from reef.scenario.schema import RecipeSpec
from reef.traffic.offline import record_offline_traffic
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")

RFT = {"kind": "lora", "max_steps": 6, "learning_rate": 5e-3, "per_device_batch_size": 8, "min_score": 1.0}


@pytest.mark.model_free
def test_the_launch_command_and_which_recipes_it_takes(tmp_path: Path) -> None:
    two = accelerate_command(AccelerateSettings(num_processes=2, main_process_port=29511), ["--out", "o.json"])
    assert two[1:3] == ["-m", "accelerate.commands.launch"] and "--multi_gpu" in two
    assert two[two.index("--num_processes") + 1] == "2" and two[two.index("--main_process_port") + 1] == "29511"
    assert two[-4:] == ["-m", "reef.learn.launch", "--out", "o.json"]
    config = tmp_path / "fsdp.yaml"
    given = accelerate_command(AccelerateSettings(config_file=config), [])
    assert given[given.index("--config_file") + 1] == str(config) and "--num_processes" not in given
    assert "--multi_gpu" not in accelerate_command(AccelerateSettings(num_processes=1), [])
    params = {"scenario": demo.SCENARIO, "base_model": "m"}
    assert launches(load_recipe("rft", {**params, "kind": "lora"}))
    # Rollouts would be sampled once per process: a recipe that samples the engine trains in one.
    assert not launches(load_recipe("explore", params)) and not launches(load_recipe("grpo", params))
    learner = ServeConfig(learner={"launcher": "accelerate", "accelerate": {"num_processes": 3}}).learner
    assert learner.launcher == "accelerate" and learner.accelerate.num_processes == 3
    with pytest.raises(ValidationError, match="num_process"):
        ServeConfig(learner={"accelerate": {"num_process": 3}})


def test_rft_through_accelerate_on_two_processes_writes_one_candidate_the_gate_selects(
        tiny_model: Path, tmp_path: Path) -> None:
    data, alone_data = tmp_path / "data", tmp_path / "alone"
    record_offline_traffic(tiny_model, data, demo.SCENARIO, prompts=32, samples=4, seed=1)
    shutil.copytree(data, alone_data)  # the same records, for the one-process round
    spec = RecipeSpec(recipe="rft", params=RFT)
    launched = run_round(plan_round(demo.SCENARIO, spec, base_model=str(tiny_model), data_dir=data, fixed=False),
                         evaluate=False, progress=False, launcher=AccelerateSettings(num_processes=2))
    assert launched.status == "trained" and launched.candidate is not None, launched
    assert launched.candidate.metrics["processes"] == 2, launched.candidate.metrics
    folders = [p for p in (data / "candidates").iterdir()]
    assert folders == [launched.candidate.path], folders  # one candidate, no other process's staging left
    consumed = ledger.consumed(data / "ledger", demo.SCENARIO)
    assert consumed.height == launched.candidate.metrics["snapshot_records"]
    assert consumed["record_id"].n_unique() == consumed.height  # marked once, by the main process
    assert consumed.select(pl.col("candidate_id").n_unique()).item() == 1

    alone = run_round(plan_round(demo.SCENARIO, spec, base_model=str(tiny_model), data_dir=alone_data, fixed=False),
                      evaluate=False, progress=False)
    assert alone.candidate is not None and alone.candidate.metrics["processes"] == 1
    for candidate in (launched.candidate, alone.candidate):
        result = gate_folders(candidate.path, tiny_model, demo.SCENARIO, progress=False)
        assert result.decision == "select", result.reason
