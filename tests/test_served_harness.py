"""A recipe that samples prompts of its own sends them as the gateway serves them, model-free: the
round hands a recipe the head's harness where the gateway injects it (none before a harness
release, none where clients apply it), and the practice tasks carry it, eval tasks still left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reef.learn.round import served_harness
from reef.recipe import load_recipe
from reef.recipe.practice import practice_tasks
from reef.registry.artifacts import ArtifactStore
from reef.registry.state import open_chain
from reef.scenario import Scenario

pytestmark = pytest.mark.model_free

S = "weather"
SYSTEM = "Answer with a call of get_weather."


def _scenario(folder: Path, inject: str = "system_prepend") -> Scenario:
    rows = [{"task_id": f"t{i}", "messages": [{"role": "user", "content": f"Weather in city {i}?"}], "city": f"c{i}"}
            for i in range(4)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "eval.jsonl").write_text(json.dumps(rows[3]) + "\n")
    (folder / "weather_reward.py").write_text("def reward(task, reply):\n    return float(task['city'] in reply)\n")
    return Scenario.model_validate({"name": S, "reward": "weather_reward:reward", "tasks": "tasks.jsonl",
                                    "eval": {"path": "eval.jsonl"}, "base_dir": str(folder),
                                    "harness": {"inject": inject}})


def test_the_head_harness_reaches_a_recipes_practice_tasks(tmp_path: Path) -> None:
    declared = _scenario(tmp_path)
    data = tmp_path / "data"
    recipe = load_recipe("explore", {"scenario": S, "kind": "lora"}, declared=declared)
    assert served_harness(data, recipe) is None  # no release yet

    store = ArtifactStore.for_data_dir(data)
    chain = open_chain(data, S)  # the backend the suite runs on (files, or the state pass's PostgreSQL)
    r0 = chain.ensure_base("b" * 64)
    assert served_harness(data, recipe) is None  # r0 has no harness
    tree = tmp_path / "harness"
    tree.mkdir()
    (tree / "system.md").write_text(SYSTEM + "\n")
    chain.publish(r0.release_id, r0.content_id, "full", "train", harness_id=store.import_harness(tree).content_id)
    harness = served_harness(data, recipe)
    assert harness is not None and harness.files == {"system.md": SYSTEM + "\n"}

    bare, left_out = practice_tasks(declared)
    served, _ = practice_tasks(declared, harness)
    assert left_out == 1 and [t["task_id"] for t in served] == [t["task_id"] for t in bare] == ["t0", "t1", "t2"]
    for plain, sent in zip(bare, served, strict=True):
        assert sent["messages"] == [{"role": "system", "content": SYSTEM}, *plain["messages"]]
        assert sent["city"] == plain["city"]  # the reward still reads the task's fields

    off = _scenario(tmp_path, inject="off")  # clients apply the harness themselves, if at all
    assert served_harness(data, load_recipe("explore", {"scenario": S, "kind": "lora"}, declared=off)) is None
    assert practice_tasks(off, harness)[0] == bare
