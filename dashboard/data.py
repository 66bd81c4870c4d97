"""Everything the dashboard reads from the data dir: cached polars queries over
`reef.experience.load`, the release chain, the candidate register and the learner's rounds. Nothing
here writes; actions go through the server (dashboard/api.py). Chains and candidates come from
whichever backend holds them: files under the data dir, or PostgreSQL when REEF_STATE__URL (the
servers' `state.url`) is set, as the CLI reads them.

Queries aggregate lazily and return small frames (a time bucket x release grid, one page of
records), so a page costs the same with 100 or 100,000 records. Each cached query takes the
scenario's `version` (its shard files and chain, by name, size and mtime): new data shows up at the
next rerun, the TTL only bounds memory.
"""

from __future__ import annotations

import difflib
import io
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import streamlit as st

from reef.experience import load
from reef.experience import shards as exp_shards
from reef.registry import ArtifactStore
from reef.registry.candidates import CandidateNotFoundError, CandidateRegistry, CandidateView
from reef.registry.chain_api import Chain
from reef.registry.state import ReleaseState

TTL = 60
SESSION = "gen_ai.conversation.id"
# Roughly this many time buckets in a chart, whatever the time span.
BUCKETS = (("1s", 1), ("10s", 10), ("1m", 60), ("5m", 300), ("15m", 900), ("1h", 3600), ("6h", 21600),
           ("1d", 86400), ("1w", 604800))
TARGET_BUCKETS = 120


# --- what exists ---------------------------------------------------------------------------------


def scenarios(data_dir: Path) -> list[str]:
    """Scenarios with experience, a release chain or candidates."""
    found: set[str] = set(ReleaseState(data_dir).scenarios()) | set(CandidateRegistry.scenarios(data_dir))
    root = data_dir / "experience"
    if root.is_dir():
        found.update(p.parent.name for p in root.glob("*/records") if not p.parent.name.startswith("."))
    return sorted(found)


def version(data_dir: Path, scenario: str) -> tuple[Any, ...]:
    """Changes whenever a shard, the chain or the candidate register of `scenario` changes."""
    parts: list[Any] = []
    for table in ("records", "reports"):
        folder = exp_shards.table_dir(data_dir, scenario, table)
        if folder.is_dir():
            parts.extend(sorted((p.name, p.stat().st_size) for p in folder.glob("*.parquet")))
    state = ReleaseState(data_dir)
    if state.shared:  # every publish moves the head; every candidate change is one more event
        parts.append(("state", state.heads().get(scenario), len(CandidateRegistry(data_dir, scenario).events())))
        return tuple(parts)
    for path in (data_dir / "releases" / scenario).glob("*.jsonl"):  # the chain and the candidates' log
        stat = path.stat()
        parts.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(parts))


# --- experience ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    session: str | None = None
    releases: tuple[str, ...] = ()
    min_score: float | None = None
    max_score: float | None = None
    scored: str = "any"  # "any" | "scored" | "unscored"
    since: datetime | None = None
    until: datetime | None = None  # inclusive
    text: str | None = None

    def apply(self, frame: pl.LazyFrame) -> pl.LazyFrame:
        if self.session:
            frame = frame.filter(pl.col(SESSION) == self.session)
        if self.releases:
            frame = frame.filter(pl.col("release_id").is_in(list(self.releases)))
        if self.scored == "scored":
            frame = frame.filter(pl.col("score").is_not_null())
        elif self.scored == "unscored":
            frame = frame.filter(pl.col("score").is_null())
        if self.min_score is not None:
            frame = frame.filter(pl.col("score").is_null() | (pl.col("score") >= self.min_score))
        if self.max_score is not None:
            frame = frame.filter(pl.col("score").is_null() | (pl.col("score") <= self.max_score))
        if self.since is not None:
            frame = frame.filter(pl.col("created_at") >= self.since)
        if self.until is not None:
            frame = frame.filter(pl.col("created_at") <= self.until)
        if self.text:
            frame = frame.filter(pl.col("record_id").str.starts_with(self.text)
                                 | pl.col(SESSION).str.starts_with(self.text))
        return frame


def _experience(data_dir: Path, scenario: str) -> pl.LazyFrame:
    return load(scenario, data_dir).lazy()


LIGHT_COLUMNS = ["created_at", "record_id", SESSION, "release_id", "score", "feedback", "n_reports",
                 "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "latency_ms", "is_duplicate", "staleness"]


@st.cache_resource(ttl=TTL, max_entries=4, show_spinner=False)
def _light_frame(data_dir: Path, scenario: str, version: tuple[Any, ...]) -> pl.DataFrame:
    """The scalar columns of every record (a few MB per 100k records), read once per data version
    and shared by every page and session (cache_resource: not copied on each use). Nested columns
    (messages, choices, token ids) are read by record id, a page at a time."""
    return _experience(data_dir, scenario).select(LIGHT_COLUMNS).collect()


def light(data_dir: Path, scenario: str, version: tuple[Any, ...]) -> pl.LazyFrame:
    return _light_frame(data_dir, scenario, version).lazy()


@st.cache_data(ttl=TTL, show_spinner=False)
def summary(data_dir: Path, scenario: str, version: tuple[Any, ...]) -> dict[str, Any]:
    """Totals and per-release numbers of a scenario."""
    frame = light(data_dir, scenario, version)
    by_release = (
        frame.group_by("release_id")
        .agg(records=pl.len(), scored=pl.col("score").count(), mean_score=pl.col("score").mean(),
             first=pl.col("created_at").min(), last=pl.col("created_at").max())
        .sort("first")
        .collect()
    )
    totals = frame.select(
        records=pl.len(), scored=pl.col("score").count(), mean_score=pl.col("score").mean(),
        sessions=pl.col(SESSION).n_unique(), duplicates=pl.col("is_duplicate").sum(),
        first=pl.col("created_at").min(), last=pl.col("created_at").max(),
        min_score=pl.col("score").min(), max_score=pl.col("score").max(),
    ).collect().row(0, named=True)
    return {**totals, "by_release": by_release}


def bucket_for(first: datetime | None, last: datetime | None) -> str:
    if first is None or last is None:
        return "1m"
    span = (last - first).total_seconds()
    for name, seconds in BUCKETS:
        if span / seconds <= TARGET_BUCKETS:
            return name
    return BUCKETS[-1][0]


@st.cache_data(ttl=TTL, show_spinner=False)
def traffic(data_dir: Path, scenario: str, version: tuple[Any, ...], bucket: str) -> pl.DataFrame:
    """Per time bucket and release: requests, reports and mean reward."""
    return (
        light(data_dir, scenario, version)
        .group_by(pl.col("created_at").dt.truncate(bucket).alias("time"), "release_id")
        .agg(requests=pl.len(), scored=pl.col("score").count(), mean_reward=pl.col("score").mean())
        .sort("time", "release_id")
        .collect()
    )


@st.cache_data(ttl=TTL, show_spinner=False)
def count(data_dir: Path, scenario: str, version: tuple[Any, ...], filters: Filters) -> int:
    return filters.apply(light(data_dir, scenario, version)).select(pl.len()).collect().item()


@st.cache_data(ttl=TTL, show_spinner=False)
def records_page(data_dir: Path, scenario: str, version: tuple[Any, ...], filters: Filters, page: int,
                 page_size: int) -> pl.DataFrame:
    """One page of the matching records, newest first, with a prompt and reply preview."""
    frame = filters.apply(light(data_dir, scenario, version))
    rows = frame.sort("created_at", "record_id", descending=True).slice(page * page_size, page_size).collect()
    if rows.height == 0:
        return rows.with_columns(prompt=pl.lit(None, pl.String), reply=pl.lit(None, pl.String))
    texts = _full_rows(data_dir, scenario, tuple(rows["record_id"]), ["messages", "choices"]).select(
        "record_id",
        prompt=pl.col("messages").list.last().struct.field("content"),
        reply=pl.col("choices").list.first().struct.field("content"),
    )
    return rows.join(texts, on="record_id", how="left").sort("created_at", "record_id", descending=True)


def _full_rows(data_dir: Path, scenario: str, record_ids: tuple[str, ...], columns: list[str]) -> pl.DataFrame:
    """Heavy columns (messages, choices, token ids) of a few records, read by id: a page never
    carries 100k rows of nested columns through a sort."""
    if not exp_shards.has_shards(data_dir, scenario, "records"):
        return pl.DataFrame({"record_id": []}, schema={"record_id": pl.String})
    return (
        pl.scan_parquet(exp_shards.shard_glob(data_dir, scenario, "records"))
        .filter(pl.col("record_id").is_in(list(record_ids)))
        .select("record_id", *columns)
        .unique("record_id", keep="first")
        .collect()
    )


@st.cache_data(ttl=TTL, show_spinner=False)
def session_records(data_dir: Path, scenario: str, version: tuple[Any, ...], session: str) -> pl.DataFrame:
    """Every record of one session, oldest first, with everything stored about it."""
    turns = (
        light(data_dir, scenario, version)
        .filter(pl.col(SESSION) == session)
        .select("record_id", "created_at", "release_id", "score", "n_reports", "feedback", "staleness",
                "is_duplicate")
        .collect()
    )
    if turns.height == 0:
        return turns
    heavy = _full_rows(data_dir, scenario, tuple(turns["record_id"]),
                       ["messages", "choices", "prompt_token_ids", "gen_ai.request.model", "gen_ai.response.model",
                        "gen_ai.request.temperature", "gen_ai.request.max_tokens", "gen_ai.usage.input_tokens",
                        "gen_ai.usage.output_tokens", "latency_ms", "ttft_ms", "stream", "tags"])
    return turns.join(heavy, on="record_id", how="left").sort("created_at", "record_id")


@st.cache_data(ttl=TTL, show_spinner=False)
def reports_for(data_dir: Path, scenario: str, version: tuple[Any, ...], record_ids: tuple[str, ...]) -> pl.DataFrame:
    """Every report naming one of `record_ids` (load() keeps only the latest score per record)."""
    schema = {"record_id": pl.String, "report_id": pl.String, "score": pl.Float64, "feedback": pl.String,
              "metadata_json": pl.String, "created_at": pl.Datetime("us", "UTC")}
    if not record_ids or not exp_shards.has_shards(data_dir, scenario, "reports"):
        return pl.DataFrame(schema=schema)
    return (
        pl.scan_parquet(exp_shards.shard_glob(data_dir, scenario, "reports"))
        .unique("report_id", keep="first")
        .explode("record_ids")
        .rename({"record_ids": "record_id"})
        .filter(pl.col("record_id").is_in(list(record_ids)))
        .select(list(schema))
        .sort("created_at")
        .collect()
    )


def export_parquet(data_dir: Path, scenario: str, filters: Filters) -> bytes:
    """The filtered records, every column, as one parquet file (built when the button is clicked)."""
    frame = filters.apply(_experience(data_dir, scenario)).sort("created_at", "record_id").collect()
    buf = io.BytesIO()
    frame.write_parquet(buf)
    return buf.getvalue()


# --- releases and candidates ---------------------------------------------------------------------


def _chain(data_dir: Path, scenario: str) -> Chain | None:
    # Only an existing chain: opening one creates it, and the dashboard must not.
    state = ReleaseState(data_dir)
    return state.chain(scenario) if state.has_chain(scenario) else None


@st.cache_data(ttl=TTL, show_spinner=False)
def releases(data_dir: Path, scenario: str, version: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The scenario's release chain, oldest first, as JSON dicts."""
    chain = _chain(data_dir, scenario)
    return [] if chain is None else [r.model_dump(mode="json") for r in chain.releases()]


@st.cache_data(ttl=TTL, show_spinner=False)
def candidates(data_dir: Path, scenario: str, version: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Every candidate of the scenario, newest first, without per-prompt gate outputs."""
    return [v.model_dump(mode="json") for v in CandidateRegistry(data_dir, scenario).list()]


@st.cache_data(ttl=TTL, show_spinner=False)
def candidate(data_dir: Path, scenario: str, version: tuple[Any, ...], candidate_id: str) -> dict[str, Any] | None:
    """One candidate with the gate's per-prompt outputs."""
    try:
        view: CandidateView = CandidateRegistry(data_dir, scenario).get(candidate_id, details=True)
    except CandidateNotFoundError:
        return None
    return view.model_dump(mode="json")


def per_prompt_frame(view: dict[str, Any]) -> pl.DataFrame:
    """The gate's per-prompt outcomes, wins first, then losses, then ties (largest gaps first)."""
    rows = (view.get("gate") or {}).get("per_prompt") or []
    if not rows:
        return pl.DataFrame()
    frame = pl.DataFrame({
        "prompt": [_prompt_text(r["messages"]) for r in rows],
        "candidate_score": [r["candidate_score"] for r in rows],
        "head_score": [r["head_score"] for r in rows],
        "candidate_replies": [r["candidate_replies"] for r in rows],
        "head_replies": [r["head_replies"] for r in rows],
    }).with_columns(delta=pl.col("candidate_score") - pl.col("head_score"))
    outcome = (pl.when(pl.col("delta") > 0).then(pl.lit("win"))
               .when(pl.col("delta") < 0).then(pl.lit("loss")).otherwise(pl.lit("tie")))
    order = pl.when(pl.col("delta") > 0).then(0).when(pl.col("delta") < 0).then(1).otherwise(2)
    return (frame.with_columns(outcome=outcome, _order=order, _gap=pl.col("delta").abs())
            .sort("_order", "_gap", descending=[False, True]).drop("_order", "_gap"))


# What the Candidates page plots first: the curves a training run is usually read by.
DEFAULT_CURVES = ("loss", "reward", "kl", "grad_norm", "learning_rate", "solver_reward", "proposer_reward")


def training_curves(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A candidate's per-step training log (candidate.json `training_log`) in long form: step, metric,
    value; `epoch` (a Trainer's progress counter, not a measurement) is left out."""
    long = [{"step": int(r["step"]), "metric": k, "value": float(v)} for r in rows if "step" in r
            for k, v in r.items() if k not in ("step", "epoch") and isinstance(v, int | float)]
    return pl.DataFrame(long, schema={"step": pl.Int64, "metric": pl.String, "value": pl.Float64})


def _prompt_text(messages: list[dict[str, Any]]) -> str:
    users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    return users[-1] if users else (messages[-1].get("content") or "" if messages else "")


@st.cache_data(ttl=TTL, show_spinner=False)
def manifest(data_dir: Path, content_id: str) -> dict[str, Any] | None:
    store = ArtifactStore.for_data_dir(data_dir)
    if not store.exists(content_id):
        return None
    return store.get(content_id).model_dump(mode="json")


TEXT_SUFFIXES = (".txt", ".md", ".yaml", ".yml", ".json", ".jinja", ".py", ".toml", "")


@st.cache_data(ttl=TTL, show_spinner=False)
def harness_diff(data_dir: Path, old_content: str | None, new_content: str | None,
                 old_label: str = "head", new_label: str = "candidate") -> str:
    """Unified diff of the text files of two artifacts (a harness candidate against the harness it
    changes, a harness release against its parent's); None: no harness (every file is new)."""
    store = ArtifactStore.for_data_dir(data_dir)
    out: list[str] = []

    def files(content_id: str | None) -> dict[str, str]:
        if not content_id or not store.exists(content_id):
            return {}
        root = store.path(content_id)
        texts = {}
        for f in store.get(content_id).files:
            if Path(f.path).suffix in TEXT_SUFFIXES and f.size <= 1_000_000:
                try:
                    texts[f.path] = (root / f.path).read_text()
                except UnicodeDecodeError:
                    texts[f.path] = f"<binary, sha256 {f.sha256[:12]}>\n"
            else:
                texts[f.path] = f"<{f.size} bytes, sha256 {f.sha256[:12]}>\n"
        return texts

    old, new = files(old_content), files(new_content)
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path, ""), new.get(path, "")
        if a != b:
            out.extend(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                            f"{old_label}/{path}" if path in old else "/dev/null",
                                            f"{new_label}/{path}" if path in new else "/dev/null"))
    return "".join(out)


def harness_base(view: dict[str, Any], head: dict[str, Any] | None) -> tuple[str | None, str]:
    """The harness a harness candidate changes, and what to call it: the parent harness its recipe
    mutated (lineage `parent_harness`), else the head's harness (None: the head serves none)."""
    parent = (view.get("lineage") or {}).get("parent_harness")
    if parent:
        return parent, f"parent {parent[:12]}"
    return (head or {}).get("harness_id"), f"head {(head or {}).get('release_id', '')}".strip()


def change_of(release: dict[str, Any], parent: dict[str, Any] | None) -> str:
    """What a release changed against its parent, in a word: base, weights, harness, composite
    (both in one step), split (a routing release: a canary started or ended) or nothing."""
    if parent is None:
        return "base"
    weights = release["content_id"] != parent["content_id"]
    harness = release.get("harness_id") != parent.get("harness_id")
    if weights and harness:
        return "composite"
    if weights or harness:
        return "weights" if weights else "harness"
    return "split" if release.get("routing") != parent.get("routing") else "nothing"


def split_text(release: dict[str, Any]) -> str | None:
    """`30% -> candidate abc123…` for a release that splits traffic, else None."""
    arms = (release.get("routing") or {}).get("arms") or []
    cand = next((a for a in arms if a["arm"] == "candidate"), None)
    return None if cand is None else f"{cand['share']:.0%} -> {cand['content_id'][:12]}"


def serves(release: dict[str, Any]) -> tuple[Any, ...]:
    """Everything that decides who answers (weights, harness, split): a rollback must change it."""
    return release["content_id"], release.get("harness_id"), json.dumps(release.get("routing"), sort_keys=True)


# --- learner and pipeline ------------------------------------------------------------------------


def learner_rounds(data_dir: Path, limit: int = 20, scenario: str | None = None) -> list[dict[str, Any]]:
    """The learner's latest rounds (`<data_dir>/learner/rounds.jsonl`), newest first; of one scenario if given."""
    path = data_dir / "learner" / "rounds.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in reversed(path.read_text().splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if scenario is None or entry.get("scenario") == scenario:
            out.append(entry)
        if len(out) >= limit:
            break
    return out


def dvc_stages(data_dir: Path) -> dict[str, Any]:
    """Stages of the `dvc.lock` next to the data dir (or in the working directory), if any."""
    import yaml

    for folder in (data_dir.parent, Path.cwd()):
        lock = folder / "dvc.lock"
        if lock.is_file():
            try:
                return (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}
            except yaml.YAMLError:
                return {}
    return {}
