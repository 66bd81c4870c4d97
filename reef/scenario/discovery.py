"""Where scenarios come from: installed packages (the `reef.scenarios` entry-point group) and
serve.yaml (`scenarios:`), merged key by key with serve.yaml winning, so a file can set the policy
of a scenario a package ships without restating its eval suite.

An entry point names a `Scenario`, a list of them, or a function returning either:

    [project.entry-points."reef.scenarios"]
    support = "my_pkg.scenarios:support"
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol

from reef.scenario.environment import Environment, ToolEnvironmentError, load_environment
from reef.scenario.reward import RewardError, RewardFn, function_reward, judge_reward
from reef.scenario.schema import JudgeReward, Scenario
from reef.scenario.suite import EvalSuite, ScenarioError, Task, load_tasks

ENTRY_POINT_GROUP = "reef.scenarios"


class Declarations(Protocol):
    """What declares scenarios beside installed packages: serve.yaml's `ServeConfig` (the config
    layer sits above this one, so it is named by shape, not imported)."""

    @property
    def scenarios(self) -> Mapping[str, Scenario]: ...


def _as_scenarios(obj: Any, origin: str) -> Iterable[Scenario]:
    if callable(obj) and not isinstance(obj, Scenario):
        obj = obj()
    items = obj if isinstance(obj, list | tuple) else [obj]
    for item in items:
        if not isinstance(item, Scenario):
            raise ScenarioError(f"entry point {origin} gave {type(item).__name__}, not a reef.Scenario")
        if not item.name:
            raise ScenarioError(f"entry point {origin} gave a Scenario without a name")
        yield item


@functools.cache
def packaged_scenarios() -> dict[str, Scenario]:
    """Scenarios shipped by installed packages, by name."""
    out: dict[str, Scenario] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        for scenario in _as_scenarios(ep.load(), f"{ep.name} = {ep.value}"):
            out[scenario.name] = scenario
    return out


def _absolute(scenario: Scenario) -> Scenario:
    update: dict[str, Any] = {}
    if scenario.eval is not None:
        update["eval"] = scenario.eval.model_copy(update={"path": scenario.resolve_path(scenario.eval.path)})
    if scenario.tasks is not None:
        update["tasks"] = scenario.resolve_path(scenario.tasks)
    return scenario.model_copy(update=update)


def merge(base: Scenario | None, declared: Scenario) -> Scenario:
    """`declared` (from serve.yaml) over `base` (from a package): only the keys the file set. Each
    path stays relative to where it was declared (the package's folder or serve.yaml's), and the
    reward module is imported from where the reward was declared."""
    if base is None:
        return declared
    keys = declared.model_fields_set - {"name", "base_dir"}
    file_side = _absolute(declared)
    merged = _absolute(base).model_copy(update={k: getattr(file_side, k) for k in keys})
    return merged.model_copy(update={"base_dir": declared.base_dir if "reward" in keys else base.base_dir})


def all_scenarios(config: Declarations | None = None) -> dict[str, Scenario]:
    """Every declared scenario: packaged ones, with serve.yaml's declarations merged over them."""
    out = dict(packaged_scenarios())
    for name, declared in (config.scenarios if config is not None else {}).items():
        out[name] = merge(out.get(name), declared.model_copy(update={"name": name}))
    return out


def get_scenario(name: str, config: Declarations | None = None) -> Scenario:
    """The declared scenario, or an undeclared one (records only: no eval suite, no reward)."""
    return all_scenarios(config).get(name) or Scenario(name=name)


def reward_for(scenario: Scenario, engine_url: str | None = None, engine_model: str | None = None) -> RewardFn:
    if scenario.reward is None:
        raise ScenarioError(f"scenario {scenario.name!r} declares no reward")
    if isinstance(scenario.reward, JudgeReward):
        return judge_reward(scenario.reward.judge, engine_url, engine_model)
    try:
        return function_reward(scenario.reward, scenario.base_dir)
    except RewardError as exc:
        raise ScenarioError(f"scenario {scenario.name!r}: reward: {exc}") from exc


def environment_for(scenario: Scenario) -> Environment | None:
    """The scenario's tool environment (a fresh one), or None when it declares none."""
    if scenario.environment is None:
        return None
    try:
        return load_environment(scenario.environment.factory, scenario.base_dir)
    except ToolEnvironmentError as exc:
        raise ScenarioError(f"scenario {scenario.name!r}: environment: {exc}") from exc


def eval_suite(scenario: Scenario, engine_url: str | None = None, engine_model: str | None = None) -> EvalSuite:
    """The scenario's eval suite with its reward; ScenarioError when it declares none."""
    spec = scenario.eval
    if spec is None:
        raise ScenarioError(f"scenario {scenario.name!r} declares no eval suite (eval.path)")
    tasks = load_tasks(scenario.resolve_path(spec.path), f"scenario {scenario.name!r}: eval.path")
    if spec.limit is not None:
        tasks = tasks[: spec.limit]
    return EvalSuite(tasks=tasks, reward=reward_for(scenario, engine_url, engine_model),
                     max_new_tokens=spec.max_new_tokens, samples=spec.samples, temperature=spec.temperature,
                     seed=spec.seed, name=scenario.name, environment=environment_for(scenario),
                     max_turns=scenario.environment.max_turns if scenario.environment else 1)


def training_tasks(scenario: Scenario) -> list[Task]:
    """The scenario's `tasks:` (prompts for recipes that make their own experience)."""
    if scenario.tasks is None:
        raise ScenarioError(f"scenario {scenario.name!r} declares no tasks (tasks:)")
    return load_tasks(scenario.resolve_path(scenario.tasks), f"scenario {scenario.name!r}: tasks")
