"""The explore recipe through the session's real vLLM: the policy's rollouts sampled on the engine
with their token ids and behaviour logprobs, scored by the scenario's reward, written with their
provenance in the candidate folder, the successes trained on; a LoRA head explored under a
temporary adapter name that is unloaded afterwards; and a tool call that the model writes under
guided decoding (`tool_choice: "required"`), parsed by vLLM, scored, and trained on as the chat
template's `<tool_call>` markup. Model-free parts: tests/test_explore.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import datasets
import httpx
import pytest
import yaml
from transformers import AutoTokenizer

from reef.config import resolve
from reef.recipe import Snapshot, load_recipe
from reef.recipe.practice import practice_tasks
from reef.recipe.rollouts import RolloutPlan, sample_rollouts
from reef.sampling.engine import TEMP_PREFIX, Arm, EngineEndpoint
from reef.scenario import EvalSpec, Scenario, environment_for, get_scenario, reward_for
from tests.helpers import MODEL_NAME, REPO, TINY, wait_for
from tests.helpers.gateway import Gateway
from tests.helpers.tiny import task as demo

os.environ.setdefault("OMP_NUM_THREADS", "1")
pytestmark = [pytest.mark.vllm]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]
REWARD = '''import json, re

def reward(task, reply):
    """1 for a get_weather call (the tiny model's arguments are rarely right), as a reward reads a call."""
    for body in re.findall(r"<tool_call>\\s*(.*?)\\s*</tool_call>", reply, re.DOTALL):
        try:
            call = json.loads(body)
        except ValueError:
            continue
        arguments = call.get("arguments")
        if call.get("name") == "get_weather" and isinstance(arguments, dict):
            return 1.0
    return 0.0
'''


def _temporary(url: str) -> list[str]:
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    return [m["id"] for m in models if m.get("parent") and m["id"].startswith(TEMP_PREFIX)]


def _run(recipe_params: dict, scenario: Scenario, engine: EngineEndpoint, tmp_path: Path, name: str):  # noqa: ANN202
    recipe = load_recipe("explore", {"scenario": scenario.name, **recipe_params}, declared=scenario)
    recipe.engine = engine
    snap = Snapshot.create(scenario.name, tmp_path / "no-data", recipe.experience(), root=tmp_path / f"snaps-{name}",
                           ledger_root=tmp_path / f"ledger-{name}", allow_empty=True)
    return recipe.run(snap, out_root=tmp_path / f"cands-{name}", progress=False)


def _rollouts(path: Path) -> datasets.Dataset:
    files = list((path / "rollouts").glob("*.parquet"))
    assert files, f"no rollouts in {path}"
    return datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")


def test_explore_samples_scores_records_and_trains(vllm_url: str, serving_model: Path, tmp_path: Path) -> None:
    engine = EngineEndpoint(vllm_url, MODEL_NAME)
    common = {"base_model": str(serving_model), "max_steps": 2, "sample_seed": 0}
    tok = AutoTokenizer.from_pretrained(serving_model)

    # A tool scenario: half of each task's samples under guided decoding, which makes the model
    # write the call (unasked, the tiny model calls a tool it was never offered).
    (tmp_path / "weather").mkdir()
    (tmp_path / "weather" / "weather_reward.py").write_text(REWARD)
    tasks = [{"task_id": f"w{i}", "messages": [{"role": "user", "content": f"What is the weather in {city}?"}],
              "tools": TOOLS} for i, city in enumerate(["Oslo", "Lima", "Rome", "Kyiv"])]
    (tmp_path / "weather" / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "weather" / "eval.jsonl").write_text(json.dumps({**tasks[0], "task_id": "e0"} | {
        "messages": [{"role": "user", "content": "Weather in Bern?"}]}) + "\n")
    weather = Scenario(name="weather", reward="weather_reward:reward", tasks=Path("tasks.jsonl"),
                       eval=EvalSpec(path=Path("eval.jsonl"), max_new_tokens=64), base_dir=tmp_path / "weather")
    tool_cand = _run({**common, "samples": 16, "max_prompts": 4, "max_new_tokens": 64}, weather, engine, tmp_path,
                     "weather")
    rows = _rollouts(tool_cand.path)
    m = tool_cand.metrics
    assert m["rollouts"] == 64 and m["guided_rollouts"] == 32 == sum(rows["guided"])
    called = [r for r in rows if r["guided"] and json.loads(r["tool_calls"])]
    assert called, "guided decoding gave no parsed tool call"
    assert all(json.loads(r["tool_calls"])[0]["function"]["name"] == "get_weather" for r in called)
    kept = [r for r in rows if r["guided"] and r["success"]]
    assert kept and m["guided_successes"] == len(kept)
    for r in kept:  # trained as the template's markup (whatever the grammar made the engine emit)
        target = tok.decode(r["target_ids"])
        assert target.startswith("<tool_call>") and target.endswith("</tool_call><|im_end|>"), target
        call = json.loads(target[len("<tool_call>"):-len("</tool_call><|im_end|>")])
        assert call["name"] == "get_weather" and call == {
            "name": "get_weather", "arguments": json.loads(json.loads(r["tool_calls"])[0]["function"]["arguments"])}
    assert tool_cand.kind == "lora" and m["train_samples"] >= 1
    assert _temporary(vllm_url) == []

    # demo-add through its declared reward and tasks (never its eval tasks), explored from the LoRA
    # just trained (the head a round continues from: loaded under a temporary adapter name). The
    # model is right about one time in eight, unevenly across tasks: 64 rollouts hold successes.
    demo_add = get_scenario("demo-add")
    cand = _run({**common, "samples": 8, "max_prompts": 8, "max_new_tokens": 16, "init_adapter": str(tool_cand.path)},
                demo_add, engine, tmp_path, "add")
    rows = _rollouts(cand.path)
    m = cand.metrics
    assert len(rows) == m["rollouts"] == 64 and set(rows["source"]) == {"exploration"}
    assert m["explored_tasks"] == 8 and m["guided_rollouts"] == 0
    assert all(r["prompt_ids"] and r["completion_ids"] for r in rows)
    assert all(len(r["logprobs"]) == len(r["completion_ids"]) for r in rows)  # behaviour logprobs, per token
    assert all(lp <= 0 for r in rows for lp in r["logprobs"])
    successes = [r for r in rows if r["success"]]
    assert successes and m["successes"] == len(successes) and all(r["reward"] == 1.0 for r in successes)
    assert all(r["target_ids"] == r["completion_ids"] for r in successes)  # unguided: trained as sampled
    assert not any(r["target_ids"] for r in rows if not r["success"])
    eval_prompts = {json.dumps(t["messages"]) for t in map(json.loads, demo_add.resolve_path(
        demo_add.eval.path).read_text().splitlines())} if demo_add.eval else set()
    asked = {tok.decode(r["prompt_ids"]) for r in rows}
    assert not any(json.loads(p)[-1]["content"] in a for p in eval_prompts for a in asked)  # eval stays unseen
    assert cand.kind == "lora" and m["train_samples"] >= 1 and m["snapshot_records"] == 0
    assert _temporary(vllm_url) == []

    # A round stops sampling once enough rollouts passed: one worker, so nothing else is in flight.
    cand = _run({**common, "samples": 8, "max_prompts": 16, "max_new_tokens": 16, "enough": 1, "concurrency": 1},
                demo_add, engine, tmp_path, "enough")
    m = cand.metrics
    assert m["sampling_stopped"].startswith("enough passed: ") and m["sampling_stopped"].endswith("(enough: 1)"), m
    assert m["successes"] >= 1 and m["rollouts"] < 128 and len(_rollouts(cand.path)) == m["rollouts"]


def test_the_learner_explores_while_live_rewards_are_rare(make_gateway) -> None:  # noqa: ANN001
    # Live traffic reported, none of it rewarded: the scenario's rft would wait; the learner's
    # exploration rung runs instead, says why, gates its candidate, and spaces the next one.
    # The tiny model passes about one sample in nine, some tasks never: 16 tasks x 8 samples so a
    # round always holds a success to train on.
    gw: Gateway = make_gateway("explore", extra_args=["--model", str(TINY)])
    gw.workdir.mkdir(parents=True, exist_ok=True)
    (gw.workdir / "tasks.jsonl").write_text("".join(json.dumps(demo.as_row(t)) + "\n" for t in demo.train_tasks()[:32]))
    (gw.workdir / "eval.jsonl").write_text("".join(json.dumps(demo.as_row(t)) + "\n" for t in demo.eval_tasks()[:8]))
    (gw.workdir / "adds.py").write_text(
        "import re\n\ndef reward(task, reply):\n    m = re.search(r'Answer:\\s*(-?\\d+)', reply)\n"
        "    return 1.0 if m and int(m.group(1)) == task['answer'] else 0.0\n")
    (gw.workdir / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "store": {"flush_interval_s": 0.2},
        "learner": {"enabled": True, "interval_s": 0.5, "min_records": 4, "min_rewarded": 4, "explore": {
            "min_reports": 4, "params": {"samples": 8, "max_prompts": 16, "max_steps": 2, "max_new_tokens": 12}}},
        "release": {"gate": {"samples": 1}},
        "recipes": {"r": {"recipe": "rft", "params": {"kind": "lora", "min_score": 1.0}}},
        "scenarios": {"adds": {"policy": "approval", "recipe": "r", "reward": "adds:reward", "tasks": "tasks.jsonl",
                               "eval": {"path": "eval.jsonl", "max_new_tokens": 12}}},
    }))
    gw.start()
    client = gw.client(**{"x-reef-scenario": "adds"})
    for t in demo.eval_tasks()[8:12]:
        raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=t.messages, max_tokens=8)
        report = {"agent_record_id": raw.headers["x-reef-agent-record-id"], "score": 0.0}
        assert httpx.post(f"{gw.url}/reef/report", json=report, headers={"x-reef-scenario": "adds"}).status_code == 200

    def learner() -> dict:
        return httpx.get(f"{gw.url}/reef/status", timeout=30).json()["learner"]["scenarios"]["adds"]

    seen: list[str | None] = []
    wait_for(lambda: seen.append(learner()["exploring"]) or seen[-1] is not None, timeout=120)
    assert seen[-1] == "exploring: 0 of 4 rewarded in 4 reported records"
    wait_for(lambda: (learner()["exploration"] or {}).get("rounds", 0) >= 1 and not learner()["running"],
             timeout=420)
    mine = learner()
    assert mine["exploration"]["last"]["status"] == "trained", mine
    assert mine["exploring"] is None and mine["exploration"]["next_in_s"] > 0  # spaced
    assert mine["waiting"] == "waiting: 0 of 4 rewarded, 0 of 4 records"  # rft still waits for live rewards
    rounds = [json.loads(line) for line in (gw.data_dir / "learner" / "rounds.jsonl").read_text().splitlines()]
    assert rounds[-1]["metrics"]["rollouts"] == 128 and rounds[-1]["gate"]["decision"] in ("select", "reject")
    assert mine["round"]["recipe"] == "explore", mine["round"]


def test_rollouts_of_a_scenario_with_an_environment_are_episodes(vllm_url: str) -> None:
    # examples/shop: the model calls price(item), the environment answers, the model replies. Each
    # model turn is a rollout of its own, token-exact, carrying its episode's score.
    shop = get_scenario("shop", resolve(config_file=REPO / "examples" / "shop" / "serve.yaml")[0])
    tasks, _ = practice_tasks(shop)
    plan = RolloutPlan(samples=2, temperature=1.0, max_tokens=32, max_turns=shop.environment.max_turns,
                       fruitless_after=None)
    reward = reward_for(shop)
    run = sample_rollouts(EngineEndpoint(vllm_url, MODEL_NAME), Arm(served=MODEL_NAME), dict(enumerate(tasks[:4])),
                          plan, lambda ts, replies: [s.value for s in reward(ts, replies)], environment_for(shop))
    assert run.episodes == 4 * 2
    by_episode: dict[int, list] = {}
    for r in run.rollouts:
        by_episode.setdefault(r.episode, []).append(r)
    assert sorted(by_episode) == list(range(8))
    for turns in by_episode.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] == list(range(len(turns))) and len(turns) <= shop.environment.max_turns
        assert len({r.score for r in turns}) == 1  # the episode's final reply's score, on every turn
        assert turns[0].context is None and all(r.context for r in turns[1:])
        assert not any(r.guided for r in turns[1:])  # only an episode's first turn may be guided
        for before, after in zip(turns, turns[1:], strict=False):
            # A later turn's prompt holds the earlier turn and the tool's result after it.
            assert after.sample.completion.prompt_ids[:len(before.sample.completion.prompt_ids)] == \
                before.sample.completion.prompt_ids
            assert any(m["role"] == "tool" for m in after.context or ())
    assert any(len(turns) > 1 for turns in by_episode.values()), "no episode called the tool"


def test_seeded_rollouts_sample_the_same_replies_again(vllm_url: str) -> None:
    """A plan with a seed sends every request a seed of its own (task, job, turn): a rerun samples the
    same tokens at temperature 1, another seed other ones."""
    shop = get_scenario("shop", resolve(config_file=REPO / "examples" / "shop" / "serve.yaml")[0])
    tasks, _ = practice_tasks(shop)

    def tokens(seed: int) -> list[tuple[int, ...]]:
        plan = RolloutPlan(samples=2, temperature=1.0, max_tokens=16, guided="off", seed=seed, fruitless_after=None)
        run = sample_rollouts(EngineEndpoint(vllm_url, MODEL_NAME), Arm(served=MODEL_NAME), dict(enumerate(tasks[:3])),
                              plan, lambda ts, replies: [0.0] * len(replies))
        return sorted(tuple(r.sample.completion.completion_ids) for r in run.rollouts)

    first = tokens(7)
    assert len(first) == 6
    assert tokens(7) == first
    assert tokens(8) != first


def test_a_declared_reply_format_guides_half_of_the_samples(vllm_url: str) -> None:
    """examples/reviews declares its reply format: half of each task's samples are asked under vLLM's
    structured outputs and all of those have the shape; the reward scores them as any reply."""
    reviews = get_scenario("reviews", resolve(config_file=REPO / "examples" / "reviews" / "serve.yaml")[0])
    assert reviews.reply_format is not None and reviews.reply_format.regex is not None
    tasks, _ = practice_tasks(reviews)
    plan = RolloutPlan(samples=4, temperature=1.0, max_tokens=32, fruitless_after=None, seed=0,
                       reply_format=reviews.reply_format.structured_outputs())
    reward = reward_for(reviews)
    run = sample_rollouts(EngineEndpoint(vllm_url, MODEL_NAME), Arm(served=MODEL_NAME), dict(enumerate(tasks[:4])),
                          plan, lambda ts, replies: [s.value for s in reward(ts, replies)])
    guided = [r for r in run.rollouts if r.guided]
    assert len(run.rollouts) == 16 and len(guided) == 8
    shape = re.compile(reviews.reply_format.regex)
    assert all(shape.fullmatch(r.sample.completion.text) for r in guided), [r.sample.completion.text for r in guided]
    assert all(r.score in (0.0, 1.0) for r in run.rollouts)
    assert all(r.sample.completion.completion_ids and len(r.sample.completion.logprobs or []) ==
               len(r.sample.completion.completion_ids) for r in guided)
