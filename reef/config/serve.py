"""`serve.yaml`: the pydantic schema of Reef's server config and its resolution.

Precedence, highest first: command line > config file > environment (`REEF_*`, nested keys joined
with `__`, e.g. `REEF_ENGINE__MAX_MODEL_LEN=2048`) > defaults. `resolve()` also returns where each
value came from, which `reef serve --print-config` shows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from reef.config.gate import GateSettings, move_keys
from reef.config.learner import LearnerConfig
from reef.config.strict import Strict as _Strict
from reef.core.paths import DEFAULT_DATA_DIR
from reef.scenario.schema import Policy, RecipeSpec, Scenario

DEFAULT_CONFIG_FILE = Path("serve.yaml")
# The config file a process resolves when none is given (before ./serve.yaml): a round process sets
# it from its request (reef.learn.round), so it sees the scenarios of the server's `-c FILE`.
CONFIG_FILE_ENV = "REEF_CONFIG"
ENV_PREFIX = "REEF_"
# The model `reef serve` runs when none is named: SmolLM2-135M-Instruct, built from its PyPI wheel
# on first use (reef.model.smollm2).
DEFAULT_MODEL_DIR = Path("data/models/smollm2-135m-instruct")


def find_default_model(start: Path | None = None) -> Path:
    """Where the embedded default lives for a process started in `start` (the working folder): its
    `data/models/...`, else the nearest folder above that holds one (an example's folder inside a
    checkout uses the checkout's model instead of converting a second copy), else the working
    folder's, where it is built on first use."""
    here = Path.cwd() if start is None else start
    for folder in [here, *here.resolve().parents]:
        if (folder / DEFAULT_MODEL_DIR / "config.json").is_file():
            return DEFAULT_MODEL_DIR if folder == here else folder / DEFAULT_MODEL_DIR
    return DEFAULT_MODEL_DIR


DEFAULT_MODEL = find_default_model()
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


class EngineConfig(_Strict):
    """The vLLM OpenAI server that `reef serve` starts and supervises."""

    port: int | None = Field(default=None, description="private loopback port; free port if unset")
    max_model_len: int | None = Field(
        default=None, description="vLLM --max-model-len; unset: the model's own (8192 for the embedded one)"
    )
    dtype: str | None = Field(default=None, description="vLLM --dtype; unset: the checkpoint's own dtype")
    kv_cache_gib: int = Field(default=2, ge=1)
    tcmalloc: bool = Field(default=True, description="on CPU, preload tcmalloc into vLLM when Debian's "
                           "libtcmalloc-minimal4 is installed (as vLLM's CPU guide advises)")
    enforce_eager: bool = False
    cpu_threads: int | None = Field(
        default=None, ge=1, description="on CPU, the engine's OpenMP threads (OMP_NUM_THREADS); unset: one core "
        "fewer than the machine has (at least 1), split among the replicas. An engine whose threads fill every "
        "core stalls whenever anything else runs (the gateway, a round's training): each step waits for the "
        "thread that lost its core (bench/engine_threads.py)")
    startup_timeout_s: float = 600.0
    enable_lora: bool = Field(default=True, description="serve LoRA releases as runtime-loaded adapters")
    replicas: int = Field(default=1, ge=1, description="vLLM engines of the model, each its own process group, "
                          "port and (on GPUs) share of the devices, balanced by the gateway with session "
                          "affinity; releases load into every one (reef.engine.fleet)")
    max_lora_rank: int = Field(default=16, ge=1)
    max_loras: int = Field(default=4, ge=1, description="adapters per batch; the head, the previous and a canary")
    tool_parser: str | None = Field(
        default="hermes",
        description="vLLM --tool-call-parser, with --enable-auto-tool-choice (clients send tools with "
        "tool_choice auto); the embedded model writes hermes-style <tool_call> JSON; null: no tool parsing",
    )
    chat_template: str | None = Field(
        default=None, description="vLLM --chat-template (a file or template text); unset: the model's own"
    )
    stream_interval: int = Field(
        default=1, ge=1, description="vLLM --stream-interval: tokens per streamed chunk. 1 sends each token as it "
        "is made; N buffers N per chunk, which cuts the engine's and the gateway's work per token (fewer events "
        "to parse, record and relay) at the cost of a burstier stream",
    )
    extra_args: list[str] = Field(default_factory=list, description="passed to vLLM as they are")


class UpstreamConfig(_Strict):
    """Any OpenAI-compatible server to record in front of, instead of a managed vLLM; or several
    (`urls`), balanced with session affinity (reef.gateway.transport.replicas)."""

    url: str | None = None
    urls: list[str] = Field(default_factory=list, description="several replicas of one model (issue 26), "
                            "balanced with session affinity; a release loads into every one before the head "
                            "moves, and each must read the gateway's artifact store at the same path")
    api_key: str | None = Field(default=None, description="sent to every replica")
    token_ids: Literal["auto", "on", "off"] = Field(
        default="auto", description="ask for vLLM's return_token_ids; auto: if GET /v1/models says vLLM serves"
    )
    health_interval_s: float = Field(default=1.0, gt=0, description="with several urls: how often a replica "
                                     "that failed is probed (GET /health) until it serves again")

    @model_validator(mode="after")
    def _one_list(self) -> UpstreamConfig:
        if self.url and self.urls and self.urls != [self.url]:
            raise ValueError("set url (one server) or urls (several), not both")
        if len(set(self.urls)) != len(self.urls):
            raise ValueError("urls names a replica twice")
        if len(self.urls) == 1:  # one replica is the one-upstream setup every code path knows
            self.url = self.urls[0]
        return self

    @property
    def replica_urls(self) -> list[str]:
        """Every upstream replica; empty: Reef starts its own engine."""
        return self.urls or ([self.url] if self.url else [])


class StoreConfig(_Strict):
    """The experience store: write-ahead log and parquet flusher."""

    fsync: bool = Field(default=True, description="fsync the WAL before acknowledging a record")
    flush_interval_s: float = Field(default=2.0, gt=0)
    flush_max_records: int = Field(default=5000, gt=0)
    partition: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="this gateway's own experience partition, for several gateways on one data_dir: its own WAL "
        "(wal/partitions/<partition>/) and shards (part-<partition>-<segment>.parquet); readers read every "
        "partition. Unset: the one-gateway layout",
    )


class StateConfig(_Strict):
    """Where what several gateways must share lives (issue 26): files under `data_dir` (the embedded
    default, one gateway), or PostgreSQL at `url`. Today the release chains with their
    compare-and-swap heads (reef.registry.chain_pg), reports' idempotency keys
    (reef.experience.report_keys_pg) and the consumed ledger (reef.recipe.ledger_pg) move there;
    the rest stays under data_dir."""

    url: str | None = Field(default=None, description="postgresql://user:password@host:port/db (needs the "
                            "`postgres` extra); unset: state in files under data_dir")
    poll_s: float = Field(default=1.0, gt=0, description="with url: how often this gateway reads every head, to "
                          "serve a release made through another gateway (reef.serving.follow)")


class LimitsConfig(_Strict):
    """What one client can make the gateway hold or create."""

    max_body_bytes: int = Field(default=8 << 20, ge=1024, description="larger request bodies get 413")
    max_header_bytes: int = Field(default=32 << 10, ge=1024, description="larger request headers get 431")
    allow_new_scenarios: bool = Field(
        default=True, description="false: only scenarios declared or already holding data or releases are served"
    )
    max_scenarios: int = Field(default=1000, ge=1, description="scenarios served at most; a new one past it: 403")
    default_max_tokens: int | None = Field(
        default=None, ge=1,
        description="completion tokens per choice for a chat that sets neither max_tokens nor max_completion_tokens "
                    "(None: the engine's default, up to its context length)",
    )
    allow_uncaptured: bool = Field(
        default=True, description="false: a call with `x-reef-capture: false` (serve it, record nothing) gets 403"
    )


class ApiKey(_Strict):
    """A data-plane key (`Authorization: Bearer <key>` on /v1/* and /reef/report, /reef/records)."""

    key: str = Field(min_length=8)
    name: str | None = Field(default=None, description="who holds it, for the log")
    scenarios: list[str] | None = Field(default=None, description="allowed scenarios; unset: all")


# Kept under its old name: a scenario's serve.yaml block is the public `reef.Scenario` type.
ScenarioConfig = Scenario


# serve.yaml's flat gate keys before `release.gate:`, and the GateSettings field each is now.
_FLAT_GATE_KEYS = {f"gate_{name}": name for name in ("samples", "confidence", "min_delta", "fault_retries",
                                                      "min_valid_pairs")}

_MOVED = {f"release.{old}": f"release.gate.{new}" for old, new in _FLAT_GATE_KEYS.items()}


class ReleaseConfig(_Strict):
    """The evaluation gate and hot-swap, for every scenario unless `scenarios.<name>` says otherwise."""

    policy: Policy = Field(default="approval", description="auto: a selected candidate is released at once")
    verify: Literal["tokens", "request"] = Field(
        default="tokens",
        description="after a swap, the canary request must reproduce the gate's greedy reply (tokens) or "
        "only succeed (request: for engines whose numerics differ from transformers')",
    )
    keep_adapters: int = Field(default=3, ge=2, description="LoRA adapters kept loaded (head, previous, ...)")
    gate: GateSettings = Field(default_factory=GateSettings, description="the learner's gate (reef.config.gate)")

    @model_validator(mode="before")
    @classmethod
    def _flat_gate_keys(cls, data: Any) -> Any:
        """`gate_samples: 4` (the flat keys before `gate:`) is `gate: {samples: 4}`, for one release more."""
        if isinstance(data, dict) and any(key in data for key in _FLAT_GATE_KEYS):
            data = dict(data)
            data["gate"] = move_keys(data, data.get("gate"), _FLAT_GATE_KEYS, "release.", "release.gate.")
        return data


class ServeConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8900, ge=0, le=65535)
    data_dir: Path = DEFAULT_DATA_DIR
    model: str | None = Field(
        default=None, description="HF model id or local path; unset: the embedded default, SmolLM2-135M-Instruct "
        "(built from its PyPI wheel on first use)"
    )
    served_model_name: str | None = Field(default=None, description="name clients use; default: model")
    seed: int = 0
    admin_token: str | None = None
    api_keys: list[ApiKey] = Field(
        default_factory=list, description="data-plane keys; none: /v1/* and /reef/report are open (bind loopback)"
    )
    report_wait_s: float = Field(
        default=30.0, ge=0, description="how long a report waits for a streaming record to be durable"
    )
    request_timeout_s: float = 600.0
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    release: ReleaseConfig = Field(default_factory=ReleaseConfig)
    recipes: dict[str, RecipeSpec] = Field(default_factory=dict, description="named recipe settings")
    scenarios: dict[str, Scenario] = Field(default_factory=dict, description="scenario declarations")
    _file: Path | None = PrivateAttr(default=None)  # the file this config was read from

    @property
    def config_file(self) -> Path | None:
        return self._file

    def scenario(self, name: str) -> Scenario:
        """The scenario as declared by packages and this config together (see reef.scenario)."""
        from reef.scenario.discovery import get_scenario

        return get_scenario(name, self)

    def policy(self, scenario: str) -> Policy:
        return self.scenario(scenario).policy or self.release.policy

    @property
    def model_path(self) -> str:
        return self.model or str(DEFAULT_MODEL)

    @property
    def model_name(self) -> str:
        return self.served_model_name or (self.model or DEFAULT_MODEL_NAME)


_SECRETS = {"admin_token", "upstream.api_key", "api_keys", "state.url"}  # state.url may hold a password
_WHOLE = {"scenarios", "recipes"}


class ConfigError(ValueError):
    """An invalid config; the message names the bad key."""


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        # `scenarios` and `recipes` are keyed by names, which may hold dots: one value, never split.
        if isinstance(value, Mapping) and value and dotted not in _WHOLE:
            out.update(_flatten(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`REEF_ENGINE__MAX_MODEL_LEN=2048` -> {"engine.max_model_len": 2048}; only known top-level keys."""
    fields = set(ServeConfig.model_fields)
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        if dotted.split(".")[0] in fields:
            out[dotted] = yaml.safe_load(raw) if raw else raw
    return out


def load_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys, got {type(data).__name__}")
    return _flatten(data)


def resolve(
    cli: Mapping[str, Any] | None = None,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[ServeConfig, dict[str, str]]:
    """Merge the layers and validate; returns the config and `{dotted key: source}`."""
    environ = os.environ if environ is None else environ
    layers: list[tuple[str, dict[str, Any]]] = [("env", env_overrides(environ))]
    if config_file is None and environ.get(CONFIG_FILE_ENV):
        config_file = Path(environ[CONFIG_FILE_ENV])
    if config_file is None and DEFAULT_CONFIG_FILE.exists():
        config_file = DEFAULT_CONFIG_FILE
    if config_file is not None:
        layers.append((f"file:{config_file}", load_file(config_file)))
    layers.append(("cli", {k: v for k, v in (cli or {}).items() if v is not None}))

    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, values in layers:
        for dotted, value in values.items():
            _set(merged, dotted, value)
            sources[_MOVED.get(dotted, dotted)] = source
    try:
        config = ServeConfig.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid config: {problems}") from exc
    if config_file is not None:
        config._file = Path(config_file).resolve()
        _anchor(config, config._file.parent)
    _check_recipes(config)
    _check_replicas(config)
    resolved = _flatten(config.model_dump(mode="json"))
    return config, {key: sources.get(key, "default") for key in resolved}


def _anchor(config: ServeConfig, folder: Path) -> None:
    """Scenarios declared in a file find their eval files and reward modules next to it."""
    for name, scenario in config.scenarios.items():
        update: dict[str, Any] = {"name": name}
        if scenario.base_dir is None:
            update["base_dir"] = folder
        config.scenarios[name] = scenario.model_copy(update=update)


def _check_recipes(config: ServeConfig) -> None:
    """Every recipe reference names something that exists: a `recipes:` entry, a built-in recipe or an
    importable module. Cheap (nothing is imported); the learner checks the params when it starts."""
    from reef.core.references import reference_problem

    for name, spec in config.recipes.items():
        problem = reference_problem(spec.recipe, _import_dirs(config))
        if problem:
            raise ConfigError(f"invalid config: recipes.{name}.recipe: {problem}")
    for name, scenario in config.scenarios.items():
        ref = scenario.recipe
        if ref is None or (isinstance(ref, str) and ref in config.recipes):
            continue
        ref = ref.recipe if isinstance(ref, RecipeSpec) else ref
        problem = reference_problem(ref, _import_dirs(config, scenario.base_dir))
        if problem:
            known = f"; recipes: declares {sorted(config.recipes)}" if config.recipes else ""
            raise ConfigError(f"invalid config: scenarios.{name}.recipe: {problem}{known}")


def _check_replicas(config: ServeConfig) -> None:
    """engine.replicas starts engines; with upstream.url(s) Reef starts none."""
    if config.engine.replicas > 1 and config.upstream.replica_urls:
        raise ConfigError("invalid config: engine.replicas: Reef starts no engine in front of upstream.url(s); "
                          "list every replica in upstream.urls instead")


def _import_dirs(config: ServeConfig, *extra: Path | None) -> list[Path]:
    """Where user modules (recipes, rewards) are imported from besides sys.path: the config's folder."""
    dirs = [d for d in extra if d is not None]
    if config.config_file is not None:
        dirs.append(config.config_file.parent)
    return dirs


def describe(config: ServeConfig, sources: Mapping[str, str]) -> str:
    """The resolved config as YAML lines, each with the layer it came from."""
    lines = []
    for key, value in _flatten(config.model_dump(mode="json")).items():
        if key in _SECRETS and value not in (None, []):
            value = "***"
        lines.append(f"{key}: {json.dumps(value)}  # {sources[key]}")
    return "\n".join(lines)
