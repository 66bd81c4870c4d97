"""The bundled demo task: single-digit addition with a programmatic verifier.

Every prompt asks for `a + b` (a, b in 0..9) in one of a few phrasings; the reply must contain
`Answer: <number>`. The 100 (a, b) pairs are split once, by a fixed seed, into 80 train pairs and
20 held-out eval pairs. Eval prompts are never part of training traffic, so a gain on them means
the learned behaviour generalises rather than being memorised per prompt.

Addition is a good toy for a tiny model: the answer space is small (0..18), the verifier is exact,
and the embedded base model (see `corpus.py`) knows the format but is right only about a
quarter of the time, which leaves room for RL to show a clear improvement.
"""

from __future__ import annotations

import random
import re

from pydantic import BaseModel, ConfigDict

SCENARIO = "demo-add"
SYSTEM_PROMPT = "You add numbers. Reply as 'Answer: <number>'."
# Phrasings share one answer, so a policy that only learns one template still shows up in eval.
TEMPLATES: tuple[str, ...] = (
    "What is {a} + {b}?",
    "What is {a} plus {b}?",
    "Compute {a} + {b}.",
    "Add {a} and {b}.",
)
EVAL_PAIR_COUNT = 20
# Fixed, independent of any training seed: the held-out set must never move.
_SPLIT_SEED = 1234
_ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)")


class Task(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    messages: list[dict[str, str]]
    answer: int


def _pairs() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    pairs = [(a, b) for a in range(10) for b in range(10)]
    # Held-out sums stay within 2..16 so each answer they need also has train pairs (0 and 18
    # have one pair each, 1 and 17 two): RL can't teach a number it never sees rewarded.
    candidates = [(a, b) for a, b in pairs if 2 <= a + b <= 16]
    held_out = set(random.Random(_SPLIT_SEED).sample(candidates, EVAL_PAIR_COUNT))
    return [p for p in pairs if p not in held_out], [p for p in pairs if p in held_out]


def make_task(a: int, b: int, template: int) -> Task:
    return Task(
        task_id=f"add-{a}-{b}-t{template}",
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": TEMPLATES[template].format(a=a, b=b)},
        ],
        answer=a + b,
    )


def _tasks(pairs: list[tuple[int, int]]) -> list[Task]:
    return [make_task(a, b, t) for a, b in pairs for t in range(len(TEMPLATES))]


def train_tasks(seed: int = 0) -> list[Task]:
    """All 320 train prompts (80 pairs x 4 phrasings), in an order shuffled by `seed`."""
    tasks = _tasks(_pairs()[0])
    random.Random(seed).shuffle(tasks)
    return tasks


def eval_tasks() -> list[Task]:
    """The 80 held-out prompts (20 pairs x 4 phrasings), in a fixed order."""
    return _tasks(_pairs()[1])


def all_tasks() -> list[Task]:
    """Train and eval prompts together, in a fixed order (for the base model's warm start)."""
    return _tasks(_pairs()[0] + _pairs()[1])


def format_answer(value: int) -> str:
    return f"Answer: {value}"


def parse_answer(completion_text: str) -> int | None:
    """The number after the first `Answer:`, or None when the reply has no such line."""
    match = _ANSWER_RE.search(completion_text or "")
    return int(match.group(1)) if match else None


def score(task: Task, completion_text: str) -> float:
    """1.0 when the first `Answer: N` has N == the right sum, else 0.0."""
    return 1.0 if parse_answer(completion_text) == task.answer else 0.0


def score_shaped(task: Task, completion_text: str) -> float:
    """Like `score`, with partial credit that gives RL a gradient before the first correct answer:
    0.1 for a well-formed answer, up to +0.2 more the closer it is, 1.0 when right."""
    value = parse_answer(completion_text)
    if value is None:
        return 0.0
    if value == task.answer:
        return 1.0
    return 0.1 + 0.2 * max(0.0, 1.0 - abs(value - task.answer) / 10)


def as_row(task: Task) -> dict[str, object]:
    """The task as a scenario task row (what the eval and tasks files hold)."""
    return {"task_id": task.task_id, "messages": task.messages, "answer": task.answer}


def reward(task: dict[str, object], reply: str) -> float:
    """The demo scenario's declared reward: a per-task verifier over a task row."""
    return 1.0 if parse_answer(reply) == task["answer"] else 0.0
