"""`params.yaml`: the pydantic schema of the DVC pipeline's parameters (its stages, `reef learn --once`,
`reef recipe run`), built from the same types as serve.yaml.

DVC reads the same file as plain YAML and tracks its keys by dotted path (`train.max_steps`), so the
keys stay flat: `train:` is a recipe setting written out (`recipe`, `experience:` and the recipe
config's own fields side by side), and `recipe_spec()` turns it into serve.yaml's `RecipeSpec`, which
the round planner (reef.learn.plan) plans from for the pipeline and the learner alike. Every section
is strict; the recipe's own fields depend on which recipe is named, so the pipeline checks those
against the recipe's config class when it plans (`origin()` says where a key was written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from reef.config.gate import GateSettings, move_keys
from reef.config.serve import DEFAULT_MODEL, ConfigError, _Strict
from reef.core.paths import DEFAULT_DATA_DIR, DataDir
from reef.scenario.schema import RecipeSpec, StalePolicy

DEFAULT_PARAMS = Path("params.yaml")
# The experience fields serve.yaml's RecipeSpec holds as its own; the rest go to its params.
_SPEC_FIELDS = ("batch_size", "max_staleness", "stale_policy")


class ParamsError(ConfigError):
    """An invalid params.yaml; the message names the file and the key."""


class BaseModelParams(_Strict):
    """The model the pipeline trains from: the default model, which the base-model stage fetches."""

    path: str = str(DEFAULT_MODEL)
    seed: int = 0  # read by no stage since the default model is fetched, not trained; kept so older files parse


class SourceParams(_Strict):
    """Where the experience is read from, where its scenarios are declared, and where consumed record ids are kept."""

    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="a data dir as `reef serve` writes it")
    ledger_root: Path = DataDir().ledger
    serve_yaml: Path | None = Field(default=None, description="the serve.yaml declaring the scenarios (their "
                                    "tasks, reward, eval suite); unset: ./serve.yaml, as every reef command reads")


class DemoTrafficParams(_Strict):
    """The demo-traffic stage: offline traffic of one scenario, so the pipeline runs from a clone."""

    scenario: str = "sentiment"
    prompts: int = Field(default=64, ge=1)
    samples: int = Field(default=4, ge=1)
    seed: int = 0


class ExperienceParams(_Strict):
    """`train.experience`: which records a round takes (reef.recipe.snapshot.ExperienceSpec); unset: the recipe's."""

    batch_size: int | None = Field(default=None, ge=1, description="eligible rewarded records one round takes")
    max_staleness: int | None = Field(default=None, ge=0, description="releases behind the head a record may be")
    stale_policy: StalePolicy | None = None
    stale_weight: float | None = Field(default=None, ge=0, le=1)
    min_score: float | None = None
    group_by: str | None = None
    drop_duplicates: bool | None = None


class TrainParams(_Strict):
    """`train:` and each `scenarios.<name>:` entry: the recipe, its experience, and its config's own fields."""

    # The recipe config's own fields (max_steps, kind, ...) depend on the recipe: kept, and checked
    # against its config class when a round is planned.
    model_config = ConfigDict(extra="allow")

    recipe: str | None = Field(default=None, description="a built-in name or module:Class; unset: train's")
    experience: ExperienceParams = Field(default_factory=ExperienceParams)

    @property
    def own(self) -> dict[str, Any]:
        """The recipe config's own fields as written."""
        return dict(self.model_extra or {})

    def over(self, base: TrainParams) -> TrainParams:
        """These keys over `base`'s (a scenario's entry over `train`)."""
        experience = {**base.experience.model_dump(exclude_unset=True),
                      **self.experience.model_dump(exclude_unset=True)}
        return TrainParams.model_validate({"recipe": self.recipe or base.recipe, "experience": experience,
                                           **base.own, **self.own})

    def recipe_spec(self, name: str = str(DEFAULT_PARAMS)) -> RecipeSpec:
        """serve.yaml's form of this setting: a train key wins over the same `experience` key."""
        if self.recipe is None:
            raise ParamsError(f"{name}: train.recipe: required (a built-in name or module:Class)")
        params = {**self.experience.model_dump(exclude_unset=True), **self.own}
        lifted = {key: params.pop(key) for key in _SPEC_FIELDS if params.get(key) is not None}
        try:
            return RecipeSpec(recipe=self.recipe, params=params, **lifted)
        except ValidationError as exc:
            raise ParamsError(f"{name}: train.{'; '.join(_problem(err) for err in exc.errors())}") from exc


class EvaluateParams(_Strict):
    """`evaluate:`: what the evaluate stage compares each candidate with (the gate's settings are `gate:`)."""

    baseline: str | None = Field(default=None, description="a model folder; unset: base_model.path")


# params.yaml's gate keys under `evaluate:`, before `gate:`: each moves to the same field of `gate:`.
_EVALUATE_GATE_KEYS = {name: name for name in GateSettings.model_fields}


class PipelineParams(_Strict):
    """params.yaml, whole."""

    base_model: BaseModelParams = Field(default_factory=BaseModelParams)
    source: SourceParams = Field(default_factory=SourceParams)
    demo_traffic: DemoTrafficParams = Field(default_factory=DemoTrafficParams)
    train: TrainParams = Field(default_factory=TrainParams)
    scenarios: dict[str, TrainParams] = Field(default_factory=dict, description="the scenarios the pipeline "
                                              "learns for, each with its own keys over `train`")
    gate: GateSettings = Field(default_factory=GateSettings, description="the gate's settings (serve.yaml's "
                               "release.gate, the same type)")
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    _name: str = PrivateAttr(default=str(DEFAULT_PARAMS))  # the file, as messages name it

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "scenario" in data:
            raise ValueError(f"`scenario: {data['scenario']}` is now `scenarios: {{{data['scenario']}: {{}}}}` "
                             "(one entry per scenario the pipeline learns for)")
        evaluate = data.get("evaluate") if isinstance(data, dict) else None
        if isinstance(evaluate, dict) and any(key in evaluate for key in _EVALUATE_GATE_KEYS):
            evaluate = dict(evaluate)
            gate = move_keys(evaluate, data.get("gate"), _EVALUATE_GATE_KEYS, "evaluate.", "gate.")
            data = {**data, "evaluate": evaluate, "gate": gate}
        return data

    @field_validator("train", mode="before")
    @classmethod
    def _empty_train(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("scenarios", mode="before")
    @classmethod
    def _scenario_names(cls, value: Any) -> Any:
        value = value or {}
        if isinstance(value, dict):
            for name in value:
                if "." in str(name):  # DVC addresses params by dotted path: `scenarios.a.b` cannot be tracked
                    raise ValueError(f"{name}: DVC cannot track a scenario name with a dot")
            value = {name: entry or {} for name, entry in value.items()}
        return value

    @classmethod
    def read(cls, path: Path | str = DEFAULT_PARAMS) -> PipelineParams:
        """The file, validated; ParamsError names the file and the bad key."""
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ParamsError(f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ParamsError(f"{path} must hold a mapping of keys, got {type(data).__name__}")
        return cls.parse(data, str(path))

    @classmethod
    def parse(cls, data: dict[str, Any], name: str = str(DEFAULT_PARAMS)) -> PipelineParams:
        try:
            params = cls.model_validate(data)
        except ValidationError as exc:
            raise ParamsError(f"{name}: {'; '.join(_problem(err) for err in exc.errors())}") from exc
        params._name = name
        return params

    @property
    def name(self) -> str:
        return self._name

    @property
    def scenario_names(self) -> list[str]:
        return list(self.scenarios)

    def scenario(self, name: str | None = None) -> str:
        """`name`, checked, or the only scenario params.yaml declares."""
        if name is not None:
            if name not in self.scenarios:
                raise ParamsError(f"{self.name} declares no scenario {name!r} (scenarios: {self.scenario_names})")
            return name
        if len(self.scenarios) != 1:
            raise ParamsError(f"{self.name} declares scenarios {self.scenario_names}: name one (--scenario)")
        return self.scenario_names[0]

    def train_for(self, scenario: str, overrides: dict[str, Any] | None = None) -> TrainParams:
        """`train` with the scenario's own keys over it, and `overrides` (recipe fields) over both."""
        merged = self.scenarios.get(scenario, TrainParams()).over(self.train)
        return TrainParams.model_validate({**merged.model_dump(exclude_unset=True), **(overrides or {})})

    def recipe_spec(self, scenario: str, overrides: dict[str, Any] | None = None) -> RecipeSpec:
        return self.train_for(scenario, overrides).recipe_spec(self.name)

    def unknown(self, scenario: str, key: str) -> ParamsError:
        """The error for a recipe field the scenario's recipe does not take, naming where it was written."""
        where = f"scenarios.{scenario}" if key in self.scenarios.get(scenario, TrainParams()).own else "train"
        return ParamsError(f"{self.name}: {where}.{key}: unknown key")


def _problem(err: Any) -> str:
    where = ".".join(str(part) for part in err["loc"])
    message = "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["max_steps=5", "kind=lora"]` -> {"max_steps": 5, "kind": "lora"} (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ParamsError(f"expected KEY=VALUE, got {item!r}")
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str):
            try:  # YAML 1.1 reads "1e-4" as a string
                parsed = float(parsed)
            except ValueError:
                pass
        out[key.strip()] = parsed
    return out
