"""The gate's looks: it samples the eval suite in `looks` parts and judges after each, so a clear
win stops the gate early instead of sampling every task.

The parts are slices of one seeded random order of the tasks, so each look judges a random sample
of the suite (a suite sorted by topic or difficulty would otherwise be judged on its first topic).
Before the last look, a candidate is selected only when both statistics pass at `early_confidence`
(0.999 by default): the Haybittle-Peto rule, whose interim bound is strict enough that the last
look keeps its nominal `confidence`, so a candidate the full suite would reject is almost never
selected early. Nothing is rejected early: a rejection takes the whole suite.

A part's per-task seeds continue the whole order's (`seed + position`), so the engine samples the
same replies however the order is cut. The suite's first task leads the order: the gate's probe
(the candidate's greedy reply to it, which a swap's canary request must reproduce) is taken with the
first part only.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from reef.gate.sample import Replies
from reef.scenario import EvalSuite

__all__ = ["merge", "part", "plan_looks"]


def plan_looks(tasks: int, looks: int, seed: int, min_part: int = 1) -> list[list[int]]:
    """The suite's task indices in `looks` consecutive parts of a seeded random order, each part at
    least `min_part` tasks (the valid pairs a verdict needs: a look at fewer could never select, it
    would only split the engine's batch); one part, in suite order, when that leaves one look."""
    looks = min(looks, tasks // max(1, min_part), tasks // 2)
    if looks <= 1:
        return [list(range(tasks))]
    order = list(range(tasks))
    random.Random(seed).shuffle(order)
    # The suite's first task leads the first part: the gate's probe is the candidate's greedy reply
    # to it (what a swap's canary request must reproduce), and the first part samples it.
    order.remove(0)
    order.insert(0, 0)
    bounds = [round(tasks * k / looks) for k in range(looks + 1)]
    return [order[bounds[k]:bounds[k + 1]] for k in range(looks)]


def part(suite: EvalSuite, indices: Sequence[int], start: int) -> EvalSuite:
    """The sub-suite of `indices`, starting at position `start` of the whole order (its seeds)."""
    return dataclasses.replace(suite, tasks=[suite.tasks[i] for i in indices], seed=suite.seed + start)


def merge(total: int, parts: Sequence[tuple[Sequence[int], Replies]]) -> Replies:
    """The parts' replies as one run over the suite (`total` tasks, in suite order): a task no part
    sampled has no replies in either arm; faults keyed by suite index; the first part's probe (the
    suite's first task's)."""
    merged = Replies({"candidate": [[] for _ in range(total)], "head": [[] for _ in range(total)]})
    notes: list[str] = []
    for indices, run in parts:
        for j, i in enumerate(indices):
            for arm in merged.outputs:
                merged.outputs[arm][i] = run.outputs[arm][j]
        merged.faults.update({indices[j]: fault for j, fault in run.faults.items()})
        merged.retries += run.retries
        merged.head_reused += run.head_reused
        merged.backend = run.backend
        merged.probe = merged.probe or run.probe
        if run.note and run.note not in notes:
            notes.append(run.note)
    merged.note = "".join(notes)
    merged.faults = dict(sorted(merged.faults.items()))  # in suite order, as one look has them
    return merged
