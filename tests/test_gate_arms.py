"""The gate's arms, model-free: a weights candidate is judged on the prompts it will serve, with the
head's harness in both arms where the gateway applies it (a weights release keeps the head's
harness), and none where clients apply it themselves or the head has none; a harness candidate's
arms differ by their harness."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.gate.arms import HarnessArms, served_harness
from reef.registry.artifacts import ArtifactStore
from reef.registry.chain import ReleaseChain
from reef.registry.harness import Harness
from reef.scenario import EvalSuite

pytestmark = pytest.mark.model_free

S = "weather"
SYSTEM = "Answer with a call of get_weather."


def _suite() -> EvalSuite:
    return EvalSuite(tasks=[{"messages": [{"role": "user", "content": "Weather in Oslo?"}], "city": "Oslo"}],
                     reward=lambda prompts, completions, **kw: [0.0] * len(completions), name=S)


def test_a_weights_candidate_is_gated_with_the_heads_harness(tmp_path: Path) -> None:
    store = ArtifactStore.for_data_dir(tmp_path)
    chain = ReleaseChain.for_data_dir(tmp_path, S)
    r0 = chain.ensure_base("b" * 64)
    assert served_harness(store, r0, "system_prepend") is None  # no harness yet: the suite's prompts

    tree = tmp_path / "harness"
    tree.mkdir()
    (tree / "system.md").write_text(SYSTEM + "\n")
    head = chain.publish(r0.release_id, r0.content_id, "full", "train",
                         harness_id=store.import_harness(tree).content_id)
    arms = served_harness(store, head, "system_prepend")
    assert arms is not None and not arms.compared  # the same harness both sides: the probe stays
    tasks = arms.tasks(_suite())
    for arm in ("candidate", "head"):
        assert tasks[arm][0]["messages"][0] == {"role": "system", "content": SYSTEM}, tasks[arm]
        assert tasks[arm][0]["messages"][1:] == _suite().tasks[0]["messages"] and tasks[arm][0]["city"] == "Oslo"
    assert served_harness(store, head, "off") is None  # clients apply it themselves, if at all


def test_a_harness_candidates_arms_differ_by_their_harness() -> None:
    assert HarnessArms(Harness("", {"rules.md": "- Be brief.\n"}), None).compared
    same = Harness("x", {"rules.md": "- Be brief.\n"})
    assert not HarnessArms(same, Harness("x", dict(same.files))).compared
