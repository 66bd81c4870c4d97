"""The scenario contract as a user meets it: rewards (per task, TRL-style, judge), eval files (JSON
lines, `datasets` folders), serve.yaml merged over a packaged scenario, and `reef scenario list` /
`reef scenario check` with every bad declaration exiting 2 with a message naming scenario and key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from reef.cli import main as reef_main
from reef.config import ServeConfig, resolve
from reef.scenario import (
    JudgeSpec,
    RewardError,
    Scenario,
    ScenarioError,
    Score,
    all_scenarios,
    eval_suite,
    load_tasks,
    parse_judge_score,
)
from reef.scenario.reward import function_reward, import_ref, is_trl_style, judge_messages, judge_reward

pytestmark = pytest.mark.start_early(14)

REPO = Path(__file__).resolve().parents[1]
REVIEWS = REPO / "examples" / "reviews"
TASK = {"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": "What is 2 + 3?"}],
        "answer": 5}


def write_module(folder: Path, body: str) -> str:
    """A reward module outside reef/, under a fresh name (modules are cached per process)."""
    name = f"user_reward_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(body)
    return name


def write_scenario(folder: Path, reward: str | None, *, rows: list[dict] | None = None, extra: dict | None = None,
                   eval_path: str = "eval.jsonl") -> Path:
    """A serve.yaml declaring scenario `support` with an eval file next to it."""
    rows = [TASK] * 3 if rows is None else rows
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"eval": {"path": eval_path, "max_new_tokens": 8, "samples": 2}, **(extra or {})}
    if reward is not None:
        spec["reward"] = reward
    (folder / "serve.yaml").write_text(yaml.safe_dump({"scenarios": {"support": spec}}))
    return folder / "serve.yaml"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = reef_main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# --- rewards --------------------------------------------------------------------------------------


@pytest.mark.model_free
def test_per_task_reward_with_feedback_and_trl_style_reward(tmp_path: Path) -> None:
    name = write_module(tmp_path, '''
def per_task(task, reply):
    return (1.0, "right") if str(task["answer"]) in reply else 0


def trl(prompts, completions, answer, **kwargs):
    assert prompts[0][-1]["role"] == "user" and completions[0][0]["role"] == "assistant"
    return [1.0 if str(a) in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]
''')
    per_task = function_reward(f"{name}:per_task", tmp_path)
    trl = function_reward(f"{name}:trl", tmp_path)
    assert per_task([TASK, TASK], ["Answer: 5", "Answer: 4"]) == [Score(1.0, "right"), Score(0.0)]
    assert trl([TASK, TASK], ["Answer: 5", "Answer: 4"]) == [Score(1.0), Score(0.0)]
    module = sys.modules[name]
    assert is_trl_style(module.trl) and not is_trl_style(module.per_task)


@pytest.mark.model_free
@pytest.mark.parametrize("body, match", [
    ("def r(task, reply):\n    raise KeyError('label')\n", "raised KeyError"),
    ("def r(task, reply):\n    return 'good'\n", "not a number"),
    ("def r(task, reply):\n    return (1.0, 2.0)\n", "feedback str"),
    ("def r(task, reply):\n    return float('nan')\n", "not a finite number"),
    ("def r(prompts, completions, **kw):\n    return [1.0]\n", "expected 2 floats"),
])
def test_a_bad_reward_is_a_reward_error(tmp_path: Path, body: str, match: str) -> None:
    reward = function_reward(f"{write_module(tmp_path, body)}:r", tmp_path)
    with pytest.raises(RewardError, match=match):
        reward([TASK, TASK], ["a", "b"])


@pytest.mark.model_free
def test_two_folders_each_with_a_reward_py_keep_their_own(tmp_path: Path) -> None:
    """Module names are process-wide: a second folder's `reward.py` must not resolve to the first's."""
    name = f"reward_{uuid.uuid4().hex[:8]}"
    for folder, value in (("a", 0.25), ("b", 0.75)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{name}.py").write_text(f"def score(task, reply):\n    return {value}\n")
    sys.path[:0] = [str(tmp_path / "b"), str(tmp_path / "a")]  # b's folder ahead of a's, nothing imported yet
    try:
        first = import_ref(f"{name}:score", tmp_path / "a")
        second = import_ref(f"{name}:score", tmp_path / "b")
        assert (first({}, ""), second({}, "")) == (0.25, 0.75)
        assert import_ref(f"{name}:score", tmp_path / "a") is first
        assert import_ref(f"{name}:score", tmp_path / "b") is second
    finally:
        sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp_path))]


@pytest.mark.model_free
def test_judge_prompt_and_score_parsing() -> None:
    spec = JudgeSpec(rubric="Full marks for the right sum.", scale=10)
    task = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]}]}
    system, user = judge_messages(spec, task, "Answer: 5")
    assert system["role"] == "system" and "0 to 10" in system["content"]
    assert user["content"].startswith("Rubric:\nFull marks for the right sum.")
    assert "user: What is 2 + 3?" in user["content"] and "Reply to grade:\nAnswer: 5" in user["content"]
    assert parse_judge_score("Score: 7", 10) == 0.7
    assert parse_judge_score("score=1") == 1.0
    assert parse_judge_score("I give it 3/4.") == 0.75
    assert parse_judge_score(" 0.5 ") == 0.5
    assert parse_judge_score("Score: 12", 10) is None  # out of range: not a score
    assert parse_judge_score("Answer: 5") is None
    assert parse_judge_score("") is None


@pytest.mark.vllm
def test_judge_against_the_real_engine(vllm_url: str) -> None:
    """The tiny model as its own judge: whatever it writes, an unparseable reply is Score(None, ...)
    (missing, never 0) and a parseable one is in [0, 1]."""
    reward = judge_reward(JudgeSpec(rubric="1 if the sum is right, else 0.", max_tokens=12, votes=2),
                          vllm_url, "reef-tiny")
    tasks = [TASK, {**TASK, "messages": [{"role": "user", "content": "Score this: 7"}]}]
    scores = reward(tasks, ["Answer: 5", "Score: 1"])
    assert len(scores) == 2
    for score in scores:
        assert score.feedback, "the judge's reply (or why it could not be scored) is kept"
        if score.value is None:
            assert score.feedback.startswith("judge reply not scorable")
        else:
            assert 0.0 <= score.value <= 1.0
    with pytest.raises(RewardError, match="no url/model"):  # no judge url and no served engine given
        judge_reward(JudgeSpec(rubric="r"))([TASK], ["x"])


# --- eval files and declarations ------------------------------------------------------------------


@pytest.mark.model_free
def test_eval_rows_from_a_datasets_folder(tmp_path: Path) -> None:
    import datasets

    rows = [{**TASK, "answer": i} for i in range(4)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "pq").mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "pq" / "part-0.parquet"))
    for folder in ("saved", "pq"):
        got = load_tasks(tmp_path / folder, "support: eval.path")
        assert [t["answer"] for t in got] == [0, 1, 2, 3] and got[0]["messages"] == TASK["messages"]
    with pytest.raises(ScenarioError, match="support: eval.path: .* holds neither"):
        (tmp_path / "empty").mkdir()
        load_tasks(tmp_path / "empty", "support: eval.path")


@pytest.mark.model_free
def test_serve_yaml_merges_over_a_packaged_scenario(tmp_path: Path) -> None:
    (tmp_path / "serve.yaml").write_text("scenarios:\n  demo-add:\n    policy: auto\n    eval: {path: "
                                         f"{REPO / 'tests/helpers/tiny/data/eval.jsonl'}, samples: 2, limit: 5}}\n")
    config, _ = resolve(config_file=tmp_path / "serve.yaml")
    merged = all_scenarios(config)["demo-add"]
    assert merged.policy == "auto" and merged.eval is not None and merged.eval.samples == 2
    assert merged.reward == "tests.helpers.tiny.task:reward", "keys the file did not set stay the package's"
    assert merged.tasks is not None and merged.resolve_path(merged.tasks).is_file()
    assert len(eval_suite(merged).tasks) == 5
    policy_only = resolve(config_file=write_scenario(tmp_path, None, extra={}))[0]  # another scenario
    assert all_scenarios(policy_only)["demo-add"].policy is None


@pytest.mark.model_free
def test_scenario_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = write_module(tmp_path, "def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    config = write_scenario(tmp_path, f"{name}:r", extra={"recipe": "rft", "policy": "auto"})
    code, out, _ = run_cli(capsys, "scenario", "list", "-c", str(config))
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == ["scenario", "declared", "policy", "recipe", "eval", "reward"]
    support = next(line for line in lines if line.startswith("support"))
    assert "serve.yaml" in support and " auto " in support and " rft " in support and " 3 " in support
    assert f"{name}:r (TRL-style)" in support
    demo = next(line for line in lines if line.startswith("demo-add"))
    assert "package (tests.helpers.tiny.scenario:scenario)" in demo and "(per task)" in demo and " 80 " in demo


REWARD_5 = "def r(task, reply):\n    return 1.0 if reply == 'Answer: 5' else 0.0\n"
UNREACHABLE = "http://127.0.0.1:9"  # a declaration fault is found before any request is sent


@pytest.mark.model_free
@pytest.mark.parametrize("case, expect", [
    ("missing eval file", "scenario 'support': eval.path: "),
    ("unimportable reward", "scenario 'support': reward: cannot import 'no_such_module_x'"),
    ("no such function", "has no attribute 'nope'"),
    ("unknown key", "scenarios.support.evaluation"),
    ("bad eval row", "row 1: `messages` must be a non-empty list"),
    ("undeclared scenario", "scenario 'nobody' is not declared"),
])
def test_bad_declarations_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expect: str) -> None:
    good = write_module(tmp_path, "def r(task, reply):\n    return 1.0\n")
    name = "support"
    if case == "missing eval file":
        config = write_scenario(tmp_path, f"{good}:r", eval_path="nowhere/eval.jsonl")
    elif case == "unimportable reward":
        config = write_scenario(tmp_path, "no_such_module_x:score")
    elif case == "no such function":
        config = write_scenario(tmp_path, f"{good}:nope")
    elif case == "unknown key":
        config = write_scenario(tmp_path, f"{good}:r", extra={"evaluation": {"path": "eval.jsonl"}})
    elif case == "bad eval row":
        config = write_scenario(tmp_path, f"{good}:r", rows=[TASK, {"prompt": "hi"}])
    else:
        config, name = write_scenario(tmp_path, f"{good}:r"), "nobody"
    code, out, err = run_cli(capsys, "scenario", "check", name, "-c", str(config), "--url", UNREACHABLE)
    assert code == 2, (out, err)
    assert expect in err and "Traceback" not in err


@pytest.mark.model_free
def test_check_asks_the_engine_as_a_client_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the gate's engine session, but with the scenario's settings only: no seed, top_p,
    top_k or tool_choice (the server's defaults), `n` replies per eval task in one request."""
    bodies: list[dict] = []

    class Engine(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def reply(self, data: dict) -> None:
            out = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self.reply({"data": [{"id": "stub"}]})
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.reply({"choices": [{"index": i, "message": {"role": "assistant", "content": "Answer: 5"},
                                     "finish_reason": "stop"} for i in range(bodies[-1]["n"])]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = write_scenario(tmp_path, f"{write_module(tmp_path, REWARD_5)}:r")
        code, out, err = run_cli(capsys, "scenario", "check", "support", "-c", str(config), "--url",
                                 f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert code == 0, err
    assert bodies == [{"model": "stub", "messages": TASK["messages"], "n": 2, "max_tokens": 8, "temperature": 1.0}] * 3
    assert "reward ran on 6 replies of stub" in out and out.splitlines()[-1].startswith("base success 100.0%")


@pytest.mark.vllm
@pytest.mark.parametrize("body, expect", [
    ("def r(task, reply):\n    return task['answer'] == reply\n", "returned False, not a number"),
    ("def r(task, reply):\n    raise RuntimeError('verifier down')\n", "raised RuntimeError: verifier down"),
    ("def r(prompts, completions, **kw):\n    return 'all good'\n", "expected 3 floats"),
])
def test_a_reward_that_fails_on_real_replies_exits_2(vllm_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     body: str, expect: str) -> None:
    config = write_scenario(tmp_path, f"{write_module(tmp_path, body)}:r", rows=[TASK, TASK, TASK])
    code, out, err = run_cli(capsys, "scenario", "check", "support", "-c", str(config), "--url", vllm_url,
                             "--samples", "1")
    assert code == 2, (out, err)
    assert "scenario 'support': reward: " in err and expect in err


@pytest.mark.vllm
def test_check_measures_base_success_with_a_ci(vllm_url: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    name = write_module(tmp_path, "def r(task, reply):\n    return 1.0 if reply.startswith('Answer:') else 0.0\n")
    config = write_scenario(tmp_path, f"{name}:r")
    code, out, err = run_cli(capsys, "scenario", "check", "support", "-c", str(config), "--url", vllm_url)
    assert code == 0, err
    assert "3 eval rows valid" in out and "reward ran on 6 replies of reef-tiny" in out
    last = out.splitlines()[-1]
    assert last.startswith("base success ") and "95% CI" in last and "3 tasks x 2 samples" in last


@pytest.mark.vllm
def test_check_the_bundled_reviews_example(vllm_url: str) -> None:
    """The second bundled example, as a user runs it: from its folder, its serve.yaml, a subprocess."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    out = subprocess.run([sys.executable, "-m", "reef.cli", "scenario", "check", "reviews", "--url", vllm_url,
                          "--limit", "20"], cwd=REVIEWS, capture_output=True, text=True, env=clean, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "80 eval rows valid, 320 task rows" in out.stdout
    assert "base success " in out.stdout.splitlines()[-1]


def _default_model_example(name: str) -> tuple[ServeConfig, Scenario, list[dict], list[dict]]:
    """An example folder declared for the default model: (config, scenario, eval rows, task rows),
    after checking that its serve.yaml names no model and its jsonl files are what generate.py writes."""
    folder = REPO / "examples" / name
    config, _ = resolve(config_file=folder / "serve.yaml")
    assert config.model is None, "the embedded default serves it"
    scenario = all_scenarios(config)[name]
    before = {f: (folder / f).read_bytes() for f in ("eval.jsonl", "tasks.jsonl")}
    subprocess.run([sys.executable, str(folder / "generate.py")], check=True, capture_output=True)
    assert {f: (folder / f).read_bytes() for f in before} == before
    tasks = load_tasks(scenario.resolve_path(scenario.tasks), f"{name}: tasks")
    return config, scenario, eval_suite(scenario).tasks, tasks


@pytest.mark.model_free
def test_the_sentiment_example_is_declared_only_through_the_contract() -> None:
    """examples/sentiment (what `make demo` runs on the default model): rft with corrections; eval
    reviews are held out from the tasks; every row carries the `reference` a correcting user sends;
    the strict reward pays the exact reply only."""
    config, scenario, held_out, tasks = _default_model_example("sentiment")
    assert len(held_out) == 48 and len(tasks) == 256
    prompts = lambda rows: {r["messages"][-1]["content"] for r in rows}  # noqa: E731
    assert not prompts(held_out) & prompts(tasks)
    assert all(r["reference"] == f"Label: {r['label']}" for r in [*held_out, *tasks])
    assert "reef" not in (REPO / "examples" / "sentiment" / "reward.py").read_text()
    task = held_out[0]
    other = "negative" if task["label"] == "positive" else "positive"
    replies = [task["reference"], f"{task['reference']}.", f"The review is {task['label']}.", f"Label: {other}"]
    assert [s.value for s in eval_suite(scenario).reward([task] * 4, replies)] == [1.0, 1.0, 0.0, 0.0]
    spec = config.scenario("sentiment").recipe_spec(config.recipes)
    assert spec.recipe == "rft" and spec.params["corrections"] is True and spec.params["kind"] == "lora"


@pytest.mark.model_free
def test_the_reviews_example_is_declared_only_through_the_contract() -> None:
    """examples/reviews (four teams, on the default model): rft with corrections; eval complaints
    are about products no task mentions; every row carries its `reference`; the reward is a
    TRL-style function that imports nothing of Reef and pays the exact reply only."""
    config, scenario, held_out, tasks = _default_model_example("reviews")
    assert len(held_out) == 80 and len(tasks) == 320
    assert not {r["product"] for r in held_out} & {r["product"] for r in tasks}
    assert {r["team"] for r in held_out} == {"delivery", "quality", "setup", "billing"}
    assert all(r["reference"] == f"Team: {r['team']}" for r in [*held_out, *tasks])
    assert is_trl_style(sys.modules["reward"].reward) and "reef" not in (REVIEWS / "reward.py").read_text()
    task = held_out[0]
    other = next(t for t in ("delivery", "quality", "setup", "billing") if t != task["team"])
    replies = [task["reference"], f"{task['reference']}.", f"This is for {task['team']}.", f"Team: {other}"]
    assert [s.value for s in eval_suite(scenario).reward([task] * 4, replies)] == [1.0, 1.0, 0.0, 0.0]
    spec = config.scenario("reviews").recipe_spec(config.recipes)
    assert spec.recipe == "rft" and spec.params["corrections"] is True and spec.params["kind"] == "lora"


@pytest.mark.model_free
def test_the_shop_example_is_corrected_turn_by_turn() -> None:
    """examples/shop (tools, on the default model): held-out items; each row's `reference` is the
    episode wanted (the price call, then the answer); rft trains per turn, on corrections."""
    config, scenario, held_out, tasks = _default_model_example("shop")
    assert len(held_out) == 80 and len(tasks) == 320
    assert not {r["item"] for r in held_out} & {r["item"] for r in tasks}
    for row in [*held_out, *tasks]:
        call, answer = row["reference"]
        assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"item": row["item"]}
        assert answer == {"role": "assistant", "content": f"Answer: {row['price']}"}
    spec = config.scenario("shop").recipe_spec(config.recipes)
    assert spec.recipe == "rft" and spec.params["corrections"] is True and spec.params["trajectories"] is False


@pytest.mark.model_free
def test_the_capitals_example_rewards_a_short_answer_only() -> None:
    """examples/capitals (rare rewards, rewards only): held-out countries no task names; the reward
    pays the right capital in at most six words, never a longer reply however right, and imports
    nothing of Reef; no corrections: rewards only."""
    config, scenario, held_out, tasks = _default_model_example("capitals")
    assert len(held_out) == 48 and len(tasks) == 118
    assert not {r["country"] for r in held_out} & {r["country"] for r in tasks}
    assert all(r["reference"] == r["capital"] for r in [*held_out, *tasks])
    assert "reef" not in (REPO / "examples" / "capitals" / "reward.py").read_text()
    task = next(r for r in held_out if " " not in r["capital"] + r["country"])
    replies = [task["capital"], f"The capital of {task['country']} is {task['capital'].lower()}.",
               f"The capital city of this country is {task['capital']}.",
               "Paris" if task["capital"] != "Paris" else "Rome"]
    assert [s.value for s in eval_suite(scenario).reward([task] * 4, replies)] == [1.0, 1.0, 0.0, 0.0]
    spec = config.scenario("capitals").recipe_spec(config.recipes)
    assert spec.recipe == "rft" and not spec.params.get("corrections") and spec.params["kind"] == "lora"
    assert config.learner.explore.enabled


@pytest.mark.model_free
def test_the_orders_example_learns_through_the_harness() -> None:
    """examples/orders (harness only): harness_evolve with the mined proposer and a greedy eval;
    held-out messages use names and ids no task has; the reward gives the format as feedback when
    wrong; every row carries its reference reply."""
    config, scenario, held_out, tasks = _default_model_example("orders")
    assert len(held_out) == 32 and len(tasks) == 256
    assert not {r["name"] for r in held_out} & {r["name"] for r in tasks}
    assert not {r["order"] for r in held_out} & {r["order"] for r in tasks}
    assert all(r["reference"] == f"ORDER {r['order']} | NAME {r['name']}" for r in [*held_out, *tasks])
    task = held_out[0]
    got = eval_suite(scenario).reward([task] * 3, [task["reference"], task["reference"] + ".",
                                                   f"The order is {task['order']}."])
    assert [s.value for s in got] == [1.0, 1.0, 0.0] and got[2].feedback and got[0].feedback is None
    spec = config.scenario("orders").recipe_spec(config.recipes)
    assert spec.recipe == "harness_evolve" and spec.params["proposer"] == "mined"
    assert scenario.harness.inject == "system_prepend" and scenario.eval.temperature == 0.0
