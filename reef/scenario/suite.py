"""A scenario's task rows (eval suite and training prompts), loaded and validated.

A task is one JSON object: `{"messages": [...], "tools": [...]?, ...}`. `messages` is the chat
the model is sent (OpenAI format); every other field is the task's own (an answer, a test, an
id) and reaches the reward unchanged; `reference`, when a row has one, is the reply wanted (what a
user who rejects a reply reports as its `correction`), or for an agent task the list of assistant
turns wanted (see `reference_turn`). Rows come from a JSON lines file or a `datasets` folder
(`Dataset.save_to_disk` or parquet files).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reef.scenario.environment import Environment
from reef.scenario.reward import RewardFn, Score

Task = dict[str, Any]


def correction(task: Task, score: float, accept: float) -> str | None:
    """The task's `reference` reply, for a reply scored below `accept`: the correction a user who
    knows the wanted reply reports with a rejected one."""
    reference = task.get("reference")
    return reference if score < accept and isinstance(reference, str) and reference else None


def reference_turn(task: Task, k: int) -> dict[str, Any] | None:
    """The assistant turn wanted at an agent episode's turn `k` (0-based), when the task's
    `reference` is a list of assistant messages (tool calls as `{"function": {"name", "arguments"}}`,
    the final answer as `content`); None past its end or for a text `reference`."""
    reference = task.get("reference")
    if not isinstance(reference, list) or not 0 <= k < len(reference) or not isinstance(reference[k], dict):
        return None
    wanted = reference[k]
    return {"role": "assistant", **{key: wanted[key] for key in ("content", "tool_calls") if key in wanted}}


def same_calls(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two assistant messages make the same tool calls: names and arguments (parsed when
    JSON, so spacing does not matter), in order; ids are ignored."""
    return _calls(a) == _calls(b)


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or call
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        out.append((fn.get("name"), arguments))
    return out


class ScenarioError(ValueError):
    """A bad scenario declaration; the message names the scenario and the key."""


def _read_rows(path: Path) -> list[Task]:
    if path.is_dir():
        import datasets

        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
            ds = datasets.load_from_disk(str(path))
        else:
            files = sorted(str(p) for p in path.rglob("*.parquet"))
            if not files:
                raise ValueError(f"{path} holds neither a saved dataset nor parquet files")
            ds = datasets.load_dataset("parquet", data_files=files, split="train")
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        return [dict(row) for row in ds]
    rows = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n} is not JSON: {exc.msg}") from exc
    return rows


def validate_task(row: Any, where: str) -> Task:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a task must be a JSON object, got {type(row).__name__}")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: `messages` must be a non-empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}: messages[{i}] must be an object with a string `role`")
        if m["role"] not in ("system", "user", "assistant", "tool", "developer"):
            raise ValueError(f"{where}: messages[{i}].role {m['role']!r} is not a chat role")
    if "tools" in row and row["tools"] is not None and not isinstance(row["tools"], list):
        raise ValueError(f"{where}: `tools` must be a list of tool definitions")
    return row


def load_tasks(path: Path, label: str) -> list[Task]:
    """Every row of `path`, validated; raises ScenarioError naming `label` (e.g. 'support: eval.path')."""
    if not path.exists():
        raise ScenarioError(f"{label}: {path} does not exist")
    try:
        rows = _read_rows(path)
        tasks = [validate_task(row, f"{path} row {i}") for i, row in enumerate(rows)]
    except (ValueError, OSError) as exc:
        raise ScenarioError(f"{label}: {exc}") from exc
    if not tasks:
        raise ScenarioError(f"{label}: {path} holds no tasks")
    return tasks


@dataclass
class EvalSuite:
    """The tasks a gate compares two models on, the sampling settings, and the reward."""

    tasks: Sequence[Task]
    reward: RewardFn
    max_new_tokens: int = 64
    samples: int = 4
    temperature: float = 1.0
    seed: int = 0
    name: str = ""
    unscored: list[str] = field(default_factory=list)
    environment: Environment | None = None  # set: each reply is an episode's final answer (tools executed)
    max_turns: int = 1

    @property
    def prompts(self) -> list[list[dict[str, Any]]]:
        return [t["messages"] for t in self.tasks]

    def score(self, replies: Sequence[Sequence[str]]) -> list[list[Score]]:
        """Scores for `replies[i][k]`, the k-th reply to task i, in one batch call of the reward."""
        flat_tasks = [self.tasks[i] for i, rs in enumerate(replies) for _ in rs]
        flat = self.reward([*flat_tasks], [r for rs in replies for r in rs])
        out, at = [], 0
        for rs in replies:
            out.append(flat[at : at + len(rs)])
            at += len(rs)
        return out
