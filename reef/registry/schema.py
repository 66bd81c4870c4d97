"""The one definition of what the release package stores: candidates (a recipe's output folder),
artifact manifests and releases (with their routing: how a release splits traffic between its
content and a canary candidate), and the lineage all three carry.

A candidate is `<folder>/candidate.json` beside its weights or harness tree; a manifest is
`<artifacts>/<content_id>/manifest.json`; a release is one line of `<releases>/<scenario>/chain.jsonl`.
All are plain JSON, readable without Reef. `Candidate` is the only reader and writer of candidate.json.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reef.core.paths import CANDIDATE_FILE

ArtifactKind = Literal["lora", "full", "harness"]
# "route": the same content as the parent, with traffic split differently (a canary starts or ends).
Operation = Literal["create", "train", "promote", "rollback", "route"]

CONTENT_ID_PATTERN = r"^[0-9a-f]{64}$"
CONTENT_ID_RE = re.compile(CONTENT_ID_PATTERN)
# Must accept exactly what reef.experience.shards.SCENARIO_RE accepts (a test pins that): the chain
# lives at `<data_dir>/releases/<scenario>/`, where reef.experience.load looks for HEAD. Not
# imported from there because reef.experience pulls in datasets and polars.
SCENARIO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Same format reef.experience.load.RELEASE_SEQ_RE parses staleness from.
RELEASE_ID_RE = re.compile(r"^(?P<scenario>.+)@r(?P<seq>\d+)$")


def validate_scenario(scenario: str) -> str:
    if not SCENARIO_RE.match(scenario):
        raise ValueError(f"scenario {scenario!r} must match {SCENARIO_RE.pattern}")
    return scenario


# The engine serves a LoRA release under a name made of its content id: a name never means two
# weights (peers report stale adapters on same-name reloads). Clients never see or use these names.
ADAPTER_PREFIX = "reef-release-"


def adapter_name(content_id: str) -> str:
    return f"{ADAPTER_PREFIX}{content_id[:16]}"


def release_name(scenario: str, seq: int) -> str:
    """`<scenario>@r<seq>`: the release id, what records carry and HEAD holds."""
    return f"{scenario}@r{seq}"


def canary_label(scenario: str, content_id: str) -> str:
    """What records answered by a canary arm carry as their release: `<scenario>@canary-<id12>`."""
    return f"{scenario}@canary-{content_id[:12]}"


class Lineage(BaseModel):
    """Where content came from: enough to reproduce it or to refuse to release it. A recipe fills
    every field (`base_model_sha256` and `parent_harness` may be None); the registry keeps what a
    candidate, a base model or a hand-made folder gives, so every field is optional and unknown
    fields are kept (a recipe adding one never makes its candidate unimportable)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    snapshot_id: str | None = None
    snapshot_hash: str | None = None
    recipe: str | None = None  # "module:Class"
    params: dict[str, Any] | None = None
    parent_release: str | None = None  # the release serving the scenario when the snapshot was taken
    code_commit: str | None = None  # git HEAD, "+dirty" when the work tree differs; "unknown" outside git
    base_model: str | None = None
    base_model_sha256: str | None = None
    versions: dict[str, str] | None = None
    # A harness candidate's: the content id of the harness its mutations were applied to (None: none).
    parent_harness: str | None = None

    def given(self) -> Lineage | None:
        """Itself, or None when it was read from nothing (no lineage, or an empty one)."""
        return self if self.model_fields_set or self.model_extra else None


class Candidate(BaseModel):
    """A recipe's output folder (`path`): weights, a LoRA adapter or a harness tree, beside its
    candidate.json. A recipe fills every field; a hand-made folder's candidate.json may give only
    its kind and scenario (the registry infers the rest), so the others have defaults."""

    model_config = ConfigDict(extra="allow", frozen=True)

    path: Path  # the folder; read from wherever it is now, not from the file
    id: str | None = None  # the recipe's own id, `<scenario>-<hash>` (the registry's is the content id)
    kind: ArtifactKind | None = None  # None: the registry tells an adapter by its adapter_config.json
    scenario: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    lineage: Lineage = Field(default_factory=Lineage)
    created_at: str | None = None
    # Per-step training metrics (loss, reward, kl, grad_norm, learning_rate, ...), one dict per step.
    training_log: list[dict[str, Any]] = Field(default_factory=list)
    # A harness candidate's changes to its parent harness (reef.recipe.harness_recipe.Mutation, as dicts).
    mutations: list[dict[str, Any]] = Field(default_factory=list)

    @classmethod
    def read(cls, folder: Path | str) -> Candidate:
        """The candidate in `folder`; FileNotFoundError when it holds no candidate.json."""
        data = json.loads((Path(folder) / CANDIDATE_FILE).read_text())
        return cls.model_validate({**data, "path": Path(folder)})

    @classmethod
    def read_if_any(cls, folder: Path | str) -> Candidate | None:
        """The candidate in `folder`, or None for a folder without candidate.json (a model folder)."""
        return cls.read(folder) if (Path(folder) / CANDIDATE_FILE).is_file() else None

    def to_json(self) -> dict[str, Any]:
        return {**self.model_dump(), "path": str(self.path)}

    def write(self, into: Path | None = None) -> Path:
        """Write candidate.json into `into` (a staging folder) or the candidate's own folder."""
        target = (into or self.path) / CANDIDATE_FILE
        target.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return target

    def weights(self) -> tuple[Path, Path | None]:
        """What to load, (model, adapter): a LoRA candidate runs on the base model its lineage
        names, with its own folder as the adapter; any other candidate is the model itself."""
        if self.kind != "lora":
            return self.path, None
        if self.lineage.base_model is None:
            raise ValueError(f"{self.path}: a LoRA candidate whose lineage names no base model")
        return Path(self.lineage.base_model), self.path

    @classmethod
    def weights_of(cls, folder: Path | str) -> tuple[Path, Path | None]:
        """`weights()` of the candidate in `folder`; a plain model folder is the model itself."""
        candidate = cls.read_if_any(folder)
        return candidate.weights() if candidate is not None else (Path(folder), None)


class ArtifactFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str  # relative, '/'-separated
    sha256: str
    size: int


class ArtifactManifest(BaseModel):
    """What `<artifacts>/<content_id>/files/` must hold, and where it came from."""

    model_config = ConfigDict(frozen=True)

    format: int = 1
    content_id: str = Field(pattern=CONTENT_ID_PATTERN)
    kind: ArtifactKind
    # The model the content runs on: itself for a full model, the adapter's base for a LoRA.
    base_model: str | None = None
    base_model_sha256: str | None = None
    # Digests of what turns messages into tokens; a LoRA takes its base model's, so a swap can
    # refuse an adapter whose base serves with another tokenizer or template.
    tokenizer_sha256: str | None = None
    chat_template_sha256: str | None = None
    files: list[ArtifactFile]
    lineage: Lineage | None = None
    source: str | None = None  # the folder it was first imported from, for people
    created_at: datetime

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


class RoutingArm(BaseModel):
    """One arm of a routing release: which weights answer what share of the scenario's requests.
    The head arm is the release's own content (its records carry the release id); a candidate arm
    is a LoRA candidate (its records carry `label`)."""

    model_config = ConfigDict(frozen=True)

    arm: Literal["head", "candidate"]
    content_id: str = Field(pattern=CONTENT_ID_PATTERN)
    kind: ArtifactKind
    share: float = Field(gt=0, le=1)
    label: str | None = None  # the release id its records carry; None: the release's own id (the head arm)


class Routing(BaseModel):
    """How a release splits its scenario's traffic. A release without one sends everything to its
    content; with one, the head arm (the release's `content_id`) and a candidate arm share it."""

    model_config = ConfigDict(frozen=True)

    arms: list[RoutingArm] = Field(min_length=2, max_length=2)

    @model_validator(mode="after")
    def _one_head_and_shares_sum_to_one(self) -> Routing:
        if sorted(a.arm for a in self.arms) != ["candidate", "head"]:
            raise ValueError("a routing names one head arm and one candidate arm")
        if abs(sum(a.share for a in self.arms) - 1.0) > 1e-9:
            raise ValueError(f"arm shares must sum to 1, not {sum(a.share for a in self.arms)}")
        return self

    def arm(self, name: str) -> RoutingArm:
        return next(a for a in self.arms if a.arm == name)

    @classmethod
    def canary(cls, scenario: str, head_content: str, head_kind: ArtifactKind, candidate: str,
               fraction: float) -> Routing:
        return cls(arms=[
            RoutingArm(arm="head", content_id=head_content, kind=head_kind, share=round(1.0 - fraction, 12)),
            RoutingArm(arm="candidate", content_id=candidate, kind="lora", share=fraction,
                       label=canary_label(scenario, candidate)),
        ])


class Release(BaseModel):
    """One link of a scenario's release chain. Never edited once written: a rollback is a new
    release (operation "rollback", `restores` naming the release whose content it serves again)."""

    model_config = ConfigDict(frozen=True)

    release_id: str
    scenario: str
    seq: int = Field(ge=0)
    parent_release_id: str | None
    content_id: str = Field(pattern=CONTENT_ID_PATTERN)
    kind: ArtifactKind
    operation: Operation
    evaluation: dict[str, Any] | None = None
    approved_by: str | None = None
    created_at: datetime
    lineage: Lineage | None = None
    restores: str | None = None
    # The harness (prompts, rules, skills) served with the weights: a harness release changes only
    # this, a composite release both in one step. None: no harness (chains from before it).
    harness_id: str | None = Field(default=None, pattern=CONTENT_ID_PATTERN)
    harness_lineage: Lineage | None = None
    # A traffic split (a canary), restored by a restart or a rollback like the content is. None: the
    # content answers every request.
    routing: Routing | None = None

    @model_validator(mode="after")
    def _head_arm_is_the_content(self) -> Release:
        if self.routing is not None and self.routing.arm("head").content_id != self.content_id:
            raise ValueError("a routing's head arm must serve the release's content_id")
        return self

    def split(self) -> RoutingArm | None:
        """The candidate arm, when this release splits traffic."""
        return self.routing.arm("candidate") if self.routing is not None else None

    def serves(self) -> tuple[str, str | None]:
        """What the head arm answers with (every request, without a split): (weights content id,
        harness content id). What the gate compares a candidate with."""
        return self.content_id, self.harness_id

    def traffic(self) -> tuple[str, str | None, Routing | None]:
        """Everything that decides who answers a request: the content and the split."""
        return self.content_id, self.harness_id, self.routing
