"""The one evaluator: a scenario's eval suite and the replies to its tasks (whoever sampled them),
scored with the suite's reward in one batch call, per task and overall.

The gate pairs two arms' per-task scores (reef.gate.evaluate); `reef scenario check` reports one
model's success with a confidence interval (reef.gate.check); a model's build can measure its
success rate with it. A reply the reward could not score is left out and counted, never
scored 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reef.config import resolve
from reef.scenario import EvalSuite, Scenario, Score, eval_suite, get_scenario


def declared_scenario(scenario: str) -> Scenario:
    """A scenario as installed packages and ./serve.yaml declare it."""
    config, _ = resolve()  # serve.yaml in the working folder, if any, declares scenarios too
    return get_scenario(scenario, config)


def suite_for(scenario: str, engine_url: str | None = None, engine_model: str | None = None) -> EvalSuite:
    """The declared eval suite of a scenario (see reef.scenario); ScenarioError when it has none."""
    return eval_suite(declared_scenario(scenario), engine_url, engine_model)


def mean_score(scores: Sequence[Score]) -> float | None:
    """Mean of the scored replies; a reply the reward could not score is left out (None when none was)."""
    values = [s.value for s in scores if s.value is not None]
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Evaluation:
    """The scores of a suite's replies: `scores[i][k]` is the k-th reply to task i."""

    scores: list[list[Score]]

    @property
    def per_task(self) -> list[float | None]:
        """Each task's mean over its scored replies (None: none was scorable)."""
        return [mean_score(task) for task in self.scores]

    @property
    def unscored_per_task(self) -> list[int]:
        return [sum(s.value is None for s in task) for task in self.scores]

    @property
    def unscored(self) -> int:
        return sum(self.unscored_per_task)

    @property
    def scored_tasks(self) -> list[float]:
        return [v for v in self.per_task if v is not None]

    @property
    def success(self) -> float:
        """Mean over the scored tasks of their means: each task weighs the same (0.0 when none was scored)."""
        values = self.scored_tasks
        return sum(values) / len(values) if values else 0.0

    @property
    def reply_mean(self) -> float:
        """Mean over every scored reply: tasks weigh by their scored replies (0.0 when none was scored)."""
        values = [s.value for task in self.scores for s in task if s.value is not None]
        return sum(values) / len(values) if values else 0.0


def score_replies(suite: EvalSuite, replies: Sequence[Sequence[str]]) -> Evaluation:
    """`replies[i]` (any number per task) scored by `suite`'s reward; RewardError when the reward fails."""
    return Evaluation(suite.score(replies))
