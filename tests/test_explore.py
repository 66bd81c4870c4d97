"""Exploration when live rewards are rare, model-free: a guided tool call is trained as the chat
template writes that assistant turn (token-exact with the rendered conversation); the explore
recipe's rollouts keep their provenance, token ids and logprobs; the learner's ladder picks an
exploration round only where it fits (reward, practice tasks, a LoRA recipe that waits for
rewarded records, an engine), says why, and spaces such rounds. The recipe through a real engine:
tests/test_explore_engine.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
from pydantic import ValidationError

from recipes.explore.recipe import SOURCE, target_ids, training_rows
from reef.config import ServeConfig
from reef.config.learner import ExploreSettings
from reef.experience.store import ExperienceStore
from reef.learn.ladder import RATE_WINDOW_S, Exploration, explore_reason, live_wait_s
from reef.learn.learner import Learner
from reef.learn.plan import RoundPlan, Thresholds
from reef.model.smollm2 import CHAT_TEMPLATE as SMOLLM2_TEMPLATE
from reef.recipe.rollouts import Rollout, guidance, guided_share, rollout_metrics, write_rollouts
from reef.recipe.tokens import assistant_turn_ids
from reef.sampling.completion import Completion
from reef.sampling.engine_tokens import EngineSample, read_samples
from reef.scenario import ReplyFormat, Scenario
from tests.helpers.records import MANUAL, make_record, make_report
from tests.helpers.tiny.chat_format import CHAT_TEMPLATE as TINY_TEMPLATE
from tests.helpers.tokenizers import byte_tokenizer

pytestmark = pytest.mark.model_free

S = "weather"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
# What vLLM answers for a call its guided decoding wrote: the arguments as a JSON string.
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "chatcmpl-tool-1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}


@pytest.mark.parametrize("template", [SMOLLM2_TEMPLATE, TINY_TEMPLATE], ids=["smollm2", "tiny"])
def test_a_guided_tool_call_is_trained_as_the_template_writes_it(template: str) -> None:
    tok = byte_tokenizer(template)
    ids = assistant_turn_ids(tok, ASK, CALL, TOOLS)
    text = tok.decode(ids)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call><|im_end|>"), text
    assert json.loads(text[len("<tool_call>"):-len("</tool_call><|im_end|>")]) == {
        "name": "get_weather", "arguments": {"city": "Oslo"}}  # a dict, not the quoted string vLLM sent
    # Token-exact: the prompt's ids and the turn's are the whole rendered conversation's, up to the turn's end.
    prompt = tok.apply_chat_template(ASK, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template([*ASK, {**CALL, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}],
        tools=TOOLS, tokenize=False)
    assert whole.startswith(prompt + text)
    assert tok.encode(prompt, add_special_tokens=False) + ids == tok.encode(prompt + text, add_special_tokens=False)
    # Plain content ends at the end-of-turn token too.
    assert tok.decode(assistant_turn_ids(tok, ASK, {"content": "Sunny."})) == "Sunny.<|im_end|>"


def test_engine_samples_keep_ids_logprobs_and_the_parsed_call() -> None:
    got = read_samples({"prompt_token_ids": [1, 2], "choices": [
        {"index": 1, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length",
         "token_ids": [5], "logprobs": {"content": [{"logprob": -0.5}]}},
        {"index": 0, "message": CALL, "finish_reason": "tool_calls", "token_ids": [7, 8],
         "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]}}]})
    call, plain = got
    assert call.completion.prompt_ids == [1, 2] and call.completion.completion_ids == [7, 8]
    assert call.completion.logprobs == [-1.0, -2.0]
    assert call.message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in call.completion.text
    assert (plain.completion.text, plain.completion.finish_reason) == ("hi", "length")


def _rollout(i: int, guided: bool, ids: list[int], message: dict, score: float | None) -> Rollout:
    return Rollout(i, f"t{i}", guided, EngineSample(Completion([1, 2], ids, "x", logprobs=[-0.1] * len(ids)), message),
                   score)


def test_rollouts_are_written_with_provenance_and_successes_become_examples(tmp_path: Path) -> None:
    tok = byte_tokenizer(SMOLLM2_TEMPLATE)
    tasks = {0: {"task_id": "t0", "messages": ASK, "tools": TOOLS}, 1: {"task_id": "t1", "messages": ASK}}
    plain = {"role": "assistant", "content": "x"}
    rollouts = [_rollout(0, True, [9, 9, 9], CALL, 1.0), _rollout(0, False, [4, 5], plain, 0.0),
                _rollout(1, False, [4, 5], plain, 1.0), _rollout(1, False, [4, 5], plain, 1.0),
                _rollout(1, False, [6], plain, None)]
    targets = [target_ids(r, tasks, tok) if r.score == 1.0 else [] for r in rollouts]
    path = write_rollouts(tmp_path / "rollouts", rollouts, targets, 1.0, SOURCE)
    back = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert len(back) == 5 and set(back["source"]) == {"exploration"}
    assert back[0]["guided"] and back[0]["completion_ids"] == [9, 9, 9] and back[0]["logprobs"] == [-0.1] * 3
    assert json.loads(back[0]["tool_calls"])[0]["function"]["name"] == "get_weather"
    assert tok.decode(back[0]["target_ids"]).startswith("<tool_call>")  # the markup, not the served JSON
    assert back[2]["target_ids"] == [4, 5] and back[1]["target_ids"] == []  # exactly as sampled; not kept
    assert back["reward"] == [1.0, 0.0, 1.0, 1.0, None] and back["success"] == [True, False, True, True, False]
    assert rollout_metrics(rollouts, 1.0) == {
        "rollouts": 5, "successes": 3, "success_rate": 0.6, "guided_rollouts": 1, "guided_successes": 1,
        "unscored_rollouts": 1, "explored_tasks": 2, "tool_call_rollouts": 1, "episodes": 0}

    rows = training_rows(rollouts, targets)
    assert rows.height == 2  # one task's same reply twice is one example
    guided, unguided = rows.to_dicts()
    assert guided["completion_ids"] == back[0]["target_ids"]
    assert unguided["completion_ids"] == [4, 5] and unguided["prompt_ids"] == [1, 2]


def test_guided_decoding_takes_half_of_a_tool_task_samples() -> None:
    assert guided_share({"messages": ASK, "tools": TOOLS}, 8, "auto") == 4
    assert guided_share({"messages": ASK}, 8, "auto") == 0
    assert guided_share({"messages": ASK, "tools": TOOLS, "tool_choice": "none"}, 8, "auto") == 0
    assert guided_share({"messages": ASK, "tools": TOOLS}, 8, "off") == 0
    with pytest.raises(ValueError, match="auto or off"):
        guided_share({"messages": ASK}, 8, "always")


def test_a_declared_reply_format_guides_half_of_a_task_without_tools() -> None:
    fmt = ReplyFormat(regex="Team: (delivery|billing)")
    wanted = fmt.structured_outputs()
    assert wanted == {"regex": "Team: (delivery|billing)"}
    assert guided_share({"messages": ASK}, 8, "auto", wanted) == 4
    assert guided_share({"messages": ASK}, 8, "off", wanted) == 0
    assert guidance({"messages": ASK}, True, wanted) == {"tool_choice": None, "structured_outputs": wanted}
    assert guidance({"messages": ASK}, False, wanted) == {"tool_choice": None}
    # A tool task is guided into a call, never into the reply format.
    assert guided_share({"messages": ASK, "tools": TOOLS}, 8, "auto", wanted) == 4
    assert guidance({"messages": ASK, "tools": TOOLS}, True, wanted) == {"tool_choice": "required"}
    assert guided_share({"messages": ASK, "tools": TOOLS, "tool_choice": "none"}, 8, "auto", wanted) == 0
    assert ReplyFormat(choice=["yes", "no"]).structured_outputs() == {"choice": ["yes", "no"]}
    assert ReplyFormat(json_schema={"type": "object"}).structured_outputs() == {"json": {"type": "object"}}
    for bad, says in (({}, "exactly one"), ({"regex": "a", "choice": ["a"]}, "exactly one"),
                      ({"regex": "(unclosed"}, "not a regular expression")):
        with pytest.raises(ValidationError, match=says):
            ReplyFormat(**bad)
    with pytest.raises(ValidationError, match="reply_format"):
        Scenario(name="s", reply_format={"regex": "[", "choice": None})


def test_the_exploration_rung_is_chosen_when_rewards_are_rare_and_spaced() -> None:
    rft = Thresholds(records=16, rewarded=4)
    reason = explore_reason({"rewarded": 0, "unrewarded": 20}, rft, 16)
    assert reason == "exploring: 0 of 4 rewarded in 20 reported records"
    assert explore_reason({"rewarded": 1, "unrewarded": 10}, rft, 16) is None  # too little traffic to call it rare
    assert explore_reason({"rewarded": 4, "unrewarded": 40}, rft, 16) is None  # enough to learn from
    assert explore_reason({"rewarded": 0, "unrewarded": 40}, Thresholds(records=16, unrewarded=4), 16) is None


def _scenario_files(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"task_id": f"t{i}", "messages": [{"role": "user", "content": f"Weather in city {i}?"}], "city": f"c{i}",
             "tools": TOOLS} for i in range(6)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
    (folder / "weather_reward.py").write_text("def reward(task, reply):\n    return float(task['city'] in reply)\n")


def _config(folder: Path, kind: str = "lora", explore: object = True, **scenario: object) -> ServeConfig:
    declared = {"recipe": "mine", "reward": "weather_reward:reward", "tasks": "tasks.jsonl",
                "eval": {"path": "eval.jsonl"}, "base_dir": str(folder), **scenario}
    return ServeConfig(data_dir=folder / "data", learner={"enabled": True, "explore": explore, "interval_s": 1},
                       recipes={"mine": {"recipe": "rft", "params": {"kind": kind}}},
                       scenarios={S: {k: v for k, v in declared.items() if v is not None}})


def test_the_learner_explores_only_where_it_fits(tmp_path: Path) -> None:
    _scenario_files(tmp_path)
    engine = {"engine_url": "http://127.0.0.1:9", "engine_model": "m"}
    fits = Learner(_config(tmp_path), **engine).scenarios[S].exploration
    assert fits is not None and fits.plan.recipe == "explore" and fits.plan.params["kind"] == "lora"
    assert fits.plan.wait_for is None  # the learner decided; the round does not wait on live counts
    assert Learner(_config(tmp_path)).scenarios[S].exploration is None  # no engine to sample through
    assert Learner(_config(tmp_path, kind="full"), **engine).scenarios[S].exploration is None
    assert Learner(_config(tmp_path, explore=False), **engine).scenarios[S].exploration is None
    assert Learner(_config(tmp_path, tasks=None), **engine).scenarios[S].exploration is None
    assert Learner(_config(tmp_path, reward=None), **engine).scenarios[S].exploration is None
    params = {"enabled": True, "params": {"samples": 4, "temperature": 0.7}}
    assert Learner(_config(tmp_path, explore=params), **engine).scenarios[S].exploration.plan.params == {
        "kind": "lora", "samples": 4, "temperature": 0.7}


def test_a_round_explores_while_live_rewards_are_rare_and_says_why(tmp_path: Path) -> None:
    _scenario_files(tmp_path)
    config = _config(tmp_path, explore={"live_horizon_s": None})  # no waiting on live traffic's rate here
    data = config.data_dir
    with ExperienceStore(data, MANUAL) as store:
        records = [make_record(i, scenario=S, release=f"{S}@r0") for i in range(16)]
        store.append_records_sync(records)
        store.append_reports_sync([make_report(f"rep_{r.record_id}", [r.record_id], 0.0, scenario=S)
                                   for r in records])
        store.flush()
    learner = Learner(config, engine_url="http://127.0.0.1:9", engine_model="m")
    state = learner.scenarios[S]
    assert learner.plan_tick() == S
    mine = learner.describe()["scenarios"][S]
    assert mine["exploring"] == "exploring: 0 of 4 rewarded in 16 reported records"
    assert mine["waiting"] == "waiting: 0 of 4 rewarded, 0 of 4 records"  # the own recipe still waits
    assert state.round_plan().recipe == "explore" and state.exploring

    # It found nothing: the next exploration waits retry_s, and the own recipe's idle mark is untouched.
    state.rounds, state.last = 1, {"status": "nothing_new", "release": None}
    state.explored(None, 0)
    assert state.exploration is not None and state.exploration.fruitless == 1 and state.idle_at is None
    assert learner.plan_tick() is None and learner.describe()["scenarios"][S]["exploring"] is None
    assert state.round_plan().recipe == "rft"


def test_exploration_backs_off_after_rounds_that_release_nothing() -> None:
    rung = Exploration(RoundPlan(scenario=S, recipe="explore"), ExploreSettings(retry_s=10, live_horizon_s=None))
    rare = {"rewarded": 0, "unrewarded": 30}
    rft = Thresholds(records=16, rewarded=4)
    assert rung.check(rare, rft, "waiting", now=0.0) is not None
    waits = []
    for k in range(5):
        rung.finished("trained", None, now=100.0 * k)
        waits.append(rung.next_at - 100.0 * k)
    assert waits == [10, 20, 40, 80, 80]
    assert rung.check(rare, rft, "waiting", now=rung.next_at - 1) is None
    assert rung.check(rare, rft, "waiting", now=rung.next_at) is not None
    assert rung.check(rare, rft, None, now=rung.next_at) is None  # the own round is due: it goes first
    rung.finished("trained", "weather@r1", now=1000.0)
    assert rung.next_at == 1010.0 and rung.fruitless == 0


def test_exploration_waits_while_live_traffic_should_bring_rewards_soon() -> None:
    """Live traffic is a policy sampling too: at 1 % success and 3 reports a second, it brings the
    missing rewarded records sooner than an exploration round would; where none was ever rewarded,
    the expected wait grows with each report until exploring is worth it."""
    rft = Thresholds(records=16, rewarded=4)
    assert live_wait_s({"rewarded": 2, "unrewarded": 198}, rft, 3.0) == pytest.approx(2 / (2.5 / 201 * 3.0))
    assert live_wait_s({"rewarded": 0, "unrewarded": 20}, rft, 0.0) == math.inf
    rung = Exploration(RoundPlan(scenario=S, recipe="explore"), ExploreSettings(live_horizon_s=300))
    rare = lambda reported, rewarded=0: {"rewarded": rewarded, "unrewarded": reported - rewarded}  # noqa: E731
    assert rung.check(rare(20), rft, "waiting", now=0.0) is None  # no rate yet
    assert rung.live_wait is None and rung.describe(now=0.0)["live_wait_s"] is None
    # 3 reports a second, 1 of 120 rewarded: ~4 in a minute or so: wait for them.
    assert rung.check(rare(120, 1), rft, "waiting", now=(120 - 20) / 3) is None
    assert rung.live_wait is not None and rung.live_wait < 300
    # 3 a second and none of 300 rewarded: the wait is past the horizon, so explore.
    reason = rung.check(rare(300), rft, "waiting", now=(300 - 20) / 3)
    assert reason == "exploring: 0 of 4 rewarded in 300 reported records"
    assert rung.live_wait > 300
    # Reports stop coming (the rate over the last two minutes falls to zero): explore.
    idle = Exploration(RoundPlan(scenario=S, recipe="explore"), ExploreSettings(live_horizon_s=300))
    assert idle.check(rare(20), rft, "waiting", now=0.0) is None
    assert idle.check(rare(20), rft, "waiting", now=RATE_WINDOW_S) is not None
    assert idle.describe(now=RATE_WINDOW_S)["live_wait_s"] == "never"
    # Traffic that begins after a quiet minute is timed from its first report, not from the quiet.
    late = Exploration(RoundPlan(scenario=S, recipe="explore"), ExploreSettings(live_horizon_s=300))
    for t in range(0, 61, 10):
        assert late.check(rare(0), rft, "waiting", now=float(t)) is None
    assert late.check(rare(20), rft, "waiting", now=67.0) is None  # 20 reports in 7 s: too soon to tell
    assert late.check(rare(100, 1), rft, "waiting", now=93.3) is None and late.live_wait is not None
    assert late.live_wait == pytest.approx(live_wait_s(rare(100, 1), rft, 100 / 33.3))


def test_exploration_turns_to_on_policy_rl_once_successes_are_not_rare() -> None:
    explore, grpo = RoundPlan(scenario=S, recipe="explore"), RoundPlan(scenario=S, recipe="grpo")
    rung = Exploration(explore, ExploreSettings(rl_above=0.25), rl=grpo)
    assert rung.next_plan is explore
    # A tool scenario: only guided calls passed, none unasked: still expert iteration.
    rung.finished("trained", "w@r1", now=0.0, metrics={"rollouts": 64, "successes": 12, "guided_rollouts": 32,
                                                        "guided_successes": 12})
    assert rung.next_plan is explore
    rung.finished("trained", "w@r2", now=1.0, metrics={"rollouts": 64, "successes": 20, "guided_rollouts": 32,
                                                        "guided_successes": 10})  # 10 of 32 unasked
    assert rung.next_plan is grpo and rung.describe(now=1.0)["recipe"] == "grpo"
    rung.finished("nothing_new", None, now=2.0, metrics=None)  # says nothing: the rung stays
    assert rung.next_plan is grpo
    rung.finished("trained", None, now=3.0, metrics={"rollouts": 32, "successes": 2})  # rare again
    assert rung.next_plan is explore
    assert Exploration(explore, ExploreSettings(), rl=None).next_plan is explore  # rl_recipe: null
