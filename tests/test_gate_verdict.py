"""The gate says what it does: a candidate is selected only when both statistics agree (the
bootstrap interval above `min_delta` and the exact sign test), the minimum of valid pairs counts
pairs scored in both arms, and the same candidate gated twice gets the same verdict. Synthetic
per-task differences (reef.gate.stats.judge) and the real gate (`gate_weights`) on replies a stub
samples and a real reward scores; the seeded sampling itself on the tiny model with transformers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from reef.config import GateSettings
from reef.gate import evaluate
from reef.gate.arms import Weights
from reef.gate.evaluate import gate_weights
from reef.gate.looks import plan_looks
from reef.gate.sample import Replies
from reef.gate.stats import judge, sign_test
from reef.registry.candidates import GateResult
from reef.scenario import EvalSpec, EvalSuite, Scenario, eval_suite, get_scenario
from tests.helpers.tiny import task as demo

UNUSED = Weights(Path("unused"))

# --- both statistics, on synthetic differences ------------------------------------------------------


@pytest.mark.model_free
def test_a_few_large_wins_among_ties_pass_the_interval_but_not_the_sign_test() -> None:
    diffs = [1.0] * 5 + [0.0] * 75  # 5 of 5 discordant tasks won: p = 0.0625
    verdict = judge(diffs, GateSettings())
    assert verdict.low > 0 and verdict.interval_clears  # the interval alone would select
    assert (verdict.wins, verdict.losses, verdict.ties) == (5, 0, 75) and verdict.sign_p == 0.0625
    assert not verdict.sign_agrees and not verdict.selected
    six = judge([1.0] * 6 + [0.0] * 74, GateSettings())  # 6 of 6: p = 0.03125, both agree
    assert six.sign_p == 0.03125 and six.selected
    assert judge(diffs, GateSettings(sign_test=False)).selected  # off: the interval decides alone


@pytest.mark.model_free
def test_many_small_wins_pass_the_sign_test_but_not_the_interval() -> None:
    diffs = [0.25] * 15 + [-1.0] * 3  # the candidate wins most tasks, loses three badly
    verdict = judge(diffs, GateSettings())
    assert verdict.sign_p == sign_test(15, 3) < 0.05 and verdict.sign_agrees
    assert verdict.low <= 0 and not verdict.interval_clears and not verdict.selected
    # The same with a bar to clear: significant, but smaller than min_delta.
    small = judge([0.1] * 20, GateSettings(min_delta=0.2))
    assert small.sign_agrees and not small.interval_clears and not small.selected


@pytest.mark.model_free
def test_a_significant_sign_test_the_head_wins_never_selects() -> None:
    verdict = judge([-1.0] * 10 + [1.0], GateSettings(min_delta=-2.0))  # the interval clears a bar of -2
    assert verdict.interval_clears and verdict.sign_p < 0.05
    assert not verdict.sign_agrees and not verdict.selected
    with pytest.raises(ValueError):
        judge([], GateSettings())


@pytest.mark.model_free
def test_the_same_differences_get_the_same_verdict() -> None:
    diffs = [0.5, 0.0, 0.25, -0.25, 1.0, 0.0, 0.75, 0.5] * 3
    assert judge(diffs, GateSettings()) == judge(diffs, GateSettings())  # the bootstrap is seeded (`seed`)


# --- the real gate on stubbed replies ---------------------------------------------------------------


def _suite(tmp_path: Path, tasks: int) -> EvalSuite:
    """`tasks` tasks whose reward is 1.0 for `right`, 0.0 for `wrong` and None (unscored) for `?`."""
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]})
                                                 + "\n" for i in range(tasks)))
    (tmp_path / "verdict_reward.py").write_text(
        "def score(task, reply):\n"
        "    return {'right': 1.0, 'wrong': 0.0}.get(reply)\n")
    scenario = Scenario(name="verdict", reward="verdict_reward:score", base_dir=tmp_path,
                        eval=EvalSpec(path=Path("eval.jsonl"), max_new_tokens=4, samples=1))
    return eval_suite(scenario)


def _stub(monkeypatch: pytest.MonkeyPatch, candidate: list[str], head: list[str],
          asked: list[int] | None = None) -> None:
    """Task `q<i>` gets `candidate[i]` and `head[i]`, whichever part of the suite a look samples;
    `asked` collects the tasks sampled."""
    def sample(_candidate: object, _head: object, suite: EvalSuite, _samples: int, config: GateSettings,
               **kwargs: object) -> Replies:
        ids = [int(t["messages"][0]["content"][1:]) for t in suite.tasks]
        if asked is not None:
            asked.extend(ids)
        probe = f"probe of q{ids[0]}" if config.probe_tokens else ""  # sampled on the part's first task
        return Replies({"candidate": [[candidate[i]] for i in ids], "head": [[head[i]] for i in ids]}, probe)

    monkeypatch.setattr(evaluate, "sample_arms", sample)


def _gate(suite: EvalSuite, **settings: object) -> Callable[[], GateResult]:
    config = GateSettings(probe_tokens=1, **settings)  # type: ignore[arg-type]
    return lambda: gate_weights(UNUSED, UNUSED, suite, config, progress=False)


@pytest.mark.model_free
def test_the_gate_selects_only_when_both_statistics_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite(tmp_path, 80)
    _stub(monkeypatch, ["right"] * 5 + ["wrong"] * 75, ["wrong"] * 80)
    result = _gate(suite)()
    assert result.decision == "reject" and result.ci_low > 0 and result.sign_p == 0.0625, result.reason
    assert "CI [+0.013, " in result.reason and "lies above +0.000" in result.reason
    assert "sign test 5-0 p=0.0625 not below 0.05" in result.reason
    assert _gate(suite, sign_test=False)().decision == "select"

    _stub(monkeypatch, ["right"] * 6 + ["wrong"] * 74, ["wrong"] * 80)
    result = _gate(suite)()
    assert result.decision == "select" and "sign test 6-0 p=0.0312 below 0.05" in result.reason, result.reason
    assert (result.wins, result.losses, result.ties, result.prompts) == (6, 0, 74, 80)


@pytest.mark.model_free
def test_valid_pairs_are_pairs_scored_in_both_arms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite(tmp_path, 20)
    # Every task answered; 6 candidate replies and 2 head replies the reward cannot score: 12 pairs scored.
    candidate = ["?"] * 6 + ["right"] * 14
    head = ["wrong"] * 18 + ["?"] * 2
    _stub(monkeypatch, candidate, head)
    result = _gate(suite, min_valid_pairs=16)()
    assert result.decision == "void", result.reason
    assert result.reason == ("gate void: 12 of 20 pairs valid, 16 needed (no engine faults; 8 answered tasks "
                             "unscored in an arm (8 replies unscored))")
    assert result.unscored == 8 and result.ci_low is None and result.sign_p is None
    judged = _gate(suite, min_valid_pairs=12)()  # 12 scored pairs are enough: judged on those
    assert judged.decision == "select" and judged.prompts == 12 and judged.unscored == 8, judged.reason
    assert "8 replies unscored, 8 tasks left out" in judged.reason
    # A reward that scores nothing in one arm judges nothing: void, not a rejection.
    _stub(monkeypatch, ["right"] * 20, ["?"] * 20)
    assert _gate(suite)().decision == "void"


@pytest.mark.model_free
def test_min_valid_pairs_is_capped_at_the_suite_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite(tmp_path, 8)
    _stub(monkeypatch, ["right"] * 8, ["wrong"] * 8)
    result = _gate(suite)()  # 16 asked, 8 tasks: all 8 are needed, and they are there
    assert result.decision == "select" and result.prompts == 8, result.reason
    _stub(monkeypatch, ["right"] * 7 + ["?"], ["wrong"] * 8)
    assert _gate(suite)().reason.startswith("gate void: 7 of 8 pairs valid, 8 needed")


@pytest.mark.model_free
def test_a_clear_win_stops_the_gate_early_and_nothing_else_does(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite(tmp_path, 48)
    asked: list[int] = []
    _stub(monkeypatch, ["right"] * 48, ["wrong"] * 48, asked)
    result = _gate(suite)()  # 3 looks of 16 random tasks: 16 of 16 won is p = 3e-5, below 0.001
    assert result.decision == "select" and result.stopped_early, result.reason
    assert result.tasks_sampled == result.prompts == len(asked) == 16 and len(set(asked)) == 16
    assert asked != list(range(16)), "a look samples a random part of the suite, not its first tasks"
    assert "stopped early at look 1 of 3 (16 of 48 tasks): both statistics passed at 99.9%" in result.reason
    # The probe (what a swap's canary must reproduce) is the suite's first task's, whatever the order.
    assert result.probe is not None and result.probe.text == "probe of q0" and result.probe.messages == [
        {"role": "user", "content": "q0"}]
    assert result.per_prompt is not None and [o.messages[0]["content"] for o in result.per_prompt] == [
        f"q{i}" for i in sorted(asked)]  # in suite order

    # 14 tasks won and 2 lost (p = 0.004) pass at 95 % but no look's share of them at 99.9 % (that
    # needs 11 of 11, or 13 of 14): the gate samples on, to the whole suite.
    asked.clear()
    _stub(monkeypatch, ["right"] * 14 + ["wrong"] * 34, ["wrong"] * 14 + ["right"] * 2 + ["wrong"] * 32, asked)
    result = _gate(suite)()
    assert result.decision == "select" and not result.stopped_early and result.tasks_sampled == 48, result.reason
    assert sorted(asked) == list(range(48)) and result.probe is not None and result.probe.text == "probe of q0"
    # A rejection takes the whole suite; one look samples it in suite order, as gates did before looks.
    asked.clear()
    _stub(monkeypatch, ["wrong"] * 48, ["right"] * 48, asked)
    assert _gate(suite)().decision == "reject" and sorted(asked) == list(range(48))
    asked.clear()
    _stub(monkeypatch, ["right"] * 48, ["wrong"] * 48, asked)
    one = _gate(suite, looks=1)()
    assert one.decision == "select" and not one.stopped_early and asked == list(range(48))
    # A look holds at least min_valid_pairs tasks (fewer could never select): 48 tasks at 24 a
    # verdict are two looks; at 32, one.
    assert [len(p) for p in plan_looks(48, 3, 0, 24)] == [24, 24] and plan_looks(48, 3, 0, 32) == [list(range(48))]
    asked.clear()
    assert _gate(suite, min_valid_pairs=32)().tasks_sampled == 48 and asked == list(range(48))


@pytest.mark.model_free
def test_the_same_replies_get_the_same_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite(tmp_path, 30)
    _stub(monkeypatch, (["right", "wrong", "right"] * 10), (["wrong", "right", "wrong", "wrong", "right"] * 6))
    first, second = _gate(suite)(), _gate(suite)()
    fields = {"decision", "reason", "delta", "ci_low", "ci_high", "wins", "losses", "ties", "sign_p"}
    assert first.model_dump(include=fields) == second.model_dump(include=fields)


# --- seeded sampling: the same candidate twice, on the tiny model with transformers -------------------


@pytest.mark.any_model
def test_transformers_gate_twice_samples_the_same_replies_and_verdict(tiny_model: Path) -> None:
    """The transformers path (full-weight candidates, gates without an engine) samples with the
    suite's eval seed, as the engine path does per task (tests/test_gate_engine.py checks that one):
    gating the same candidate twice samples the same replies and reaches the same verdict."""
    suite = eval_suite(get_scenario(demo.SCENARIO))  # demo-add: temperature 1
    suite.tasks, suite.max_new_tokens, suite.seed = suite.tasks[:12], 8, 3
    config = GateSettings(samples=2, probe_tokens=1)

    def run() -> tuple[list[list[str]], str]:
        result = gate_weights(Weights(tiny_model), Weights(tiny_model), suite, config, progress=False)
        assert result.backend == "transformers" and result.per_prompt is not None
        return [o.candidate_replies + o.head_replies for o in result.per_prompt], result.decision

    first = run()
    assert run() == first
    assert any(len(set(replies)) > 1 for replies in first[0])  # temperature 1: sampled, not greedy
