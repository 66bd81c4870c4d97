"""What a learning round does, planned apart from running it: the light half the server's learner
imports. The round itself (reef.learn.round) runs in its own process and pulls in the trainers.

A `RoundPlan` says what a round does: which scenario, which recipe with which params, where the
experience is read from, where the snapshot and candidate go, and whether training continues from
the scenario's head. `plan_round` builds it from a recipe setting (a `RecipeSpec`): serve.yaml's
(`plan_for_scenario`, the learner) or params.yaml's `train` (reef.learn.pipeline, the DVC stages and the CLI).

The learner starts a round only on enough signal (`Thresholds`, from `learner.min_*` and the recipe
setting's, `thresholds`): eligible new records (what the snapshot would take), and of the eligible
ones rewarded and unrewarded records (reef.learn.pending); a plan that carries them (`wait_for`) is
checked again by the round itself, which returns `waiting` with the reason instead of starting.

The two messages across the process boundary: the learner writes a `RoundRequest` (the plan, the
gate's settings, the engine to sample through, the server's config file; or, with `regate`, only a
candidate to gate again) as the round process's one input, and reads back the `RoundResult` it
writes (`python -m reef.learn.round --request request.json --out result.json`); `run_round` returns
the same `RoundResult` in-process.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reef.config import DEFAULT_MODEL, GateSettings, ServeConfig
from reef.config.learner import AccelerateSettings
from reef.core.paths import DEFAULT_DATA_DIR, DataDir
from reef.learn.round_log import RoundState
from reef.recipe.loading import load_recipe
from reef.registry.candidates import GateResult
from reef.registry.schema import Candidate
from reef.sampling.engine import EngineEndpoint
from reef.scenario.schema import RecipeSpec

if TYPE_CHECKING:
    from reef.recipe.base import Recipe

COUNTS = ("rewarded", "unrewarded", "records")  # the signal a round waits for, in the order a reason names it


class Thresholds(BaseModel):
    """What a learner round waits for: eligible new records (those its snapshot would take, were it
    not capped by `batch_size`: `eligible` in the counts) and, of the eligible ones, rewarded and
    unrewarded records (`signal`). 0: not waited for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    records: int = Field(default=1, ge=1)
    rewarded: int = Field(default=0, ge=0)
    unrewarded: int = Field(default=0, ge=0)

    def shortfall(self, counts: Mapping[str, int]) -> str | None:
        """None when every count reached its threshold; else why a round waits, every count named,
        e.g. `waiting: 3 of 4 rewarded, 12 of 4 unrewarded, 15 of 16 records`."""
        have = {**counts, "records": counts.get("eligible", counts.get("records", 0))}
        wanted = [(name, getattr(self, name)) for name in COUNTS if getattr(self, name) > 0]
        if all(have.get(name, 0) >= n for name, n in wanted):
            return None
        return "waiting: " + ", ".join(f"{have.get(name, 0)} of {n} {name}" for name, n in wanted)


class RoundPlan(BaseModel):
    """What one round does; JSON, so the learner can hand it to the round's process."""

    model_config = ConfigDict(extra="forbid")

    scenario: str
    recipe: str = Field(description="a built-in name or module:Class")
    params: dict[str, Any] = Field(default_factory=dict, description="the recipe config's fields")
    base_model: str = str(DEFAULT_MODEL)
    experience_dir: Path = Field(default=DEFAULT_DATA_DIR, description="where the scenario's experience is read")
    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="releases, candidates register and artifacts")
    ledger_root: Path = DataDir().ledger
    snapshot_dir: Path | None = Field(default=None, description="a fixed folder; None: content-hashed")
    snapshot_root: Path = DataDir().snapshots()
    candidate_dir: Path | None = Field(default=None, description="a fixed folder; None: <candidate_root>/<id>")
    candidate_root: Path = DataDir().candidates()
    continue_from_head: bool = True
    import_dirs: list[Path] = Field(default_factory=list, description="folders user recipe modules live in")
    wait_for: Thresholds | None = Field(default=None, description="the round starts only on this much signal "
                                        "(the learner's); None: on any eligible record")

    def recipe_params(self) -> dict[str, Any]:
        return {"base_model": self.base_model, **self.params, "scenario": self.scenario}

    def load_recipe(self) -> Recipe:
        return load_recipe(self.recipe, self.recipe_params(), extra=self.import_dirs)


class RoundRequest(BaseModel):
    """The round process's one input, written by the learner: what to run, and with what."""

    model_config = ConfigDict(extra="forbid")

    plan: RoundPlan
    gate: GateSettings = Field(default_factory=GateSettings, description="serve.yaml's release.gate")
    engine: EngineEndpoint | None = Field(default=None, description="the serving vLLM (not the gateway): the gate "
                                          "samples a LoRA candidate through it, recipes that ask a model use it")
    config_file: Path | None = Field(default=None, description="the server's serve.yaml: the gate and the recipe "
                                     "find the scenario (its eval suite, its rewards) as the server declared it")
    regate: str | None = Field(default=None, description="a registered candidate id: no round, only this candidate "
                               "gated again (the learner's retry of a void gate); the result's status is `regated`")
    launcher: AccelerateSettings | None = Field(default=None, description="train through accelerate, several "
                                                "processes (learner.launcher: accelerate; reef.learn.launch); "
                                                "None: in the round process")
    warm: bool = Field(default=False, description="no round: the head's replies to the eval suite sampled and kept "
                       "for the next gate (reef.gate.warm); the result's status is `warmed`, its metrics say how far")


RoundStatus = Literal["trained", "nothing_new", "waiting", "busy", "regated", "warmed"]


class RoundResult(BaseModel):
    """What a round did: `run_round`'s answer, and the round process's one output (the learner
    validates it, and appends it to `learner/rounds.jsonl`)."""

    model_config = ConfigDict(extra="forbid")

    status: RoundStatus = Field(description="trained: a candidate was made (and gated, when the round gates); "
                                "nothing_new: no record to learn from; waiting: less signal than the plan waits "
                                "for; busy: another process runs this scenario's round; regated: no round, the "
                                "request's candidate was gated again; warmed: no round, the next gate's head replies "
                                "were sampled")
    scenario: str
    reason: str | None = Field(default=None, description="why it waits, found nothing new, or was busy")
    pending: dict[str, int] | None = Field(default=None, description="what the snapshot would take, why the others "
                                           "are left out, and the signal (reef.learn.pending); None: a resumed round")
    round: str | None = Field(default=None, description="the round's id in the scenario's round log")
    round_state: RoundState | None = None
    resumed_from: RoundState | None = Field(default=None, description="where an earlier process left the round")
    snapshot: str | None = None
    candidate: Candidate | None = Field(default=None, description="the candidate the round trained")
    candidate_id: str | None = Field(default=None, description="the registered candidate; None: not gated")
    metrics: dict[str, Any] | None = Field(default=None, description="the candidate's training metrics")
    gate: GateResult | None = Field(default=None, description="the gate's decision and numbers, without the "
                                    "per-prompt outputs")


def plan_round(scenario: str, spec: RecipeSpec, *, base_model: str, data_dir: Path, experience_dir: Path | None = None,
               ledger_root: Path | None = None, fixed: bool = True, continue_from_head: bool = True,
               import_dirs: list[Path] | None = None) -> RoundPlan:
    """The round of `spec` for `scenario`; the one planner, for the learner and the pipeline alike.
    Its folders live in `data_dir`: `snapshots/<s>/` and `candidates/<s>/` when `fixed`, else
    content-hashed ones beside them; the experience is read from `experience_dir` (default: `data_dir`)
    and consumed ids kept in `ledger_root` (default: `ledger/`). `base_model` unless the spec names one."""
    params = spec.recipe_params()
    base = str(params.pop("base_model", None) or base_model)
    layout = DataDir(data_dir)
    return RoundPlan(
        scenario=scenario, recipe=spec.recipe, params=params, base_model=base,
        experience_dir=experience_dir or data_dir, data_dir=data_dir, ledger_root=ledger_root or layout.ledger,
        snapshot_dir=layout.snapshots(scenario) if fixed else None, snapshot_root=layout.snapshots(),
        candidate_dir=layout.candidates(scenario) if fixed else None, candidate_root=layout.candidates(),
        continue_from_head=continue_from_head, import_dirs=import_dirs or [],
    )


def plan_for_scenario(config: ServeConfig, scenario: str) -> RoundPlan | None:
    """The learner's round for a scenario declared in serve.yaml (or by a package); None without a recipe.
    Everything lives in the server's data dir; a user's recipe module may sit next to serve.yaml."""
    spec = config.scenario(scenario).recipe_spec(config.recipes)
    if spec is None:
        return None
    dirs = [config.config_file.parent] if config.config_file else []
    return plan_round(scenario, spec, base_model=config.model_path, data_dir=Path(config.data_dir).resolve(),
                      import_dirs=dirs)


def thresholds(config: ServeConfig, scenario: str, recipe: Recipe | None = None) -> Thresholds:
    """What the learner's round for `scenario` waits for: each count's recipe setting (`min_records`,
    `min_rewarded`, `min_unrewarded` of `recipes.<name>`), else the learner's, for the counts the
    recipe learns from (`Recipe.waits_for`; a count it does not is 0 unless its setting names it).

    A recipe that learns from its rewarded records only (rft: every eligible record is one) waits for
    `min_rewarded` of them where no one set `min_records`: the learner's default of 16 records would
    be 16 rewarded replies, minutes of traffic at a 2 % success rate, while a small model learns a
    format from a handful and the gate judges what it learned."""
    spec = config.scenario(scenario).recipe_spec(config.recipes)
    waits = recipe.waits_for if recipe is not None else frozenset(COUNTS)

    def pick(name: str) -> int:
        own: int | None = getattr(spec, f"min_{name}") if spec is not None else None
        if own is not None:
            return own
        return int(getattr(config.learner, f"min_{name}")) if name in waits or name == "records" else 0

    records, rewarded = pick("records"), pick("rewarded")
    rewarded_only = (recipe is not None and recipe.success_threshold() is not None
                     and "rewarded" in waits and "unrewarded" not in waits)
    if rewarded_only and rewarded > 0 and (spec is None or spec.min_records is None) \
            and "min_records" not in config.learner.model_fields_set:
        records = min(records, rewarded)
    return Thresholds(records=records, rewarded=rewarded, unrewarded=pick("unrewarded"))


def min_records(config: ServeConfig, scenario: str) -> int:
    """Eligible records that start a learner round: the recipe's `min_records`, else the learner's."""
    return thresholds(config, scenario).records
