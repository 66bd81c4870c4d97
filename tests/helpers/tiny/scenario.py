"""The demo-add scenario, declared through the public contract like any user's (`reef.scenarios`
entry point in tests/helpers/tiny/site): eval and task files next to this module, a per-task reward.

    python -m tests.helpers.tiny.scenario    # rewrite data/eval.jsonl and data/tasks.jsonl from task.py
"""

from __future__ import annotations

import json
from pathlib import Path

from reef.scenario import EvalSpec, NextTurnRule, NextTurnSpec, Scenario

HERE = Path(__file__).resolve().parent


def scenario() -> Scenario:
    return Scenario(
        name="demo-add",
        description="single-digit addition; the reply must say 'Answer: <sum>'",
        reward="tests.helpers.tiny.task:reward",
        eval=EvalSpec(path=Path("data/eval.jsonl"), max_new_tokens=16, samples=4, temperature=1.0),
        tasks=Path("data/tasks.jsonl"),
        # What the demo's users say after a reply (reef.traffic.simulate): a doubt means it was wrong,
        # a thank-you that it was right. Nothing else: a user does not tell the sum they expected.
        next_turn=NextTurnSpec(rules=[
            NextTurnRule(pattern=r"\bare you sure\b|\bwrong\b|\btry again\b|\bcheck it\b", reward=0.0),
            NextTurnRule(pattern=r"^\s*(thanks|thank you)\b|\bthat's right\b", reward=1.0),
        ]),
        base_dir=HERE,
    )


def write_files() -> None:
    from tests.helpers.tiny import task

    (HERE / "data").mkdir(exist_ok=True)
    for name, tasks in (("eval", task.eval_tasks()), ("tasks", task.train_tasks(0))):
        lines = [json.dumps(task.as_row(t)) for t in tasks]
        (HERE / "data" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write_files()
