"""The head arm's replies, kept between gates: every gate of a scenario compares its candidate with
the same head until a release moves it, and the head's replies to a task (same weights, same prompt
as sent, same seed and sampling settings) are a sample of the same policy each time. So a gate
samples the head's replies once per head and task, and the learner samples them ahead of the next
round while it waits for experience (`warm`, reef.learn.learner): a round's gate then samples the
candidate's arm alone, half the engine time beside the users.

What a reuse changes: each gate's verdict is judged as before (fresh candidate replies against a
sample of the head's), but the gates against one head share that sample, so their errors are no
longer independent. Replies are kept only from the engine (transformers samples other replies for
the same seeds) and only for the head arm: a selected candidate's own gate replies are not reused
for it as the next head, because they are the replies it was selected on (a winner's sample would
raise the next gate's bar).

A task's key is a hash of everything that decides its replies: the head's content id, the task as
sent (its messages with any harness applied, tools, fields the environment reads), the seed, the
number of replies, the temperature, the token budget, the environment and its turn budget. A
changed suite or setting misses; nothing needs invalidating. `release.gate.reuse_head_replies:
false` turns it off.

The file is `gate/<scenario>/head-replies.jsonl`, one JSON line per task, each written with one
`write` on an `O_APPEND` descriptor as the reply arrives (a gate or warm-up killed midway keeps
what it sampled); it is a cache, so a torn last line is skipped rather than fsynced against.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import orjson

from reef.core.paths import DataDir
from reef.scenario import EvalSuite, Task

FILE = "head-replies.jsonl"


class HeadReplies:
    """One scenario's kept head replies: `get` the ones a gate can reuse, `put` each sampled one."""

    def __init__(self, data_dir: Path | str, scenario: str) -> None:
        self.path = DataDir(data_dir).gate(scenario) / FILE
        self._kept: dict[str, list[str]] | None = None

    @staticmethod
    def key(content: str, task: Task, *, seed: int, samples: int, suite: EvalSuite) -> str:
        """The hash of what decides a task's replies on the engine."""
        environment = type(suite.environment).__qualname__ if suite.environment is not None else None
        what = {"content": content, "task": task, "seed": seed, "samples": samples, "temperature": suite.temperature,
                "max_tokens": suite.max_new_tokens, "environment": environment, "max_turns": suite.max_turns}
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()

    def _load(self) -> dict[str, list[str]]:
        if self._kept is None:
            self._kept = {}
            if self.path.is_file():
                for line in self.path.read_bytes().splitlines():
                    try:
                        entry = orjson.loads(line)
                        self._kept[entry["key"]] = list(entry["replies"])
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        continue  # a line torn by a kill mid-write: that task is sampled again
        return self._kept

    def get(self, key: str) -> list[str] | None:
        return self._load().get(key)

    def put(self, key: str, replies: list[str]) -> None:
        kept = self._load()
        if kept.get(key) == replies:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = orjson.dumps({"key": key, "replies": replies}) + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        kept[key] = replies


def head_keys(content: str | None, tasks: list[Task], suite: EvalSuite, samples: int) -> list[str] | None:
    """Each task's key for the head arm (task i sampled with seed `suite.seed + i`, as the gate's
    engine sampling does), or None when the head's content is not known (nothing is kept)."""
    if content is None:
        return None
    return [HeadReplies.key(content, task, seed=suite.seed + i, samples=samples, suite=suite)
            for i, task in enumerate(tasks)]
