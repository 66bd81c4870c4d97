"""The typed pieces a recipe is made of: what experience it takes (`ExperienceSpec`), how it trains
(`RecipeConfig`), and what it returns (`Candidate`, with its `Lineage`)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from reef.core.paths import CANDIDATE_FILE

StalePolicy = Literal["drop", "downweight"]
CandidateKind = Literal["full", "lora", "harness"]


@dataclass(frozen=True)
class ExperienceSpec:
    """Which records of a scenario a round trains on; `Snapshot.create` applies it.

    `group_by`: None, "prompt" (identical recorded prompt token ids), "tag:<name>" (a request tag,
    e.g. "tag:task_id"), "scenario" (all records one group) or "session" (a session's turns, so
    `min_group_size: 2` takes sessions of two turns or more, whole). Agent turns each have their own
    prompt, so RL over sessions groups by a task tag or the scenario, never by prompt.
    `corrections`: a record below `min_score` is still taken when its report carries a `correction`
    (the reply that was wanted), for recipes that train on that instead. `batch_size` caps the
    samples (choices) per round, newest first, whole groups at a time. Records beyond
    `max_staleness` releases behind the head are dropped or kept with weight
    `stale_weight ** (staleness - max_staleness)`, per `stale_policy`.
    """

    scenario: str
    needs_reports: bool = True
    group_by: str | None = None
    min_group_size: int = 1
    max_staleness: int | None = None
    stale_policy: StalePolicy = "drop"
    stale_weight: float = 0.5
    batch_size: int | None = None
    min_score: float | None = None
    drop_duplicates: bool = True
    # Records below min_score whose report carries a correction are kept too (rft trains on the
    # correction instead of the reply).
    corrections: bool = False

    def __post_init__(self) -> None:
        named = self.group_by in (None, "prompt", "scenario", "session")
        if not named and not (self.group_by or "").startswith("tag:"):
            raise ValueError(f"group_by must be None, 'prompt', 'scenario', 'session' or 'tag:<name>', "
                             f"got {self.group_by!r}")
        if self.stale_policy not in ("drop", "downweight"):
            raise ValueError(f"stale_policy must be 'drop' or 'downweight', got {self.stale_policy!r}")
        if not 0.0 <= self.stale_weight <= 1.0:
            raise ValueError(f"stale_weight must be in [0, 1], got {self.stale_weight}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.corrections:  # unset, it leaves the content hashes of earlier snapshots as they were
            del out["corrections"]
        return out


@dataclass
class RecipeConfig:
    """Fields every recipe has; a recipe subclasses it with its own fields and defaults.

    The experience fields feed `Recipe.experience()`; the rest configure training.
    """

    # --- experience
    scenario: str = "demo-add"
    max_staleness: int | None = None
    stale_policy: StalePolicy = "drop"
    stale_weight: float = 0.5
    batch_size: int | None = None  # samples per round (see ExperienceSpec)
    min_score: float | None = None
    group_by: str | None = None
    drop_duplicates: bool = True
    # --- training
    base_model: str = "data/models/tiny"
    kind: CandidateKind = "full"
    seed: int = 0
    max_steps: int = 50
    epochs: float = 1.0  # used when max_steps <= 0
    learning_rate: float = 1e-4
    per_device_batch_size: int = 16
    gradient_accumulation_steps: int = 1
    max_length: int = 1024
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # A LoRA adapter on the same base (the head release's) to continue training, instead of a fresh
    # one; its own rank, alpha and target modules then apply, not the lora_* fields above.
    init_adapter: str | None = None

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> RecipeConfig:
        """Typed construction from params.yaml values: an unknown key is an error naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"{cls.__name__} has no parameter(s) {unknown}; known: {sorted(known)}")
        return cls(**params)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Lineage:
    """Where a candidate came from: enough to reproduce it or to refuse to release it."""

    snapshot_id: str
    snapshot_hash: str
    recipe: str  # "module:Class"
    params: dict[str, Any]
    parent_release: str  # the release serving the scenario when the snapshot was taken
    code_commit: str  # git HEAD, "+dirty" when the work tree differs; "unknown" outside git
    base_model: str
    base_model_sha256: str | None
    versions: dict[str, str]
    # A harness candidate's: the content id of the harness its mutations were applied to (None: none).
    parent_harness: str | None = None


@dataclass(frozen=True)
class Candidate:
    id: str
    path: Path
    kind: CandidateKind
    scenario: str
    metrics: dict[str, Any]
    lineage: Lineage
    created_at: str
    # Per-step training metrics (loss, reward, kl, grad_norm, learning_rate, ...), one dict per step.
    training_log: list[dict[str, Any]] = field(default_factory=list)
    # A harness candidate's changes to its parent harness (reef.recipe.harness_recipe.Mutation, as dicts).
    mutations: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["path"] = str(self.path)
        return out

    def write(self, into: Path | None = None) -> Path:
        """Write candidate.json into `into` (a staging folder) or the candidate's own folder."""
        target = (into or self.path) / CANDIDATE_FILE
        target.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return target

    @classmethod
    def read(cls, path: Path | str) -> Candidate:
        data = json.loads((Path(path) / CANDIDATE_FILE).read_text())
        data["path"] = Path(path)
        data["lineage"] = Lineage(**data["lineage"])
        return cls(**data)


def git_commit(cwd: Path | str = ".") -> str:
    """HEAD of the repository at `cwd` (the project whose recipes and params ran), suffixed
    "+dirty" when tracked files differ from it; "unknown" outside a git repository."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
