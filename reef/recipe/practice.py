"""The problems a self-generating recipe (ttt, self_play) practises on: the scenario's `tasks:`,
never a task of its eval suite, which must stay unseen for the gate's comparison to mean anything.

A training task counts as an eval task when it has the same `task_id` or the same conversation
(`messages` and `tools`) as one; the reward scores replies through the scenario's declared reward.
With the head's harness (a recipe's `served_harness`), the practice tasks' messages are as the
gateway serves them: the harness injected the scenario's way (`harness.inject`).
"""

from __future__ import annotations

import json
from typing import Any

from reef.registry.harness import Harness, inject
from reef.scenario import Scenario, ScenarioError, Task, load_tasks, training_tasks


def task_key(task: Task) -> str:
    """What the model is shown: two tasks with the same key are the same problem to it."""
    return json.dumps([task["messages"], task.get("tools")], sort_keys=True)


class EvalTasks:
    """Membership in a scenario's eval suite (empty when it declares none)."""

    def __init__(self, scenario: Scenario) -> None:
        tasks = (load_tasks(scenario.resolve_path(scenario.eval.path), f"scenario {scenario.name!r}: eval.path")
                 if scenario.eval is not None else [])
        self.ids = {str(t["task_id"]) for t in tasks if t.get("task_id") is not None}
        self.keys = {task_key(t) for t in tasks}

    def __contains__(self, task: Task) -> bool:
        return (task.get("task_id") is not None and str(task["task_id"]) in self.ids) or task_key(task) in self.keys


def practice_tasks(scenario: Scenario, harness: Harness | None = None) -> tuple[list[Task], int]:
    """The scenario's training tasks that are not eval tasks (with `harness` injected as the gateway
    serves it), and how many were left out as eval tasks."""
    tasks = training_tasks(scenario)
    held_out = EvalTasks(scenario)
    kept = [t for t in tasks if t not in held_out]
    if not kept:
        raise ScenarioError(f"scenario {scenario.name!r}: every task in `tasks:` is also in the eval suite")
    if harness is not None and scenario.harness.inject != "off":
        kept = [{**t, "messages": inject(list(t["messages"]), harness, scenario.harness.inject)} for t in kept]
    return kept, len(tasks) - len(kept)


def find_task(scenario: Scenario, task_id: str | int | None) -> tuple[Task, int]:
    """The training task named by `task_id` (its `task_id` field, else its row index; None: row 0) and
    its row index; an eval task is refused."""
    tasks = training_tasks(scenario)
    held_out = EvalTasks(scenario)
    if task_id is not None and str(task_id) in held_out.ids:
        raise ValueError(f"task_id {task_id!r} is in scenario {scenario.name!r}'s eval suite, which must stay "
                         "unseen: name a held-in task")
    if task_id is None:
        index = 0
    else:
        matches = [i for i, t in enumerate(tasks) if t.get("task_id") is not None and str(t["task_id"]) == str(task_id)]
        if matches:
            index = matches[0]
        elif isinstance(task_id, int) or str(task_id).isdigit():
            index = int(task_id)
            if index >= len(tasks):
                raise ValueError(f"task_id {task_id!r}: scenario {scenario.name!r} has {len(tasks)} tasks")
        else:
            raise ValueError(f"task_id {task_id!r} names no task of scenario {scenario.name!r} (tasks: field "
                             "`task_id`, or a row index)")
    task = tasks[index]
    if task in held_out:
        raise ValueError(f"task_id {task_id!r} is in scenario {scenario.name!r}'s eval suite, which must stay "
                         "unseen: name a held-in task")
    return task, index


def describe(task: Task, max_chars: int = 200) -> str:
    """A task in one line for a prompt that lists several: its last user turn (or last message)."""
    users = [m for m in task["messages"] if m.get("role") == "user"] or task["messages"]
    content: Any = users[-1].get("content") or ""
    if isinstance(content, list):  # content parts: the text ones
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = " ".join(str(content).split())
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
