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
    # Padded tokens one micro-batch may hold (its size x the longest example). A step's peak memory
    # is its logits (tokens x vocabulary x 4 bytes, several copies in the loss), so a round of long
    # agent turns beside an engine could be OOM-killed at a batch size that suits short replies.
    # Above it the micro-batch shrinks and gradient accumulation grows, the effective batch kept.
    # None: per_device_batch_size as given.
    max_batch_tokens: int | None = 1024
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

    def micro_batch(self, longest: int) -> tuple[int, int]:
        """(per-device batch size, gradient accumulation steps) for examples of at most `longest`
        tokens: the largest divisor of the effective batch whose padded micro-batch fits
        `max_batch_tokens`, so the effective batch (and so the learning) is the one configured."""
        size, accumulate = self.per_device_batch_size, self.gradient_accumulation_steps
        if self.max_batch_tokens is None or size * longest <= self.max_batch_tokens:
            return size, accumulate
        effective = size * accumulate
        fits = max(1, self.max_batch_tokens // longest)
        micro = max(d for d in range(1, min(size, fits) + 1) if effective % d == 0)
        return micro, effective // micro

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
