"""The bundled multi-turn tool scenario (examples/shop): its environment executes the agent's tool
calls in episodes, with a bound on turns; Hermes calls are parsed as vLLM's parser reads them; the
environment is declared like a reward; the rollout helper's masks cover exactly the model's own
tokens of a whole episode; through vLLM the embedded model's calls are parsed and executed; and
agent sessions from live traffic, trained on with rft trajectories, teach the model the tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef.config import ServeConfig, resolve
from reef.recipe import Snapshot, load_recipe
from reef.scenario import EpisodeState, Scenario, ScenarioError, environment_for, eval_suite, get_scenario
from reef.scenario.environment import parse_reply
from tests.helpers import MODEL_NAME, REPO
from tests.helpers.gateway import Gateway, wait_flushed

SHOP = REPO / "examples" / "shop"


@pytest.fixture(scope="module")
def shop_config() -> ServeConfig:
    return resolve(config_file=SHOP / "serve.yaml")[0]


@pytest.fixture(scope="module")
def shop(shop_config: ServeConfig) -> Scenario:
    return get_scenario("shop", shop_config)


@pytest.fixture(scope="module")
def shop_recipe_params(shop_config: ServeConfig) -> dict[str, Any]:
    """The example's own recipe parameters (serve.yaml `recipes.shop-rft.params`): what a user runs."""
    return dict(shop_config.recipes["shop-rft"].params)


def _call(item: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "price", "arguments": json.dumps({"item": item})}}]}


def test_an_episode_runs_the_tool_and_ends_at_the_answer(shop: Scenario) -> None:
    suite = eval_suite(shop)
    task = suite.tasks[0]
    state = EpisodeState(task, environment_for(shop), shop.environment.max_turns)
    results = state.advance(_call(task["item"]))
    assert results == [{"role": "tool", "tool_call_id": "c1", "content": f"{task['item']}: {task['price']}"}]
    assert not state.done and state.messages[-2]["tool_calls"][0]["function"]["name"] == "price"
    assert state.advance({"role": "assistant", "content": f"Answer: {task['price']}"}) == []
    assert state.done and state.turns == 2 and state.tool_calls == 1
    assert [s.value for s in suite.reward([task], [state.reply])] == [1.0]
    # The environment answers what was asked: another item gets an error, not this task's price.
    wrong = EpisodeState(task, environment_for(shop), 3)
    assert "error" in wrong.advance(_call("no-such-item"))[0]["content"]
    # max_turns bounds an agent that never stops calling: its last call is the (unscorable-as-right) reply.
    looping = EpisodeState(task, environment_for(shop), 2)
    looping.advance(_call(task["item"]))
    assert looping.advance(_call(task["item"])) == [] and looping.done and "<tool_call>" in looping.reply
    assert [s.value for s in suite.reward([task], [looping.reply])] == [0.0]


def test_parse_reply_reads_hermes_tool_calls() -> None:
    msg = parse_reply('<tool_call>{"name": "price", "arguments": {"item": "lamp"}}</tool_call>')
    assert msg["content"] is None and msg["tool_calls"][0]["function"] == {"name": "price",
                                                                         "arguments": '{"item": "lamp"}'}
    assert parse_reply("Answer: 12") == {"role": "assistant", "content": "Answer: 12"}
    broken = '<tool_call>{"name": "price", "arguments": {"item": </tool_call>'
    assert parse_reply(broken) == {"role": "assistant", "content": broken}


def test_the_environment_is_declared_like_a_reward(tmp_path: Path) -> None:
    s = Scenario(name="x", environment="shop_env:Shop", base_dir=tmp_path)
    assert s.environment is not None and s.environment.factory == "shop_env:Shop" and s.environment.max_turns == 4
    with pytest.raises(ScenarioError, match="environment"):
        environment_for(s)  # no such module next to it
    (tmp_path / "shop_env.py").write_text("class Shop:\n    pass\n")
    with pytest.raises(ScenarioError, match="execute"):
        environment_for(s.model_copy(update={"environment": s.environment.model_copy(
            update={"factory": "shop_env:Shop"})}))
    assert Scenario(name="y").environment is None and environment_for(Scenario(name="y")) is None


def test_episode_rollouts_mask_the_tool_results(shop: Scenario, tiny: Path) -> None:
    """Self-generated experience: every episode is one completion; the model's turns are actions,
    the tool result and the turn markup around it are context. The policy is scripted (a call,
    then the answer) so the masks are checked on known turns; the ids are the real tokenizer's."""
    from transformers import AutoTokenizer

    from reef.sampling.completion import Completion
    from reef.sampling.episodes import run_episodes
    from reef.sampling.transformers import TransformersSampler, chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tasks = eval_suite(shop).tasks[:3]
    by_prompt: dict[int, dict] = {}

    class Scripted(TransformersSampler):
        def sample_ids(self, prompts: list[list[int]], n: int, **_: object) -> list:  # type: ignore[override]
            out = []
            for ids in prompts:
                task = by_prompt[len(out)]
                text = tokenizer.decode(ids)
                reply = (f"Answer: {task['price']}" if "<|im_start|>tool" in text else
                         f'<tool_call>{{"name": "price", "arguments": {{"item": "{task["item"]}"}}}}</tool_call>')
                completion = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
                out.append([Completion(list(ids), completion, reply)])
            return out

    by_prompt.update(enumerate(tasks))
    groups = run_episodes(Scripted(None, tokenizer), tasks, environment_for(shop), 3, 1, max_new_tokens=32,
                          temperature=1.0, exact_ids=True)
    for task, (r,) in zip(tasks, groups, strict=True):
        assert r.prompt_ids == chat_prompt_ids(tokenizer, task["messages"], task["tools"])
        assert r.text == f"Answer: {task['price']}" and len(r.mask) == len(r.completion_ids)
        context = tokenizer.decode([t for t, m in zip(r.completion_ids, r.mask, strict=True) if m == 0])
        actions = tokenizer.decode([t for t, m in zip(r.completion_ids, r.mask, strict=True) if m == 1])
        assert context == f"\n<|im_start|>tool\n{task['item']}: {task['price']}<|im_end|>\n<|im_start|>assistant\n"
        assert actions.startswith("<tool_call>") and actions.endswith(f"Answer: {task['price']}<|im_end|>")
        # The whole episode is exactly what the chat template renders for its conversation.
        call = {"id": "c", "type": "function", "function": {"name": "price", "arguments": {"item": task["item"]}}}
        final = [*task["messages"], {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "c", "content": f"{task['item']}: {task['price']}"},
                 {"role": "assistant", "content": f"Answer: {task['price']}"}]
        rendered = tokenizer.apply_chat_template(final, tools=task["tools"], tokenize=False)
        assert tokenizer.decode(r.prompt_ids + r.completion_ids) == rendered.removesuffix("\n")


def test_the_gate_engine_runs_episodes_through_vllm(vllm_url: str, shop: Scenario) -> None:
    """vLLM parses the model's call (hermes), the environment executes it, the model goes on to a
    final answer. Seeded per task, sample and turn: a rerun gives the same episodes."""
    import asyncio

    from reef.sampling.engine import EngineEndpoint, EngineSession, run_session

    suite = eval_suite(shop)
    tasks = suite.tasks[:24]
    env = environment_for(shop)
    calls: list[tuple[dict, str]] = []

    class Counting:
        def execute(self, task: dict, call: object) -> str:
            result = env.execute(task, call)
            calls.append((task, result))
            return result

    async def body(session: EngineSession) -> list[list[str]]:
        return list(await asyncio.gather(*(session.episodes(MODEL_NAME, t, Counting(), 3, samples=4, max_tokens=32,
                                                            temperature=1.0, seed=i) for i, t in enumerate(tasks))))

    got = run_session(EngineEndpoint(vllm_url, MODEL_NAME), 32, body)
    assert calls, "no episode called the tool"
    assert all(r == f"{t['item']}: {t['price']}" or r.startswith("error") for t, r in calls)
    assert [len(g) for g in got] == [4] * len(tasks) and all("<|im_start|>" not in r for g in got for r in g)
    first = len(calls)
    assert run_session(EngineEndpoint(vllm_url, MODEL_NAME), 32, body) == got and len(calls) == 2 * first


def test_agent_sessions_from_live_traffic_teach_the_tool(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory,
                                                         shop: Scenario, shop_recipe_params: dict[str, Any],
                                                         tiny: Path) -> None:
    """Simulated agents through the gateway (the client executes price(item) via the scenario's
    environment, one x-reef-session per run, one session report on the final answer); rft on the
    whole rewarded sessions (masked loss) lifts held-out success on items never in the traffic."""
    from reef.config import GateSettings
    from reef.gate.arms import Weights
    from reef.gate.evaluate import gate_weights
    from reef.traffic.simulate import simulate

    summary = simulate(gateway.url, shop, requests=384, concurrency=16, seed=0, progress=False)
    assert summary.errors == 0 and summary.reports == 384
    multi = [ids for ids in summary.sessions.values() if len(ids) > 1]
    assert multi, "no simulated agent called the tool"
    wait_flushed(gateway)
    first, second = (httpx.get(f"{gateway.url}/reef/records/{r}", headers={"x-reef-scenario": "shop"}).json()
                     for r in multi[0][:2])
    assert first["choices"][0]["tool_calls"][0]["name"] == "price"
    assert second["messages"][-1]["role"] == "tool"
    assert second["gen_ai.conversation.id"] == first["gen_ai.conversation.id"]
    params = shop_recipe_params
    assert params["trajectories"] and not params["drop_duplicates"]
    recipe = load_recipe("rft", {**params, "scenario": "shop", "base_model": str(tiny)}, declared=shop)
    snap = Snapshot.create("shop", gateway.data_dir, recipe.experience(), root=tmp_path_factory.mktemp("snap"),
                           ledger_root=tmp_path_factory.mktemp("ledger"))
    assert snap.trajectories()["turns"].max() >= 2
    candidate = recipe.run(snap, out_root=tmp_path_factory.mktemp("cand"), progress=False)
    suite = eval_suite(shop)
    suite.tasks = suite.tasks[:40]
    result = gate_weights(Weights.of_folder(candidate.path), Weights(tiny), suite, GateSettings(samples=4),
                          progress=False)
    assert result.decision == "select", result.reason
    assert result.candidate_success >= result.head_success + 0.2, result.reason
