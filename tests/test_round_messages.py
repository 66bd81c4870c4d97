"""The round's seams: the request the learner writes and the result the round process answers are
pydantic messages that survive JSON; the gate's settings are one model, and the keys they replaced
still work for one release, with a deprecation warning naming the new key; the server imports the
planner, never the round's trainers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from reef.config import GateSettings, PipelineParams, ServeConfig, resolve
from reef.learn.plan import RoundPlan, RoundRequest, RoundResult, Thresholds
from reef.registry.candidates import GateResult
from reef.sampling.engine import EngineEndpoint

pytestmark = pytest.mark.model_free


def test_a_round_request_and_result_survive_json(tmp_path: Path) -> None:
    plan = RoundPlan(scenario="s", recipe="rft", params={"max_steps": 3}, data_dir=tmp_path,
                     wait_for=Thresholds(records=4, rewarded=2))
    request = RoundRequest(plan=plan, gate=GateSettings(samples=2, min_delta=0.05),
                           engine=EngineEndpoint("http://127.0.0.1:8000", "tiny"), config_file=tmp_path / "serve.yaml")
    again = RoundRequest.model_validate_json(request.model_dump_json())
    assert again == request and again.engine == EngineEndpoint("http://127.0.0.1:8000", "tiny")
    assert RoundRequest.model_validate_json(RoundRequest(plan=plan).model_dump_json()).engine is None

    gate = GateResult(decision="select", reason="better", candidate_success=0.8, head_success=0.3, ci_low=0.2)
    result = RoundResult(status="trained", scenario="s", round="abc", round_state="gated", pending={"records": 4},
                         snapshot="snap", candidate={"id": "c1", "path": str(tmp_path)}, candidate_id="cid",
                         metrics={"train_loss": 0.5}, gate=gate)
    assert RoundResult.model_validate_json(result.model_dump_json()) == result
    wire = result.model_dump(mode="json")  # what rounds.jsonl and the dashboard read
    assert wire["gate"]["decision"] == "select" and wire["candidate"]["id"] == "c1" and wire["round"] == "abc"
    with pytest.raises(ValidationError):
        RoundResult.model_validate({"status": "finished", "scenario": "s"})  # a status no round answers


def test_the_flat_release_gate_keys_still_work_and_name_the_new_key(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./serve.yaml
    with pytest.warns(DeprecationWarning) as caught:
        config = ServeConfig.model_validate({"release": {"gate_samples": 3, "gate_min_delta": 0.1}})
    assert [str(w.message).split(" (")[0] for w in caught] == [
        "release.gate_samples is deprecated: write release.gate.samples",
        "release.gate_min_delta is deprecated: write release.gate.min_delta"]
    assert config.release.gate == GateSettings(samples=3, min_delta=0.1)

    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"release": {"gate_min_valid_pairs": 8}}))
    with pytest.warns(DeprecationWarning, match="release.gate.min_valid_pairs"):
        config, sources = resolve({}, path, {})
    assert config.release.gate.min_valid_pairs == 8 and sources["release.gate.min_valid_pairs"] == f"file:{path}"

    new, _ = resolve({}, None, {"REEF_RELEASE__GATE__SAMPLES": "2"})
    assert new.release.gate.samples == 2
    with pytest.raises(ValueError, match="keep release.gate.samples"):
        ServeConfig.model_validate({"release": {"gate_samples": 3, "gate": {"samples": 2}}})


def test_the_evaluate_gate_keys_of_params_yaml_still_work() -> None:
    with pytest.warns(DeprecationWarning, match="evaluate.samples is deprecated: write gate.samples"):
        params = PipelineParams.parse({"scenarios": {"a": {}}, "evaluate": {"samples": 2, "baseline": "m"}})
    assert params.gate == GateSettings(samples=2) and params.evaluate.baseline == "m"
    assert PipelineParams.parse({"scenarios": {"a": {}}, "gate": {"seed": 3}}).gate.seed == 3


def test_the_server_imports_the_planner_not_the_round() -> None:
    code = ("import sys, reef.learn.learner; "
            "print(sorted(m for m in ('reef.learn.round', 'torch', 'transformers', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
