"""Harness evolution: the recipe reads low-reward experience and its feedback, proposes a harness, the
gate compares it with the head on the same weights, and the publisher releases it.

CPU tests use offline traffic of the bundled demo-rules scenario (the tiny model, transformers) and a
stand-in OpenAI server for the llm proposer (a real teacher model cannot run here); the engine test
runs the whole loop against the session's vLLM: simulated users -> round -> gate on the engine ->
harness release -> the next request is sent with the mined rule, by the same weights.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from recipes.harness_evolve.recipe import HarnessEvolve, mine_rules, parse_mutations
from reef.config import GateSettings
from reef.experience import load
from reef.gate.arms import HarnessArms
from reef.gate.evaluate import evaluate_candidate
from reef.learn.round import RoundPlan, run_round
from reef.recipe import load_recipe
from reef.recipe.harness_recipe import Failure, Mutation, NothingToProposeError, ProposalContext, apply_mutations
from reef.recipe.snapshot import Snapshot
from reef.registry.candidates import register_candidate
from reef.registry.harness import SHOTS_FILE, Harness, inject
from reef.sampling.engine import EngineEndpoint
from reef.scenario import eval_suite, get_scenario
from reef.traffic.offline import record_offline_traffic
from tests.helpers import MODEL_NAME, TINY, wait_for
from tests.helpers.gateway import Gateway
from tests.helpers.tiny import rules as demo

S = demo.SCENARIO
RULE = demo.RULE_LABEL


def plan(data: Path, **params: Any) -> RoundPlan:
    return RoundPlan(scenario=S, recipe="harness_evolve", params=params, base_model=str(TINY), experience_dir=data,
                     data_dir=data, ledger_root=data / "ledger", snapshot_root=data / "snapshots",
                     candidate_root=data / "candidates")


def failure(record_id: str, feedback: str) -> Failure:
    return Failure(record_id, [{"role": "user", "content": "Word: apple"}], "It is a fruit.", 0.0, feedback)


def test_mined_rules_are_recurring_feedback_the_harness_lacks() -> None:
    fails = [failure(f"r{i}", f"{RULE} The word w{i} is a fruit.") for i in range(6)]
    fails += [failure("r9", "Wrong label: the word cat is a animal.")]
    assert mine_rules(fails, "", 0.3, 3, 2) == [RULE]  # per-word sentences never recur enough
    assert mine_rules(fails, f"- {RULE}", 0.3, 3, 2) == []  # said already
    assert mine_rules(fails[:2], "", 0.3, 3, 2) == []  # under min_count


def test_mutations_apply_only_where_they_fit() -> None:
    files = {"rules.md": "- Be brief.\n"}
    out = apply_mutations(files, [Mutation(op="update", path="rules.md", content="- Be brief.\n- Be kind."),
                                  Mutation(op="create", path="skills/sort/SKILL.md", content="---\nname: sort\n---")])
    assert out == {"rules.md": "- Be brief.\n- Be kind.\n", "skills/sort/SKILL.md": "---\nname: sort\n---\n"}
    assert apply_mutations(out, [Mutation(op="remove", path="rules.md")]) == {"skills/sort/SKILL.md": out[
        "skills/sort/SKILL.md"]}
    for bad in (Mutation(op="remove", path="system.md"), Mutation(op="create", path="rules.md", content="x")):
        with pytest.raises(ValueError):
            apply_mutations(files, [bad])
    for path in ("../etc/passwd", "/abs", "skills/../x", ".git/config", "candidate.json"):
        with pytest.raises(ValueError):
            Mutation(op="create", path=path, content="x")
    kept, problems = parse_mutations('Sure! {"mutations": [{"op": "create", "path": "rules.md", "content": "- A."},'
                                     ' {"op": "remove", "path": "nope.md"}, {"op": "rename"}]} done', files)
    assert [(m.op, m.path) for m in kept] == [("update", "rules.md")] and len(problems) == 2
    assert parse_mutations("no json here", files) == ([], ["the reply holds no JSON object"])


def test_harness_arms_apply_the_scenario_inject_mode() -> None:
    suite = eval_suite(get_scenario(S))
    arms = HarnessArms(Harness("", {"rules.md": f"- {RULE}\n"}), None, "system_prepend").tasks(suite)
    assert arms["head"][0]["messages"] == suite.tasks[0]["messages"]
    assert arms["candidate"][0]["messages"][0]["content"] == f"- {RULE}\n\n{demo.SYSTEM_PROMPT}"
    assert arms["candidate"][0]["messages"][1:] == suite.tasks[0]["messages"][1:]
    assert arms["candidate"][0]["label"] == suite.tasks[0]["label"]  # the reward still sees the task's fields


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-rules traffic of the base model (no harness), scored with feedback, in a fresh data dir."""
    data = tmp_path_factory.mktemp("evolve") / "data"
    got = record_offline_traffic(TINY, data, S, prompts=48, samples=2, seed=1)
    assert got["reports"] == 96 and got["mean_score"] < 0.3, got
    return data


def test_mined_round_proposes_gates_and_selects_a_rule(offline: Path) -> None:
    out = run_round(plan(offline), evaluate=False, progress=False).model_dump(mode="json")
    assert out["status"] == "trained", out
    folder = Path(out["candidate"]["path"])
    meta = json.loads((folder / "candidate.json").read_text())
    assert meta["kind"] == "harness" and meta["scenario"] == S
    assert sorted(p.name for p in folder.iterdir()) == ["candidate.json", "rules.md"]
    assert (folder / "rules.md").read_text() == f"- {RULE}\n"
    assert [(m["op"], m["path"]) for m in meta["mutations"]] == [("create", "rules.md")]
    assert meta["lineage"]["parent_release"] == f"{S}@r0" and meta["lineage"]["parent_harness"] is None
    assert meta["metrics"]["failures"] >= 60 and meta["metrics"]["proposer"] == "mined"

    view = register_candidate(offline, folder)
    assert view.kind == "harness" and view.mutations[0]["path"] == "rules.md"
    result = evaluate_candidate(offline, view.candidate_id, GateSettings(samples=2), base_model=str(TINY),
                                progress=False)
    assert result.decision == "select", result.reason
    assert result.backend == "transformers" and result.probe is None
    assert result.ci_low is not None and result.ci_low > 0.2  # the same weights, clearly better prompts
    # Every record was consumed: the next round has nothing new.
    assert run_round(plan(offline), evaluate=False, progress=False).status == "nothing_new"


class Teacher(BaseHTTPRequestHandler):
    """A stand-in teacher model (an OpenAI-compatible server): answers every chat with `reply`."""

    reply = ""
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen.append(body)
        data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": type(self).reply}}]})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def teacher() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Teacher)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_llm_proposer_sends_failures_and_applies_the_rewrite(tmp_path: Path, teacher: str) -> None:
    data = tmp_path / "data"
    record_offline_traffic(TINY, data, S, prompts=8, samples=1, seed=2)
    recipe = HarnessEvolve(scenario=S, base_model=str(TINY), proposer="llm", teacher_url=teacher,
                           teacher_model="teacher", max_examples=3)
    snap = Snapshot.create(S, data, recipe.experience(), root=data / "snapshots", ledger_root=data / "ledger")
    Teacher.seen.clear()
    Teacher.reply = "nothing useful"
    with pytest.raises(NothingToProposeError, match="no usable mutation"):
        recipe.run(snap, data / "candidates", progress=False)
    Teacher.reply = json.dumps({"mutations": [
        {"op": "create", "path": "system.md", "content": "You sort words.", "reason": "a role"},
        {"op": "create", "path": "rules.md", "content": f"- {RULE}", "reason": "the feedback"},
        {"op": "create", "path": "skills/sort/SKILL.md", "content": "---\nname: sort\ndescription: kinds\n---\n"},
        {"op": "remove", "path": "examples/none.md"}]})
    candidate = recipe.run(snap, data / "candidates", progress=False)
    sent = Teacher.seen[-1]
    assert sent["model"] == "teacher" and sent["temperature"] == 0.0
    prompt = sent["messages"][1]["content"]
    assert prompt.count("feedback: ") == 3 and RULE in prompt and "(no files yet)" in prompt
    assert [m["path"] for m in candidate.mutations] == ["system.md", "rules.md", "skills/sort/SKILL.md"]
    tree = Harness("", {p: (candidate.path / p).read_text() for p in ("system.md", "rules.md")})
    assert tree.system_prompt() == f"You sort words.\n\n- {RULE}"
    assert candidate.kind == "harness" and candidate.metrics["proposer"] == "llm"


# --- against the real engine ---------------------------------------------------------------------

TOKEN = "evolve-admin-token"


@pytest.mark.vllm
def test_evolve_gate_and_release_a_harness_on_the_engine(vllm_url: str, tmp_path: Path) -> None:
    from reef.client import ReefClient
    from reef.traffic.simulate import simulate

    (tmp_path / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "admin_token": TOKEN, "store": {"flush_interval_s": 0.2}}))
    gw = Gateway(tmp_path, vllm_url, ["--model", str(TINY)]).start()
    try:
        api = ReefClient(gw.url, admin_token=TOKEN)
        summary = simulate(gw.url, S, requests=48, concurrency=8, follow_up_share=0.0, progress=False)
        assert summary.reports == 48 and summary.mean_score < 0.3, summary.render()
        data = tmp_path / "data"
        wait_for(lambda: load(S, data).collect()["score"].is_not_null().sum() >= 48)  # flushed into shards
        engine = EngineEndpoint(vllm_url, MODEL_NAME)
        out = run_round(plan(data), GateSettings(samples=2), engine=engine,
                        progress=False).model_dump(mode="json")
        assert out["status"] == "trained" and out["gate"]["decision"] == "select", out
        assert out["gate"]["backend"] == "engine" and out["gate"]["ci_low"] > 0.2, out["gate"]
        r0 = api.releases(S)["releases"][0]
        made = api.release(S, out["candidate_id"], f"{S}@r0", approved_by="pytest")["release"]
        assert made["harness_id"] == out["candidate_id"] and made["content_id"] == r0["content_id"]  # same weights
        assert made["evaluation"]["decision"] == "select"
        assert made["harness_lineage"]["recipe"].endswith("HarnessEvolve")

        client = gw.client(**{"x-reef-scenario": S})
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=demo.messages("plum"), temperature=0, max_tokens=8)
        assert raw.headers["x-reef-release-id"] == made["release_id"]
        record = httpx.get(f"{gw.url}/reef/records/{raw.headers['x-reef-agent-record-id']}", timeout=30).json()
        assert record["harness_id"] == made["harness_id"]
        assert record["messages"][0]["content"] == f"- {RULE}\n\n{demo.SYSTEM_PROMPT}"
        assert raw.parse().choices[0].message.content.strip() in demo.KINDS  # the bare label now
    finally:
        gw.stop()


def test_corrections_become_few_shot_examples_served_before_the_conversation() -> None:
    """The mined proposer turns corrected failures into shots.jsonl (distinct corrections first, at
    most max_shots, only while the harness has none); inject() puts them after the system prompt
    as earlier turns, whatever the mode; a line that is not a shot is left out."""
    def fixed(i: int, reply: str) -> Failure:
        return Failure(f"r{i}", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"q{i}"}],
                       "prose", 0.0, None, reply)

    fails = [fixed(0, "A"), fixed(1, "A"), fixed(2, "B"), failure("r3", "no correction"), fixed(4, "C")]
    evolve = load_recipe("harness_evolve", {"scenario": S, "proposer": "mined", "max_shots": 3})
    context = ProposalContext(scenario=S, files={}, harness_id=None, failures=fails, records=5, inject="system_prepend")
    (mutation,) = evolve.propose(context)
    assert (mutation.op, mutation.path) == ("create", SHOTS_FILE)
    harness = Harness("", {SHOTS_FILE: mutation.content + "not json\n{\"user\": 1}\n", "rules.md": "- Rule.\n"})
    assert harness.shots() == [("q0", "A"), ("q2", "B"), ("q4", "C")]
    assert evolve.propose(ProposalContext(**{**context.__dict__, "files": {SHOTS_FILE: mutation.content}})) == []

    shots = [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "A"},
             {"role": "user", "content": "q2"}, {"role": "assistant", "content": "B"},
             {"role": "user", "content": "q4"}, {"role": "assistant", "content": "C"}]
    client = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "hi"}]
    assert inject(client, harness, "system_prepend") == [{"role": "system", "content": "- Rule.\n\nMine."}, *shots,
                                                         client[1]]
    assert inject(client, harness, "system_replace") == [{"role": "system", "content": "- Rule."}, *shots, client[1]]
    only_shots = Harness("", {SHOTS_FILE: mutation.content})
    assert inject(client[1:], only_shots, "system_prepend") == [*shots, client[1]]
    assert inject(client, only_shots, "system_prepend") == [client[0], *shots, client[1]]
    assert inject(client, harness, "off") == client
