"""`RecipeConfig`: the fields every recipe's config has, how its experience is chosen and how it
trains; a recipe subclasses it with its own fields and defaults (as TRL's `*Config` beside its
trainer). params.yaml values become one through `from_dict`."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from reef.config.serve import DEFAULT_MODEL
from reef.registry.schema import ArtifactKind
from reef.scenario.schema import StalePolicy


@dataclass
class RecipeConfig:
    """Fields every recipe has; a recipe subclasses it with its own fields and defaults.

    The experience fields feed `Recipe.experience()`; the rest configure training.
    """

    # --- experience
    scenario: str  # the declared scenario it learns for (its tasks, reward, eval suite): no default
    max_staleness: int | None = None
    stale_policy: StalePolicy = "drop"
    stale_weight: float = 0.5
    batch_size: int | None = None  # samples per round (see ExperienceSpec)
    min_score: float | None = None
    group_by: str | None = None
    drop_duplicates: bool = True
    # --- training
    base_model: str = str(DEFAULT_MODEL)
    kind: ArtifactKind = "full"
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
        if "scenario" not in params:
            raise ValueError(f"{cls.__name__} needs `scenario`: the name of the scenario it learns for")
        return cls(**params)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
