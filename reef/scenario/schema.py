"""The scenario contract: what a user declares so that Reef can learn, gate and release for their agent.

A scenario is the unit everything after recording is keyed by (the `x-reef-scenario` header). It
declares how to judge a reply (`reward`), what to judge on before a release (`eval`), which
prompts a recipe may practise on (`tasks`), which recipe learns from its traffic (`recipe`), and,
for a tool-using agent, what executes its tool calls (`environment`, see reef.scenario.environment).
The same pydantic types are what `serve.yaml` is parsed into and what Python users construct:

    recipes:
      fast-rft: {recipe: rft, batch_size: 64, max_staleness: 2, params: {kind: lora}}
    scenarios:
      support:
        policy: approval
        recipe: fast-rft
        eval: {path: scenarios/support/eval.jsonl, max_new_tokens: 256, samples: 4, temperature: 1.0}
        reward: my_pkg.rewards:score

Relative paths (eval, tasks) and reward modules are resolved against `base_dir`: the folder of
the serve.yaml that declared the scenario, or the package that shipped it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Policy = Literal["auto", "approval"]
Inject = Literal["system_prepend", "system_replace", "off"]
StalePolicy = Literal["drop", "downweight"]


class _Strict(BaseModel):
    # An unknown key is an error naming that key, never silently ignored.
    model_config = ConfigDict(extra="forbid")


class CanaryConfig(_Strict):
    """How a canary splits live traffic and when it decides (`POST /reef/scenarios/{s}/canary`)."""

    fraction: float = Field(default=0.1, gt=0, lt=1, description="share of the scenario's requests")
    min_reports: int = Field(default=30, ge=1, description="reports per arm before deciding")
    tolerance: float = Field(
        default=0.0, ge=0,
        description="promote when the interval of candidate minus head mean reward lies above -tolerance, else abort",
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="of that interval (Welch, normal)")


class HarnessSpec(_Strict):
    """How the gateway applies the scenario's served harness (the head release's) to chat requests."""

    inject: Inject = Field(
        default="off", description="system_prepend: before the client's system prompt; system_replace: instead "
        "of it; off: clients fetch it themselves (GET /reef/harness)")


class RecipeSpec(_Strict):
    """A named recipe setting (serve.yaml `recipes.<name>`), or a scenario's inline one."""

    recipe: str = Field(description="a built-in name (rft, online_rl, kto, ttt, self_play, next_turn) or module:Class")
    batch_size: int | None = Field(default=None, ge=1, description="eligible rewarded records one round takes")
    max_staleness: int | None = Field(default=None, ge=0, description="releases behind the head a record may be")
    stale_policy: StalePolicy | None = Field(default=None, description="drop | downweight records past max_staleness")
    min_records: int | None = Field(default=None, ge=1, description="eligible records needed to start a round; "
                                    "unset: learner.min_records")
    min_rewarded: int | None = Field(default=None, ge=0, description="eligible rewarded records needed to start a "
                                     "round; unset: learner.min_rewarded, if the recipe learns from rewards")
    min_unrewarded: int | None = Field(default=None, ge=0, description="eligible unrewarded records needed to start "
                                       "a round; unset: learner.min_unrewarded, if the recipe learns from them")
    params: dict[str, Any] = Field(default_factory=dict, description="the recipe config's own fields")

    def recipe_params(self) -> dict[str, Any]:
        """The keyword arguments of the recipe's config class (experience fields included)."""
        out = dict(self.params)
        for key in ("batch_size", "max_staleness", "stale_policy"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class EvalSpec(_Strict):
    """The held-out suite the gate compares a candidate and the head on."""

    path: Path = Field(description="JSON lines (one task per line) or a `datasets` folder (save_to_disk or parquet)")
    max_new_tokens: int = Field(default=64, ge=1)
    samples: int = Field(default=4, ge=1, description="replies per task and arm")
    temperature: float = Field(default=1.0, ge=0)
    seed: int = 0
    limit: int | None = Field(default=None, ge=1, description="use only the first N tasks")


class EnvironmentSpec(_Strict):
    """What executes the model's tool calls in the scenario's multi-turn episodes (reef.scenario.environment)."""

    factory: str = Field(description="module:function (or class) returning an object with execute(task, call) -> str")
    max_turns: int = Field(default=4, ge=1, description="model turns per episode; the last one's reply is scored")


class JudgeSpec(_Strict):
    """An LLM judge: it reads the rubric, the task and the reply, and writes `Score: X`."""

    model: str | None = Field(default=None, description="model name at `url`; null: the served model")
    url: str | None = Field(default=None, description="an OpenAI-compatible base URL; null: the served engine")
    rubric: str = Field(min_length=1)
    scale: float = Field(default=1.0, gt=0, description="the judge scores 0..scale; divided into [0, 1]")
    votes: int = Field(default=1, ge=1, description="judge calls per reply; the score is their mean")
    max_tokens: int = Field(default=32, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    api_key: str | None = None


class JudgeReward(_Strict):
    judge: JudgeSpec


Reward = str | JudgeReward


class NextTurnRule(_Strict):
    """What the turn after an assistant reply says about that reply: the first rule whose pattern
    matches the next message (a user turn, or a tool result) gives the reply its reward."""

    pattern: str = Field(min_length=1, description="a regular expression, searched case-insensitively")
    role: Literal["user", "tool"] = Field(default="user", description="which next message the rule reads")
    reward: float = Field(ge=0, le=1, description="the reward of the reply the matching turn answers")


class NextTurnSpec(_Strict):
    """Rewards from the next turn of a session, without any report (recipe `next_turn`): rules first,
    then, for a next turn no rule matches, an optional judge (its `votes` averaged) that reads the
    reply and the next turn."""

    rules: list[NextTurnRule] = Field(default_factory=list)
    judge: JudgeSpec | None = None


class ReplyFormat(_Strict):
    """The shape every rewarded reply has, in vLLM's structured-outputs terms: exactly one of a regular
    expression the whole reply matches, a list of replies to choose from, or a JSON schema. Exploration
    asks half its samples under guided decoding of it (as it asks a tool task's with `tool_choice:
    "required"`), so a reward the model's own replies never earn (a strict format it does not write
    unasked) has successes to learn from; the model is trained to write them unguided."""

    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one(self) -> ReplyFormat:
        given = [k for k in ("regex", "choice", "json_schema") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"reply_format takes exactly one of regex, choice, json_schema; got {given or 'none'}")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"reply_format.regex {self.regex!r} is not a regular expression: {exc}") from exc
        return self

    def structured_outputs(self) -> dict[str, Any]:
        """The request's `structured_outputs` field (vLLM's StructuredOutputsParams)."""
        if self.regex is not None:
            return {"regex": self.regex}
        return {"choice": self.choice} if self.choice is not None else {"json": self.json_schema}


class Scenario(_Strict):
    """One scenario; `reef.Scenario` is this type."""

    name: str = Field(default="", description="the x-reef-scenario value (the key it is declared under)")
    description: str | None = None
    policy: Policy | None = Field(default=None, description="auto | approval; unset: release.policy")
    canary: CanaryConfig = Field(default_factory=CanaryConfig)
    harness: HarnessSpec = Field(default_factory=HarnessSpec)
    recipe: str | RecipeSpec | None = Field(
        default=None, description="a name in `recipes:`, a built-in recipe, module:Class, or an inline spec"
    )
    reward: Reward | None = Field(
        default=None, description="module:function (per task or TRL-style batch), or {judge: {...}}"
    )
    eval: EvalSpec | None = None
    tasks: Path | None = Field(default=None, description="training prompts, for recipes that make their own samples")
    next_turn: NextTurnSpec | None = Field(
        default=None, description="how the next turn of a session rewards a reply (rules, judge): recipe next_turn")
    environment: EnvironmentSpec | None = Field(
        default=None, description="executes tool calls: the eval, simulated users and rollouts run episodes "
        "(model -> tool call -> result -> model -> answer); `module:function` or {factory, max_turns}")
    reply_format: ReplyFormat | None = Field(
        default=None, description="the shape every rewarded reply has ({regex}, {choice} or {json_schema}): "
        "exploration guides half its samples of a task without tools into it")
    base_dir: Path | None = Field(default=None, description="where relative paths and reward modules are found")

    @field_validator("environment", mode="before")
    @classmethod
    def _environment_ref(cls, value: Any) -> Any:
        return {"factory": value} if isinstance(value, str) else value

    def resolve_path(self, path: Path) -> Path:
        return path if path.is_absolute() or self.base_dir is None else self.base_dir / path

    def merged(self, override: dict[str, Any]) -> Scenario:
        """This scenario with the keys a later layer (serve.yaml over a package's) set."""
        data = self.model_dump(exclude_unset=False)
        data.update(override)
        return Scenario.model_validate(data)

    def recipe_spec(self, recipes: dict[str, RecipeSpec] | None = None) -> RecipeSpec | None:
        """The recipe this scenario learns with: a `recipes:` entry by name, else a recipe reference."""
        if self.recipe is None or isinstance(self.recipe, RecipeSpec):
            return self.recipe
        if recipes and self.recipe in recipes:
            return recipes[self.recipe]
        return RecipeSpec(recipe=self.recipe)
