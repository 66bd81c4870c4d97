"""The scenario contract: declare tasks, a reward, an eval suite and a recipe; Reef does the rest."""

from reef.scenario.discovery import (
    ENTRY_POINT_GROUP,
    all_scenarios,
    environment_for,
    eval_suite,
    get_scenario,
    packaged_scenarios,
    reward_for,
    training_tasks,
)
from reef.scenario.environment import Environment, EpisodeState, ToolCall, ToolEnvironmentError
from reef.scenario.reward import RewardError, RewardFn, Score, parse_judge_score
from reef.scenario.schema import (
    CanaryConfig,
    EnvironmentSpec,
    EvalSpec,
    HarnessSpec,
    JudgeReward,
    JudgeSpec,
    NextTurnRule,
    NextTurnSpec,
    RecipeSpec,
    ReplyFormat,
    Scenario,
)
from reef.scenario.suite import EvalSuite, ScenarioError, Task, correction, load_tasks, reference_turn, same_calls

__all__ = [
    "ENTRY_POINT_GROUP", "CanaryConfig", "Environment", "EnvironmentSpec", "EpisodeState", "EvalSpec", "EvalSuite",
    "HarnessSpec", "JudgeReward", "JudgeSpec", "NextTurnRule", "NextTurnSpec", "RecipeSpec", "ReplyFormat",
    "RewardError", "RewardFn", "Scenario", "ScenarioError", "Score", "Task", "ToolCall", "ToolEnvironmentError",
    "all_scenarios", "correction", "environment_for", "eval_suite", "reference_turn", "same_calls",
    "get_scenario", "load_tasks", "packaged_scenarios", "parse_judge_score", "reward_for", "training_tasks",
]
