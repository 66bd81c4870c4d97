"""The one definition of what the release package stores: artifact manifests and releases (with
their routing: how a release splits traffic between its content and a canary candidate).

A manifest is `<artifacts>/<content_id>/manifest.json`; a release is one line of
`<releases>/<scenario>/chain.jsonl`. Both are plain JSON (`model_dump_json()`), readable without Reef.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


class ReleaseLineage(BaseModel):
    """Where content came from: the JSON form of reef.recipe.spec.Lineage. Every field is optional
    (a base model has no snapshot or recipe) and unknown fields are kept, so a recipe adding one
    never makes its candidate unimportable."""

    model_config = ConfigDict(extra="allow", frozen=True)

    snapshot_id: str | None = None
    snapshot_hash: str | None = None
    recipe: str | None = None
    params: dict[str, Any] | None = None
    parent_release: str | None = None
    code_commit: str | None = None
    base_model: str | None = None
    base_model_sha256: str | None = None
    versions: dict[str, str] | None = None


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
    lineage: ReleaseLineage | None = None
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
    lineage: ReleaseLineage | None = None
    restores: str | None = None
    # The harness (prompts, rules, skills) served with the weights: a harness release changes only
    # this, a composite release both in one step. None: no harness (chains from before it).
    harness_id: str | None = Field(default=None, pattern=CONTENT_ID_PATTERN)
    harness_lineage: ReleaseLineage | None = None
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
