"""Reef's config language: one pydantic schema for `serve.yaml` (reef.config.serve) and `params.yaml`
(reef.config.params), both strict, so an unknown key is an error naming it; the gate's settings
(reef.config.gate) are one model in both."""

from reef.config.gate import GateSettings
from reef.config.params import (
    BaseModelParams,
    DemoTrafficParams,
    EvaluateParams,
    ExperienceParams,
    ParamsError,
    PipelineParams,
    SourceParams,
    TrainParams,
    parse_overrides,
)
from reef.config.serve import (
    CONFIG_FILE_ENV,
    DEFAULT_CONFIG_FILE,
    DEFAULT_MODEL,
    DEFAULT_MODEL_NAME,
    ENV_PREFIX,
    ApiKey,
    ConfigError,
    EngineConfig,
    LearnerConfig,
    LimitsConfig,
    ReleaseConfig,
    ScenarioConfig,
    ServeConfig,
    StateConfig,
    StoreConfig,
    UpstreamConfig,
    describe,
    env_overrides,
    load_file,
    resolve,
)

__all__ = [
    "CONFIG_FILE_ENV", "DEFAULT_CONFIG_FILE", "DEFAULT_MODEL", "DEFAULT_MODEL_NAME",
    "ENV_PREFIX", "ApiKey", "BaseModelParams",
    "ConfigError", "DemoTrafficParams", "EngineConfig", "EvaluateParams", "ExperienceParams", "GateSettings",
    "LearnerConfig", "LimitsConfig", "ParamsError", "PipelineParams", "ReleaseConfig", "ScenarioConfig",
    "ServeConfig", "SourceParams", "StateConfig", "StoreConfig", "TrainParams", "UpstreamConfig", "describe",
    "env_overrides", "load_file", "parse_overrides", "resolve",
]
