"""The ladder's harness rung, model-free: few-shot examples mined from rewarded replies (distinct
replies first, tool calls kept and rendered by the chat template as the model writes a call, a
record whose conversation goes on after the user left out, the snapshot not consumed); the learner
runs a harness round before exploration while a few rewarded records are in but fewer than its own
recipe wants, says why, tries each head once, then moves on to exploration; and only where it fits.
The rung through a real engine: tests/test_harness_rung_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reef.config import ServeConfig
from reef.experience.schema import Choice, Message, ToolCall
from reef.experience.store import ExperienceStore
from reef.learn.harness_rung import harness_reason
from reef.learn.learner import Learner
from reef.learn.plan import Thresholds
from reef.model.smollm2 import CHAT_TEMPLATE as SMOLLM2_TEMPLATE
from reef.recipe import ledger, load_recipe
from reef.recipe.harness_recipe import ProposalContext
from reef.recipe.shots import Rewarded
from reef.recipe.snapshot import Snapshot
from reef.registry.artifacts import ArtifactStore
from reef.registry.candidates import register_candidate
from reef.registry.chain import ReleaseChain
from reef.registry.harness import SHOTS_FILE, Harness, inject
from reef.scenario import HarnessSpec, Scenario
from tests.helpers.records import MANUAL, make_record, make_report
from tests.helpers.tokenizers import byte_tokenizer

pytestmark = pytest.mark.model_free

S = "weather"
CALL = ToolCall(id="chatcmpl-tool-1", name="get_weather", arguments='{"city": "Oslo"}')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _scenario_files(folder: Path) -> None:
    """A weather scenario's practice tasks, eval suite and reward (what exploration also needs)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"task_id": f"t{i}", "messages": [{"role": "user", "content": f"Weather in city {i}?"}], "city": f"c{i}",
             "tools": TOOLS} for i in range(6)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
    (folder / "weather_reward.py").write_text("def reward(task, reply):\n    return float(task['city'] in reply)\n")


def _record(i: int, reply: str | None, calls: list[ToolCall] | None = None, turns: list[Message] | None = None):  # noqa: ANN202
    messages = turns or [Message(role="user", content=f"question {i}")]
    return make_record(i, scenario=S, release=f"{S}@r0", messages=messages,
                       choices=[Choice(index=0, content=reply, finish_reason="stop", tool_calls=calls or [],
                                                       token_ids=[i, 7], logprobs=[-0.5, -0.5])])


def _store(data: Path, scored: list[tuple[object, float]]) -> None:
    with ExperienceStore(data, MANUAL) as store:
        store.append_records_sync([r for r, _ in scored])
        store.append_reports_sync([make_report(f"rep_{r.record_id}", [r.record_id], score, scenario=S)  # type: ignore[attr-defined]
                                   for r, score in scored])
        store.flush()


def test_rewarded_replies_become_few_shot_examples_with_their_tool_calls(tmp_path: Path) -> None:
    data = tmp_path / "data"
    agent = [Message(role="user", content="question 4"),
             Message(role="assistant", tool_calls=[CALL]), Message(role="tool", content="sunny", tool_call_id="c")]
    _store(data, [(_record(0, "Answer: 3"), 1.0), (_record(1, "Answer: 3"), 1.0), (_record(2, None, [CALL]), 1.0),
                  (_record(3, "prose"), 0.0), (_record(4, "It is sunny.", turns=agent), 1.0),
                  (_record(5, "Answer: 7"), 0.5)])
    declared = Scenario(name=S, harness=HarnessSpec(inject="system_prepend"), base_dir=tmp_path)
    recipe = load_recipe("harness_evolve", {"scenario": S, "proposer": "mined", "max_shots": 3,
                                            "failure_below": 1.0, "consume": False}, declared=declared)
    snap = Snapshot.create(S, data, recipe.experience(), root=tmp_path / "snaps", ledger_root=data / "ledger")
    candidate = recipe.run(snap, out_root=tmp_path / "cands", progress=False)

    # Distinct replies first (the call, then the repeat), the agent's turn after a tool result left
    # out, the 0.5 below the threshold not shown.
    lines = [json.loads(line) for line in (candidate.path / SHOTS_FILE).read_text().splitlines()]
    assert lines == [{"user": "question 0", "assistant": "Answer: 3"},
                     {"user": "question 2", "assistant": "",
                      "tool_calls": [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]},
                     {"user": "question 1", "assistant": "Answer: 3"}]
    assert candidate.mutations == [{"op": "create", "path": SHOTS_FILE, "content": "".join(
        json.dumps(line) + "\n" for line in lines), "reason": "3 rewarded replies as few-shot examples"}]
    assert candidate.metrics["rewarded"] == 4 and candidate.metrics["failures"] == 2
    assert ledger.consumed(data / "ledger", S).height == 0  # the own recipe still trains on them

    # Served: the call is an assistant turn with its tool call, which SmolLM2's template writes as
    # the `<tool_call>` markup the model writes (and vLLM's hermes parser reads).
    harness = Harness("", {SHOTS_FILE: (candidate.path / SHOTS_FILE).read_text()})
    sent = inject([{"role": "user", "content": "Weather in Lima?"}], harness, "system_prepend")
    assert [m["role"] for m in sent] == ["user", "assistant"] * 3 + ["user"]
    assert sent[3]["tool_calls"] == [{"id": "call_shot1_0", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    text = byte_tokenizer(SMOLLM2_TEMPLATE).apply_chat_template(sent, tools=TOOLS, tokenize=False,
                                                                 add_generation_prompt=True)
    assert ('<|im_start|>user\nquestion 2<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n') in text


def test_a_harness_with_examples_gets_no_more_and_corrections_still_count() -> None:
    evolve = load_recipe("harness_evolve", {"scenario": S, "proposer": "mined", "max_shots": 2})
    good = [Rewarded(f"r{i}", [{"role": "user", "content": f"q{i}"}], f"A{i}", 1.0) for i in range(3)]
    context = ProposalContext(scenario=S, files={}, harness_id=None, failures=[], records=3, inject="system_prepend",
                              rewarded=good)
    (mutation,) = evolve.propose(context)
    assert Harness("", {SHOTS_FILE: mutation.content or ""}).shots() == [("q0", "A0"), ("q1", "A1")]
    shown = ProposalContext(**{**context.__dict__, "files": {SHOTS_FILE: mutation.content}})
    assert evolve.propose(shown) == []


def test_the_harness_reason_needs_a_few_rewarded_but_fewer_than_the_recipe_wants() -> None:
    rft = Thresholds(records=16, rewarded=4)
    reason = harness_reason({"rewarded": 3, "unrewarded": 9}, rft, 2)
    assert reason == "harness: 3 rewarded replies as few-shot examples"
    assert harness_reason({"rewarded": 1, "unrewarded": 9}, rft, 2) is None  # nothing to show yet
    assert harness_reason({"rewarded": 4, "unrewarded": 9}, rft, 2) is None  # the own round is due
    assert harness_reason({"rewarded": 3}, Thresholds(records=16, unrewarded=4), 2) is None  # not waiting for rewards


def _config(folder: Path, inject: str = "system_prepend", harness: object = True) -> ServeConfig:
    declared = {"recipe": "mine", "reward": "weather_reward:reward", "tasks": "tasks.jsonl",
                "eval": {"path": "eval.jsonl"}, "base_dir": str(folder), "harness": {"inject": inject}}
    # Exploration as soon as rewards are rare (not after watching the reports' rate): no traffic flows here.
    return ServeConfig(data_dir=folder / "data", learner={"enabled": True, "interval_s": 1, "harness": harness,
                                                          "explore": {"live_horizon_s": None}},
                       recipes={"mine": {"recipe": "rft", "params": {"kind": "lora"}}}, scenarios={S: declared})


def test_the_learner_shows_rewarded_replies_before_exploring_once_per_head(tmp_path: Path) -> None:
    _scenario_files(tmp_path)
    config = _config(tmp_path)
    _store(config.data_dir, [(_record(i, f"Answer {i}"), 1.0 if i < 3 else 0.0) for i in range(16)])
    learner = Learner(config, engine_url="http://127.0.0.1:9", engine_model="m")
    state = learner.scenarios[S]
    assert learner.plan_tick() == S
    mine = learner.describe()["scenarios"][S]
    assert mine["harness"] == "harness: 3 rewarded replies as few-shot examples"
    assert mine["exploring"] is None  # the harness rung goes first
    assert mine["waiting"] == "waiting: 3 of 4 rewarded, 3 of 4 records"  # rft still waits (for rewarded ones)
    plan = state.round_plan()
    assert plan.recipe == "harness_evolve" and state.harnessing and not state.exploring
    assert plan.params == {"proposer": "mined", "consume": False, "failure_below": 1.0} and plan.wait_for is None

    # The gate rejected its examples: this head is tried, and the ladder moves on to exploration.
    state.rounds, state.last = 1, {"status": "trained", "release": None}
    state.explored(None, 0)
    assert state.harness is not None and state.harness.tried == [f"{S}@r0"] and not state.harnessing
    assert learner.plan_tick() == S
    mine = learner.describe()["scenarios"][S]
    assert mine["harness"] is None and mine["exploring"] == "exploring: 3 of 4 rewarded in 16 reported records"
    assert state.round_plan().recipe == "explore"

    # A restarted learner finds that round's candidate in the register: the head stays tried.
    fresh = Learner(config)
    assert fresh.plan_tick() == S and fresh.scenarios[S].harness.reason is not None  # type: ignore[union-attr]
    rung = state.harness.plan
    recipe = load_recipe(rung.recipe, rung.recipe_params(), declared=config.scenario(S))
    snap = Snapshot.create(S, config.data_dir, recipe.experience(), root=rung.snapshot_root,
                           ledger_root=rung.ledger_root)
    register_candidate(config.data_dir, recipe.run(snap, out_root=tmp_path / "cands", progress=False).path)
    again = Learner(config)
    assert again.plan_tick() is None and again.scenarios[S].harness.tried == [f"{S}@r0"]  # type: ignore[union-attr]

    # A new head (here a harness without examples) is tried again; one that shows examples is not.
    store = ArtifactStore.for_data_dir(config.data_dir)
    chain = ReleaseChain.for_data_dir(config.data_dir, S)
    r0 = chain.ensure_base("b" * 64)
    shot = '{"user": "q", "assistant": "a"}\n'
    for name, files in (("rules", {"rules.md": "- Be brief.\n"}), ("shots", {SHOTS_FILE: shot})):
        tree = tmp_path / name
        tree.mkdir()
        for rel, text in files.items():
            (tree / rel).write_text(text)
        head = chain.publish(chain.head().release_id, r0.content_id, "full", "train",  # type: ignore[union-attr]
                             harness_id=store.import_harness(tree).content_id)
        state.exploration = None  # only the harness rung
        learner.plan_tick()
        assert (state.harness.reason is not None) == (name == "rules"), (head.release_id, state.harness.reason)


def test_the_harness_rung_only_where_it_fits(tmp_path: Path) -> None:
    _scenario_files(tmp_path)
    fits = Learner(_config(tmp_path)).scenarios[S].harness  # no engine needed: the gate runs without one
    assert fits is not None and fits.plan.recipe == "harness_evolve"
    assert Learner(_config(tmp_path, inject="off")).scenarios[S].harness is None  # clients apply it, if at all
    assert Learner(_config(tmp_path, harness=False)).scenarios[S].harness is None
    assert Learner(_config(tmp_path, harness={"min_rewarded": 4})).scenarios[S].harness is None  # no room below rft's 4
    custom = Learner(_config(tmp_path, harness={"params": {"max_shots": 5}})).scenarios[S].harness
    assert custom is not None and custom.plan.params["max_shots"] == 5
