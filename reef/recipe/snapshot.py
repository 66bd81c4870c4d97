"""Snapshots: a scenario's experience frozen for one training round, and the spec that picks it.

    snap = Snapshot.create("sentiment", "data", recipe.experience())
    snap.samples()   # one row per recorded choice, with the served token ids and logprobs

A snapshot is a folder with `records.parquet` (the selected records, plus `weight` and `group`)
and `manifest.json` (content hash, record ids, what was left out and why, the head release). Its
name carries the content hash (`<scenario>-<hash12>`) unless the caller picks a fixed folder (the
DVC stage does, and DVC content-addresses it). Records a previous round consumed are excluded, as
are records the spec rules out; records only deferred (over `batch_size`, groups still too small,
no report yet) stay available to later rounds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import datasets
import polars as pl

from reef.core.durable import replace_dir
from reef.core.hashing import sha256_json
from reef.core.paths import DataDir
from reef.experience import load
from reef.experience.load import EXPERIENCE_FEATURES, SESSION_COL
from reef.recipe import ledger
from reef.scenario.schema import StalePolicy

RECORDS_FILE = "records.parquet"
MANIFEST_FILE = "manifest.json"
DEFAULT_ROOT = DataDir().snapshots()


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



class EmptySnapshotError(RuntimeError):
    pass


def _group_key(row: dict[str, Any], group_by: str | None) -> str | None:
    if group_by is None:
        return row["record_id"]
    if group_by == "scenario":  # one group: every session of the scenario is a try at the same task
        return "scenario"
    if group_by == "session":
        return row[SESSION_COL]
    if group_by == "prompt":
        # The served prompt ids, not the text: two renderings of one chat are one prompt only if
        # the model saw the same tokens.
        return hashlib.sha256(json.dumps(row["prompt_token_ids"]).encode()).hexdigest()[:16]
    name = group_by.removeprefix("tag:")
    values = [t["value"] for t in row["tags"] or () if t["name"] == name]
    return f"{name}={values[0]}" if values else None


def _n_samples(choices: list[dict[str, Any]]) -> int:
    return sum(1 for c in choices if c["token_ids"])


def select(frame: pl.DataFrame, spec: ExperienceSpec, consumed_ids: set[str]) -> tuple[pl.DataFrame, dict[str, int]]:
    """Apply `spec` to one scenario's experience; returns the selected rows and what was left out."""
    counts: dict[str, int] = {"records_seen": frame.height}

    def drop(name: str, keep: pl.Expr) -> None:
        nonlocal frame
        kept = frame.filter(keep)
        counts[name] = frame.height - kept.height
        frame = kept

    drop("consumed", ~pl.col("record_id").is_in(list(consumed_ids)))
    # Never re-tokenize: a record without served token ids can't be trained on faithfully. Records
    # from a model server that returns none (not vLLM) are counted apart: no round will ever get them.
    drop("upstream_without_token_ids", pl.col("has_token_ids").fill_null(True))
    drop("no_token_ids", (pl.col("prompt_token_ids").list.len() > 0)
         & pl.col("choices").list.eval(pl.element().struct.field("token_ids").list.len() > 0).list.any())
    if spec.needs_reports:
        drop("unreported", pl.col("score").is_not_null())
    if spec.drop_duplicates:
        drop("duplicates", ~pl.col("is_duplicate"))
    if spec.min_score is not None:
        corrected = pl.col("correction").is_not_null() if spec.corrections else pl.lit(False)
        drop("below_min_score", (pl.col("score") >= spec.min_score) | corrected)

    counts["staleness_unknown"] = frame.filter(pl.col("staleness").is_null()).height
    over = (pl.col("staleness") - (spec.max_staleness or 0)).clip(lower_bound=0).fill_null(0)
    if spec.max_staleness is not None and spec.stale_policy == "drop":
        drop("stale_dropped", pl.col("staleness").is_null() | (pl.col("staleness") <= spec.max_staleness))
        frame = frame.with_columns(weight=pl.lit(1.0))
    elif spec.max_staleness is not None:
        counts["stale_downweighted"] = frame.filter(over > 0).height
        frame = frame.with_columns(weight=pl.lit(spec.stale_weight).pow(over).cast(pl.Float64))
    else:
        frame = frame.with_columns(weight=pl.lit(1.0))

    rows = frame.select("record_id", "prompt_token_ids", "tags", "choices", SESSION_COL).to_dicts()
    frame = frame.with_columns(
        group=pl.Series([_group_key(r, spec.group_by) for r in rows], dtype=pl.String),
        n_samples=pl.Series([_n_samples(r["choices"]) for r in rows], dtype=pl.Int64),
    )
    drop("ungrouped", pl.col("group").is_not_null())
    group_size = pl.col("n_samples").sum().over("group")
    drop("small_group_deferred", group_size >= spec.min_group_size)

    if spec.batch_size is not None:
        # Newest groups first (most on-policy), whole groups, at least one unless batch_size is 0
        # (a recipe that makes its own samples).
        newest = frame.group_by("group").agg(pl.col("created_at").max(), pl.col("n_samples").sum())
        newest = newest.sort(["created_at", "group"], descending=True).with_columns(
            cum=pl.col("n_samples").cum_sum()
        )
        first = (pl.int_range(pl.len()) == 0) & pl.lit(spec.batch_size > 0)
        keep = newest.filter((pl.col("cum") <= spec.batch_size) | first)["group"]
        drop("over_batch_deferred", pl.col("group").is_in(keep.to_list()))
    return frame.drop("n_samples").sort("created_at", "record_id"), counts


def _count_samples(frame: pl.DataFrame) -> int:
    if frame.height == 0:
        return 0
    has_ids = pl.element().struct.field("token_ids").list.len() > 0
    return int(frame.select(pl.col("choices").list.eval(has_ids).list.sum().sum()).item())


def content_hash(frame: pl.DataFrame, spec: ExperienceSpec) -> str:
    columns = ["record_id", "content_hash", "score", "weight", "group", *(["correction"] if spec.corrections else [])]
    rows = frame.select(columns).rows()
    return sha256_json({"spec": spec.to_dict(), "rows": [list(r) for r in rows]})


@dataclass(frozen=True)
class Snapshot:
    path: Path
    manifest: dict[str, Any]

    @property
    def id(self) -> str:
        return self.manifest["id"]

    @property
    def hash(self) -> str:
        return self.manifest["hash"]

    @property
    def scenario(self) -> str:
        return self.manifest["scenario"]

    @property
    def record_ids(self) -> list[str]:
        return self.manifest["record_ids"]

    @property
    def spec(self) -> ExperienceSpec:
        return ExperienceSpec(**self.manifest["spec"])

    @property
    def data_dir(self) -> Path:
        """The experience data dir the snapshot was taken from."""
        return Path(self.manifest["data_dir"])

    @property
    def ledger_root(self) -> Path:
        return Path(self.manifest["ledger_root"])

    @property
    def head_release(self) -> str:
        return self.manifest["head_release"]

    def frame(self) -> pl.DataFrame:
        return pl.read_parquet(self.path / RECORDS_FILE)

    def to_dataset(self) -> datasets.Dataset:
        return datasets.Dataset(self.frame().to_arrow())

    def samples(self) -> pl.DataFrame:
        """One row per recorded choice that has token ids: record_id, choice, group, score,
        correction (the report's, or None), weight, staleness, prompt_ids, completion_ids, logprobs
        (vLLM's, per completion token), finish_reason, text."""
        frame = self.frame()
        if "correction" not in frame.columns:  # a snapshot taken before reports had corrections
            frame = frame.with_columns(correction=pl.lit(None, pl.String))
        return (
            frame
            .select("record_id", "group", "score", "correction", "weight", "staleness", "prompt_token_ids", "choices")
            .explode("choices")
            .unnest("choices")
            .filter(pl.col("token_ids").list.len() > 0)
            .select(
                "record_id", pl.col("index").alias("choice"), "group", "score", "correction", "weight", "staleness",
                pl.col("prompt_token_ids").alias("prompt_ids"), pl.col("token_ids").alias("completion_ids"),
                "logprobs", "finish_reason", pl.col("content").alias("text"),
            )
        )

    def trajectories(self) -> pl.DataFrame:
        """One row per session (an agent's turns in one sequence, see `reef.recipe.trajectory`):
        session_id, record_ids, turns, input_ids, labels (the model's own tokens), score, weight,
        group."""
        from reef.recipe.trajectory import trajectories

        return trajectories(self.frame())

    @classmethod
    def open(cls, path: Path | str) -> Snapshot:
        path = Path(path)
        return cls(path, json.loads((path / MANIFEST_FILE).read_text()))

    @classmethod
    def create(
        cls,
        scenario: str,
        data_dir: Path | str,
        spec: ExperienceSpec,
        *,
        root: Path | str = DEFAULT_ROOT,
        dest: Path | str | None = None,
        ledger_root: Path | str = ledger.DEFAULT_ROOT,
        allow_empty: bool = False,
    ) -> Snapshot:
        """Select `scenario`'s eligible experience under `data_dir` per `spec` and freeze it into
        `dest`, or `<root>/<scenario>-<hash12>/` (reused when it already exists)."""
        if spec.scenario != scenario:
            raise ValueError(f"spec is for scenario {spec.scenario!r}, not {scenario!r}")
        data_dir = Path(data_dir)
        exp = load(scenario, data_dir)
        consumed_ids = set(ledger.consumed(ledger_root, scenario)["record_id"].to_list())
        frame, counts = select(exp.collect(), spec, consumed_ids)
        if frame.height == 0 and not allow_empty:
            raise EmptySnapshotError(f"no eligible experience for {scenario!r} in {data_dir}: {counts}")
        digest = content_hash(frame, spec)
        snap_id = f"{scenario}-{digest[:12]}"
        target = Path(dest) if dest is not None else Path(root) / snap_id
        if dest is None and (target / MANIFEST_FILE).exists():
            return cls.open(target)  # same content, already frozen
        head = DataDir(data_dir).releases(scenario) / "HEAD"
        manifest = {
            "id": snap_id,
            "hash": digest,
            "scenario": scenario,
            "spec": spec.to_dict(),
            "data_dir": str(data_dir),
            "ledger_root": str(ledger_root),
            # Until a release chain writes HEAD, the gateway serves the base model as `<scenario>@r0`.
            "head_release": head.read_text().strip() if head.is_file() else f"{scenario}@r0",
            "head_seq": exp.head_seq,
            "created_at": datetime.now(UTC).isoformat(),
            "records": frame.height,
            "samples": _count_samples(frame),
            "counts": counts,
            "record_ids": frame["record_id"].to_list(),
        }
        _write_atomically(target, frame.select([*EXPERIENCE_FEATURES, "weight", "group"]), manifest)
        return cls(target, manifest)


def _write_atomically(target: Path, frame: pl.DataFrame, manifest: dict[str, Any]) -> None:
    # Built beside the target, synced, and swapped in: a reader (or a crash) sees the old snapshot
    # or the new one, whole.
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        frame.write_parquet(tmp / RECORDS_FILE)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
