"""Harness recipes: a recipe that improves the harness (system prompt, rules, skills, few-shot examples)
instead of the weights. The framework part: reading the head's harness, the low-reward experience
and its feedback from the snapshot, applying the proposed mutations, writing the candidate folder,
lineage and the consumed ledger (unless `consume: false`). A recipe only implements `propose()` (see
recipes/harness_evolve); few-shot examples are mined by reef.recipe.shots.

The candidate folder (what `HarnessRecipe.run` writes, `CandidateRegistry.register` imports, the
gate evaluates and the dashboard shows) is the WHOLE harness tree after the mutations, at the
folder's root, laid out as reef.registry.harness describes, plus candidate.json (not content; its
type is reef.registry.schema.Candidate):

    <candidate>/system.md, rules.md, skills/<name>/SKILL.md, examples/...   the new harness tree
    <candidate>/candidate.json
        {"kind": "harness", "id": "<scenario>-<hash12>", "scenario", "created_at", "path",
         "metrics": {"failures": N, "records": N, "mutations": N, "rewarded": N, "proposer": "..."},
         "mutations": [{"op": "create|update|remove", "path": "rules.md", "reason": "...",
                        "content": "<new text>" | null}],
         "lineage": {"snapshot_id", "snapshot_hash", "recipe", "params", "parent_release",
                     "parent_harness": "<content id of the harness it mutated>" | null,
                     "code_commit", "base_model", "base_model_sha256": null, "versions"},
         "training_log": []}

`parent_harness` is the content id of the harness the mutations were applied to (the head's at
snapshot time; null when the head served none), so a diff is `parent_harness` -> this candidate.
Registered, its candidate id is the tree's content id; the gate (reef.gate.evaluate) compares it
with the head on the scenario's eval suite, the head's weights answering both arms, each eval
prompt sent with its arm's harness applied the way the scenario serves it (`harness.inject`).
"""

from __future__ import annotations

import shutil
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.core.durable import replace_dir
from reef.core.paths import CANDIDATE_FILE
from reef.recipe import ledger
from reef.recipe.base import DEFAULT_CANDIDATES, Recipe, _versions, git_commit
from reef.recipe.config import RecipeConfig
from reef.recipe.shots import Rewarded, rewarded_replies
from reef.recipe.snapshot import EmptySnapshotError, Snapshot
from reef.registry.schema import Candidate, Lineage

CANDIDATE_KIND: Literal["harness"] = "harness"


class NothingToProposeError(EmptySnapshotError):
    """The proposer found nothing to change: no candidate (a round reports `nothing_new`)."""


class Mutation(BaseModel):
    """One change to a harness tree: create or update a file with `content`, or remove it."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["create", "update", "remove"]
    path: str = Field(description="relative, '/'-separated: system.md, rules.md, skills/<name>/SKILL.md, examples/...")
    content: str | None = None
    reason: str = ""

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise ValueError(f"{path!r} is not a relative path inside the harness")
        if path == CANDIDATE_FILE:
            raise ValueError(f"{CANDIDATE_FILE} is the candidate's metadata, not a harness file")
        return path


def apply_mutations(files: dict[str, str], mutations: list[Mutation]) -> dict[str, str]:
    """`files` with `mutations` applied in order; raises ValueError on one that does not fit
    (create of an existing file, update or remove of a missing one, no content)."""
    out = dict(files)
    for m in mutations:
        exists = m.path in out
        if m.op == "remove":
            if not exists:
                raise ValueError(f"remove {m.path}: no such file in the harness")
            del out[m.path]
            continue
        if m.content is None:
            raise ValueError(f"{m.op} {m.path}: no content")
        if (m.op == "create") == exists:
            raise ValueError(f"{m.op} {m.path}: the file {'exists' if exists else 'does not exist'}")
        out[m.path] = m.content if m.content.endswith("\n") else m.content + "\n"
    return out


@dataclass(frozen=True)
class Failure:
    """A low-reward reply: what the model was sent, what it said, the score, the feedback and the
    correction (the reply wanted) its report gave."""

    record_id: str
    messages: list[dict[str, Any]]  # as served (the harness applied)
    reply: str
    score: float
    feedback: str | None
    correction: str | None = None


@dataclass(frozen=True)
class ProposalContext:
    """What a proposer sees: the head's harness files, the snapshot's failures, its rewarded replies
    (reef.recipe.shots: what few-shot examples are made of) and its size."""

    scenario: str
    files: dict[str, str]
    harness_id: str | None
    failures: list[Failure]
    records: int
    inject: str
    rewarded: list[Rewarded] = field(default_factory=list)


@dataclass
class HarnessConfig(RecipeConfig):
    # Every reported record is read (a harness learns from what went wrong as much as from what went right).
    min_score: float | None = None
    failure_below: float = 0.5  # a record whose score is below this is a failure
    drop_duplicates: bool = False  # a repeated failure is evidence (how often feedback recurs), not noise
    max_steps: int = 0  # unused: nothing is trained
    # False: the snapshot's records stay unconsumed, for the scenario's own recipe to train on (the
    # learner's harness rung reads the few rewarded replies a first training round still waits for).
    consume: bool = True


def head_harness(snapshot: Snapshot) -> tuple[str | None, dict[str, str]]:
    """(content id, files) of the harness the snapshot's head release served; (None, {}) for none."""
    from reef.registry.artifacts import ArtifactStore
    from reef.registry.harness import load_harness
    from reef.registry.state import ReleaseState

    data_dir = snapshot.data_dir
    state = ReleaseState(data_dir)
    if not state.has_chain(snapshot.scenario):
        return None, {}
    store = ArtifactStore.for_data_dir(data_dir)
    release = state.chain(snapshot.scenario, artifacts=store).get(snapshot.head_release)
    if release.harness_id is None:
        return None, {}
    return release.harness_id, dict(load_harness(store, release.harness_id).files)


def failures(frame: pl.DataFrame, below: float) -> list[Failure]:
    """The snapshot's reported records scoring below `below`, one per recorded choice, oldest first."""
    if "correction" not in frame.columns:  # a snapshot taken before reports had corrections
        frame = frame.with_columns(correction=pl.lit(None, pl.String))
    rows = frame.filter(pl.col("score").is_not_null() & (pl.col("score") < below)).select(
        "record_id", "messages", "choices", "score", "feedback", "correction").to_dicts()
    out = []
    for row in rows:
        messages = [{"role": m["role"], "content": m.get("content") or ""} for m in row["messages"] or ()]
        for choice in row["choices"] or ():
            out.append(Failure(row["record_id"], messages, choice.get("content") or "", float(row["score"]),
                               row["feedback"], row["correction"]))
    return out


class HarnessRecipe(Recipe):
    """Base class of recipes whose candidate is a harness tree; subclasses implement `propose()`."""

    config_class: ClassVar[type[RecipeConfig]] = HarnessConfig
    produces: ClassVar[str] = CANDIDATE_KIND
    # A harness learns from what went wrong: a round waits for failures, not for successes.
    waits_for: ClassVar[frozenset[str]] = frozenset({"records", "unrewarded"})

    def success_threshold(self) -> float | None:
        config = self.config
        assert isinstance(config, HarnessConfig)
        return config.failure_below

    def propose(self, context: ProposalContext) -> list[Mutation]:
        raise NotImplementedError

    def proposer_name(self) -> str:
        return type(self).__name__

    def run(self, snapshot: Snapshot | Path | str, out_root: Path | str = DEFAULT_CANDIDATES, *,
            out_dir: Path | str | None = None, progress: bool = True, consume: bool = True) -> Candidate:
        """Propose mutations of the head's harness from `snapshot` and write the candidate folder."""
        snap = snapshot if isinstance(snapshot, Snapshot) else Snapshot.open(snapshot)
        if snap.spec != self.experience():
            raise ValueError(f"snapshot {snap.id} was taken with {snap.spec}, but {self.name} declares "
                             f"{self.experience()}; take a snapshot with recipe.experience()")
        if not snap.record_ids:
            raise EmptySnapshotError(f"snapshot {snap.id} has no records")
        ledger.check_unconsumed(snap.ledger_root, snap.scenario, snap.hash, snap.record_ids)
        parent_id, files = head_harness(snap)
        config = self.config
        assert isinstance(config, HarnessConfig)
        frame = snap.frame()
        context = ProposalContext(scenario=snap.scenario, files=files, harness_id=parent_id,
                                  failures=failures(frame, config.failure_below), records=frame.height,
                                  inject=self.scenario().harness.inject,
                                  rewarded=rewarded_replies(frame, config.failure_below))
        mutations = self.propose(context)
        tree = apply_mutations(files, mutations)
        if not mutations or tree == files:
            raise NothingToProposeError(f"{self.name}: nothing to change in the harness of {snap.head_release} "
                                        f"({len(context.failures)} failures in {frame.height} records)")
        if not tree:
            raise NothingToProposeError(f"{self.name}: the mutations remove every file of the harness")
        cand_id = self.candidate_id(snap, parent_id)  # the parent harness in place of a base model's digest
        target = Path(out_dir) if out_dir is not None else Path(out_root) / cand_id
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        try:
            for rel, text in tree.items():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / rel).write_text(text, encoding="utf-8")
            lineage = Lineage(snapshot_id=snap.id, snapshot_hash=snap.hash, recipe=self.ref,
                              params=config.to_dict(), parent_release=snap.head_release, code_commit=git_commit(),
                              base_model=config.base_model, base_model_sha256=None, versions=_versions(),
                              parent_harness=parent_id)
            metrics = {"records": frame.height, "failures": len(context.failures), "mutations": len(mutations),
                       "rewarded": len(context.rewarded), "proposer": self.proposer_name()}
            candidate = Candidate(id=cand_id, path=target, kind=CANDIDATE_KIND, scenario=snap.scenario,
                                  metrics=metrics, lineage=lineage, created_at=datetime.now(UTC).isoformat(),
                                  mutations=[m.model_dump() for m in mutations])
            candidate.write(staging)
            replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if consume and config.consume:
            ledger.mark_consumed(snap.ledger_root, snap.scenario, snap.hash, snap.record_ids, cand_id)
        if progress:
            changes = ", ".join(f"{m.op} {m.path}" for m in mutations)
            print(f"candidate {cand_id} ({self.name}, harness) -> {target}; {len(context.failures)} failures in "
                  f"{frame.height} records; {changes}", file=sys.stderr)
        return Candidate.read(target)
