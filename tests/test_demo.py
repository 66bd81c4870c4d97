"""`make demo` as a fresh user runs it, on the default model: SmolLM2-135M-Instruct serves the
`examples/sentiment` scenario, simulated users report rewards and correct the replies they reject,
the learner's first round trains rft on those corrections, the gate finds the candidate better on
the held-out reviews, the auto policy releases it and the server hot-swaps it in. The base model
never answers in the required format, so this is the cold start from live traffic: held-out
success must rise by at least 30 points, and the plot must be written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from reef.demo import run
from reef.demo.loop import per_release

pytestmark = pytest.mark.start_early(0)


# The demo's own budget is 600 s of waves; the server's start (a first conversion of the model
# included) comes on top, so the test's limit is above pyproject's 600 s.
@pytest.mark.timeout(900)
def test_make_demo_lifts_held_out_success_by_30_points(tmp_path: Path) -> None:
    # The example as it is, but 8 LoRA steps instead of 12 (bench/smollm2_probe measured 98 % held-out
    # after 8 steps of the same SFT): the test shares the machine with the rest of the suite.
    example = shutil.copytree(run.EXAMPLE, tmp_path / "sentiment")
    config = yaml.safe_load((example / "serve.yaml").read_text())
    config["recipes"]["sentiment-rft"]["params"]["max_steps"] = 8
    (example / "serve.yaml").write_text(yaml.safe_dump(config))
    workdir = tmp_path / "demo"
    assert run.main(["--workdir", str(workdir), "--example", str(example), "--rounds", "1",
                     "--max-seconds", "600"]) == 0

    rounds = [json.loads(line) for line in (workdir / "data" / "learner" / "rounds.jsonl").read_text().splitlines()]
    first = rounds[0]
    gate = first["gate"]
    assert first["status"] == "trained" and gate["decision"] == "select", first
    assert first["metrics"]["corrections"] > 0, "the first round learns from corrections"
    assert gate["head_success"] <= 0.3, "the base model is weak on this task"
    assert gate["candidate_success"] - gate["head_success"] >= 0.30, gate
    assert first["release"] == "sentiment@r1"
    assert (workdir / "learning-loop.png").stat().st_size > 10_000
    live = dict(per_release(workdir / "data", "sentiment").select("release_id", "success").iter_rows())
    assert live["sentiment@r1"] - live["sentiment@r0"] >= 0.30, f"live traffic too: {live}"
    assert (workdir / "data" / "releases" / "sentiment" / "HEAD").read_text().strip() == "sentiment@r1"
