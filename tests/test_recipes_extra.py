"""The kto, ttt and self_play recipes end to end on the tiny model: kto on recorded thumbs-up/down
traffic (served token ids, never re-tokenized), ttt and self_play on no traffic at all (empty
snapshots) with the problems and reward of a declared scenario (demo-add, and a user's own one in
a temp folder), each writing a loadable candidate with lineage; plus params.yaml and stage use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from recipes.experimental.kto.recipe import KTO, kto_examples
from recipes.experimental.self_play.recipe import Proposer, SelfPlay
from recipes.experimental.ttt.recipe import TTT, entropic_advantages
from reef.config import PipelineParams
from reef.core.paths import CANDIDATE_FILE
from reef.learn.pipeline import learn_once, plan
from reef.recipe import EmptySnapshotError, Snapshot, load_recipe, resolve
from reef.recipe.practice import describe
from reef.sampling.load import load_model
from reef.scenario import EvalSpec, Scenario, ScenarioError, get_scenario, load_tasks, training_tasks
from reef.traffic.offline import record_offline_traffic
from tests.helpers import gated_tasks

os.environ.setdefault("OMP_NUM_THREADS", "1")
SCENARIO = "demo-add"


@pytest.fixture(scope="module")
def store(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 prompts x 4 samples of demo traffic; each reply's report is a thumbs up (1) or down (0)."""
    data = tmp_path_factory.mktemp("exp") / "data"
    record_offline_traffic(tiny, data, "demo-add", prompts=24, samples=4, seed=1)
    return data


def snapshot(recipe: object, data: Path, tmp_path: Path, **kw: object) -> Snapshot:
    spec = recipe.experience()  # type: ignore[attr-defined]
    return Snapshot.create(spec.scenario, data, spec, root=tmp_path / "snaps", ledger_root=tmp_path / "ledger", **kw)


def load_candidate(path: Path) -> torch.nn.Module:
    if json.loads((path / CANDIDATE_FILE).read_text())["kind"] == "lora":
        assert not (path / "model.safetensors").exists() and not (path / "ref").exists()
    return load_model(path)[0]


def moved(model: torch.nn.Module, base: Path) -> bool:
    ids = torch.tensor([AutoTokenizer.from_pretrained(base).encode("What is 2 + 4?")])
    with torch.no_grad():
        return not torch.allclose(model(ids).logits, AutoModelForCausalLM.from_pretrained(base)(ids).logits)


def test_short_names_params_yaml_and_specs(tiny: Path, store: Path, tmp_path: Path) -> None:
    assert (resolve("kto"), resolve("ttt"), resolve("self_play")) == (KTO, TTT, SelfPlay)
    for ref in ("recipes.experimental.kto.recipe:KTO", "recipes.experimental.ttt.recipe:TTT",
                "recipes.experimental.self_play.recipe:SelfPlay"):
        raw = {"scenarios": {SCENARIO: {}}, "base_model": {"path": str(tiny)},
               "train": {"recipe": ref, "max_steps": 2}}
        assert plan(PipelineParams.parse(raw), SCENARIO).load_recipe().ref == ref
    with pytest.raises(ValueError, match="stale_policy"):
        # KTO has no per-sample weights: drop only
        load_recipe("kto", {"scenario": SCENARIO, "stale_policy": "downweight"})
    # Self-generating recipes take no records even from a full store: batch_size 0, no reports needed.
    for name in ("ttt", "self_play"):
        recipe = load_recipe(name, {"scenario": SCENARIO, "base_model": str(tiny)})
        spec = recipe.experience()
        assert (spec.batch_size, spec.needs_reports, recipe.needs_experience) == (0, False, False)
        snap = snapshot(recipe, store, tmp_path, allow_empty=True)
        counts = snap.manifest["counts"]
        assert snap.record_ids == [] and counts["over_batch_deferred"] + counts["duplicates"] == 24 * 4
    # ... while a recipe that learns from traffic still refuses an empty snapshot.
    rft = load_recipe("rft", {"scenario": SCENARIO, "base_model": str(tiny)})
    empty = snapshot(rft, tmp_path / "no-data", tmp_path, allow_empty=True)
    with pytest.raises(EmptySnapshotError):
        rft.run(empty, out_root=tmp_path / "cands", progress=False)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_kto_on_thumbs_reports(kind: str, tiny: Path, store: Path, tmp_path: Path) -> None:
    kto = load_recipe("kto", {"scenario": SCENARIO, "base_model": str(tiny), "kind": kind, "max_steps": 3,
                              "per_device_batch_size": 8})
    snap = snapshot(kto, store, tmp_path)
    samples = snap.samples()
    up = int((samples["score"] >= 0.5).sum())
    assert 0 < up < samples.height

    # The trainer gets the served ids as they are; its only addition is the KL completions.
    model, tokenizer = kto.load_model()
    trainer = kto.build_trainer(snap, model, tokenizer, tmp_path / "t")
    served = {(tuple(p), tuple(c), s >= 0.5) for p, c, s in samples.select("prompt_ids", "completion_ids", "score")
              .iter_rows()}
    ds = trainer.train_dataset
    assert {(tuple(p), tuple(c), bool(lab)) for p, c, lab in zip(ds["prompt_ids"], ds["completion_ids"], ds["label"],
                                                                  strict=True)} == served
    assert ds["KL_completion_ids"][1] == ds["completion_ids"][0]  # rotated by one within a batch
    del trainer, model

    cand = kto.run(snap, out_root=tmp_path / "cands", progress=False)
    m = cand.metrics
    assert (m["desirable"], m["undesirable"], m["train_samples"]) == (up, samples.height - up, samples.height)
    assert m["desirable_weight"] == pytest.approx((samples.height - up) / up) and m["train_loss"] > 0
    lin = cand.lineage
    assert lin.recipe == "recipes.experimental.kto.recipe:KTO"
    assert lin.snapshot_hash == snap.hash and lin.params["threshold"] == 0.5
    assert moved(load_candidate(cand.path), tiny)


def test_kto_examples_threshold_and_shuffle() -> None:
    import polars as pl

    samples = pl.DataFrame({"prompt_ids": [[1, 2]] * 4, "completion_ids": [[3], [4], [5], []],
                            "score": [1.0, -1.0, 0.5, 1.0]})
    ds = kto_examples(samples, threshold=0.5, seed=0)
    assert sorted(zip(ds["completion_ids"], ds["label"], strict=True)) == [([3], True), ([4], False), ([5], True)]


def test_entropic_advantages_favour_the_best() -> None:
    adv = entropic_advantages([0.0, 0.5, 1.0], beta=4.0)
    assert sum(adv) == pytest.approx(0.0, abs=1e-9) and adv[2] > 0 > adv[1] > adv[0]
    flat = entropic_advantages([0.0, 0.5, 1.0], beta=1e-6)  # beta -> 0: the mean baseline, scaled
    assert flat[2] == pytest.approx(-flat[0], rel=1e-3) and abs(flat[1]) < 1e-5
    assert entropic_advantages([1.0, 1.0], beta=2.0) == [0.0, 0.0]


def test_ttt_discovers_and_archives(tiny: Path, tmp_path: Path) -> None:
    """On demo-add through the public contract: a row of its `tasks:`, scored by its declared reward."""
    demo_add = get_scenario(SCENARIO)
    eval_id = load_tasks(demo_add.resolve_path(demo_add.eval.path), "eval")[0]["task_id"]
    with pytest.raises(ValueError, match="held-in"):
        load_recipe("ttt", {"scenario": SCENARIO, "task_id": eval_id}).problem()
    with pytest.raises(ValueError, match="names no task"):
        load_recipe("ttt", {"scenario": SCENARIO, "task_id": "no-such-task"}).problem()
    ttt = load_recipe("ttt", {"scenario": SCENARIO, "base_model": str(tiny), "max_steps": 10, "task_id": "add-2-4-t0"})
    snap = snapshot(ttt, tmp_path / "no-data", tmp_path, allow_empty=True)
    cand = ttt.run(snap, out_root=tmp_path / "cands", progress=False)
    m = cand.metrics
    task, _, reward = ttt.problem()
    assert m["task_id"] == "add-2-4-t0" == task["task_id"]
    # The base model answers this one right ~6% of the time; ttt finds it and learns it.
    assert m["best_score"] == 1.0 == reward([task], [m["best_solution"]])[0].value
    scores = [e["score"] for e in m["archive"]]
    assert scores == sorted(scores, reverse=True) and m["archive"][0]["text"] == m["best_solution"]
    assert len({e["text"] for e in m["archive"]}) == len(m["archive"])
    assert m["rounds"] == 10 and m["last_round_mean_score"] > m["first_round_mean_score"]
    log = cand.training_log  # the custom loop's per-round metrics, as a Trainer's would be kept
    assert [r["step"] for r in log] == list(range(1, 11))
    assert all({"loss", "reward", "grad_norm", "learning_rate"} <= set(r) for r in log)
    assert list((cand.path / "tensorboard").rglob("events.out.tfevents.*"))
    assert cand.kind == "lora" and m["snapshot_records"] == 0
    assert cand.lineage.recipe == "recipes.experimental.ttt.recipe:TTT"
    assert moved(load_candidate(cand.path), tiny)


def test_self_play_logs_both_roles(tiny: Path, tmp_path: Path) -> None:
    """The proposer picks among demo-add's own tasks; the eval suite is never shown or solved."""
    sp = load_recipe("self_play", {"scenario": SCENARIO, "base_model": str(tiny), "max_steps": 6})
    snap = snapshot(sp, tmp_path / "no-data", tmp_path, allow_empty=True)
    cand = sp.run(snap, out_root=tmp_path / "cands", progress=False)
    m = cand.metrics
    assert m["rounds"] == 6 and len(m["proposer_rewards"]) == len(m["solver_rewards"]) == 6
    assert all(0.0 <= r <= 1.0 for r in m["proposer_rewards"])
    assert all(r is None or 0.0 <= r <= 1.0 for r in m["solver_rewards"])
    assert m["learnable_fraction_first"] > 0  # the base model solves some picked tasks sometimes: a signal
    demo_add = get_scenario(SCENARIO)
    held_out = {t["task_id"] for t in load_tasks(demo_add.resolve_path(demo_add.eval.path), "eval")}
    practice = {t["task_id"] for t in training_tasks(demo_add)}
    trained_on = {t for h in m["history"] for t in h["tasks"]}
    assert trained_on and trained_on <= practice and not trained_on & held_out  # the eval suite stays unseen
    assert cand.kind == "full" and moved(load_candidate(cand.path), tiny)


def test_proposer_policy_is_a_choice_among_the_shown_tasks(tiny: Path) -> None:
    """The proposer's reply is forced to "Problem <n>"; its policy is the softmax over the shown
    numbers, and a positive advantage makes the chosen number likelier."""
    model = AutoModelForCausalLM.from_pretrained(tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    proposer = Proposer(tokenizer, choices=3)
    menu = training_tasks(get_scenario(SCENARIO))[:3]
    prompt = proposer.prompt_ids(menu)
    text = tokenizer.decode(prompt)
    assert all(f"{n}. {describe(t)}" in text for n, t in enumerate(menu, 1)) and text.endswith("Problem ")
    assert [tokenizer.decode([t]) for t in proposer.labels] == ["1", "2", "3"]
    before = proposer.log_probs(model, [prompt], 1024)
    assert before.shape == (1, 3) and before.exp().sum().item() == pytest.approx(1.0, abs=1e-5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    proposer.loss(model, [prompt], [2], [1.0], 1024).backward()
    optimizer.step()
    with torch.no_grad():
        assert proposer.log_probs(model, [prompt], 1024)[0, 2] > before[0, 2]


def write_user_scenario(folder: Path) -> str:
    """A scenario as a user declares one: serve.yaml, eval and task files, and a TRL-style reward
    in a module of its own next to them (nothing of Reef's demo). Tasks have no task_id field (they
    are addressed by row), and one task row is also an eval row."""
    module = f"user_reward_{folder.name.replace('-', '_')}"
    (folder / f"{module}.py").write_text(
        "def score(prompts, completions, target, **_):\n"
        "    return [1.0 if f'Answer: {t}' in c[-1]['content'] else 0.0 for c, t in zip(completions, target)]\n")
    system = {"role": "system", "content": "You add numbers. Reply as 'Answer: <number>'."}

    def row(a: int, b: int) -> str:
        return json.dumps({"messages": [system, {"role": "user", "content": f"Add {a} and {b}."}], "target": a + b})

    (folder / "eval.jsonl").write_text("\n".join(row(a, 9 - a) for a in range(4)) + "\n")
    (folder / "tasks.jsonl").write_text("\n".join([row(1, 2), row(0, 9), row(3, 4), row(2, 2), row(4, 1)]) + "\n")
    (folder / "serve.yaml").write_text(yaml.safe_dump({"scenarios": {"sums": {
        "reward": f"{module}:score", "eval": {"path": "eval.jsonl"}, "tasks": "tasks.jsonl"}}}))
    return "sums"


def test_ttt_and_self_play_on_a_user_scenario(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared in ./serve.yaml with its reward in a user module: both recipes find it by name."""
    folder = tmp_path / "project"
    folder.mkdir()
    name = write_user_scenario(folder)
    monkeypatch.chdir(folder)
    base = {"scenario": name, "base_model": str(tiny)}
    with pytest.raises(ValueError, match="eval suite"):
        load_recipe("ttt", {**base, "task_id": 1}).problem()  # row 1 is also an eval row (same messages)
    with pytest.raises(ValueError, match="has 5 tasks"):
        load_recipe("ttt", {**base, "task_id": 7}).problem()
    ttt = load_recipe("ttt", {**base, "task_id": 2, "max_steps": 3, "samples_per_round": 8})
    task, index, reward = ttt.problem()
    assert index == 2 and task["target"] == 7
    assert [s.value for s in reward([task, task], ["Answer: 7", "Answer: 8"])] == [1.0, 0.0]
    cand = ttt.run(snapshot(ttt, folder / "no-data", tmp_path, allow_empty=True), out_root=tmp_path / "c",
                   progress=False)
    assert cand.scenario == name and cand.metrics["task_id"] == 2 and cand.metrics["rounds"] == 3
    assert cand.metrics["best_score"] in (0.0, 1.0)

    sp = load_recipe("self_play", {**base, "max_steps": 2, "proposals_per_round": 4, "choices": 3})
    cand = sp.run(snapshot(sp, folder / "no-data", tmp_path, allow_empty=True), out_root=tmp_path / "c",
                  progress=False)
    m = cand.metrics
    assert (m["practice_tasks"], m["eval_tasks_left_out"], m["rounds"]) == (4, 1, 2)
    assert {t for h in m["history"] for t in h["tasks"]} <= {"row-0", "row-1", "row-2", "row-3"}


def test_recipe_takes_a_scenario_object(tiny: Path, tmp_path: Path) -> None:
    """The Python path: a `reef.Scenario` handed to the recipe, no serve.yaml anywhere."""
    write_user_scenario(tmp_path)
    scenario = Scenario(name="sums", reward=f"user_reward_{tmp_path.name.replace('-', '_')}:score",
                        eval=EvalSpec(path=Path("eval.jsonl")), tasks=Path("tasks.jsonl"), base_dir=tmp_path)
    ttt = load_recipe("ttt", {"scenario": "sums", "base_model": str(tiny), "task_id": 0}, declared=scenario)
    task, _, reward = ttt.problem()
    assert task["target"] == 3 and reward([task], ["Answer: 3"])[0].value == 1.0
    with pytest.raises(ValueError, match="configured for 'demo-add'"):
        load_recipe("ttt", {"scenario": "demo-add"}, declared=scenario)
    assert load_recipe("ttt", {}, declared=scenario).config.scenario == "sums"  # the object names it
    bare = load_recipe("self_play", {"scenario": "bare", "base_model": str(tiny)}, declared=Scenario(name="bare"))
    snap = Snapshot.create("bare", tmp_path / "no-data", bare.experience(), root=tmp_path / "snaps",
                           ledger_root=tmp_path / "ledger", allow_empty=True)
    with pytest.raises(ScenarioError, match="'bare' declares no tasks"):
        bare.run(snap, out_root=tmp_path / "c", progress=False)


def test_ttt_as_params_yaml_train_recipe(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`learn_once` without DVC (what `reef learn` runs): an empty snapshot is not "nothing new"
    for a recipe that needs no traffic; it trains and evaluates."""
    params = {
        "scenarios": {SCENARIO: {}}, "base_model": {"path": str(tiny)},
        "source": {"data_dir": str(tmp_path / "data"), "ledger_root": str(tmp_path / "ledger")},
        "train": {"recipe": "recipes.experimental.ttt.recipe:TTT", "max_steps": 2, "samples_per_round": 4},
        "evaluate": {"samples": 1, "seed": 0},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    out = learn_once("params.yaml", use_dvc=False, progress=False)
    assert out["status"] == "trained" and out["candidate"]["metrics"]["rounds"] == 2
    assert out["candidate"]["lineage"]["recipe"] == "recipes.experimental.ttt.recipe:TTT"
    assert out["metrics"]["prompts"] == gated_tasks(out["metrics"], 80)
