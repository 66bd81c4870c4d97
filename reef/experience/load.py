"""Reading experience back: one scenario's records with their rewards, as a lazy polars frame or
a `datasets.Dataset`.

    from reef.experience import load
    exp = load("demo", data_dir="data", min_score=0.5)
    df = exp.lazy().filter(~pl.col("is_duplicate")).collect()
    ds = exp.to_dataset()

Only flushed shards are read (rows still in the WAL appear after the next flush, within
`store.flush_interval_s`), of every partition: with several gateways on one data dir
(`store.partition`), the union of what they all flushed. `data_dir` may be an fsspec URL
(`s3://bucket/data`, `gs://...`, `file:///...`: the data dir copied or synced to an object store);
with the filesystem's package installed (`s3fs`, `gcsfs`), `load` reads the shards there.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import datasets
import fsspec
import polars as pl

from reef.core.paths import DataDir
from reef.experience import shards
from reef.experience.schema import RECORD_FEATURES, REPORT_FEATURES

log = logging.getLogger(__name__)

RELEASE_SEQ_RE = re.compile(r"@r(\d+)$")
SESSION_COL = "gen_ai.conversation.id"

# Columns load() adds to each record, in this order after the record's own.
EXTRA_FEATURES = datasets.Features(
    {
        "score": datasets.Value("float64"),  # the latest report's score, by created_at
        "n_reports": datasets.Value("int64"),
        "feedback": datasets.Value("string"),  # the latest report's feedback
        "correction": datasets.Value("string"),  # the latest report's correction (the reply it wanted)
        "is_duplicate": datasets.Value("bool"),  # same content_hash as an earlier record
        "staleness": datasets.Value("int64"),  # releases the scenario's head is ahead of this one's
    }
)
EXPERIENCE_FEATURES = datasets.Features({**RECORD_FEATURES, **EXTRA_FEATURES})


@dataclass(frozen=True)
class Experience:
    scenario: str
    # The head release seq staleness is measured against; None: the newest release in the data.
    head_seq: int | None
    _frame: pl.LazyFrame

    def lazy(self) -> pl.LazyFrame:
        return self._frame

    def collect(self) -> pl.DataFrame:
        return self._frame.collect()

    def to_dataset(self) -> datasets.Dataset:
        """The rows as a `datasets.Dataset`, with the shards' nested types (not polars' large ones)."""
        table = self._frame.collect().to_arrow()
        return datasets.Dataset(table.cast(EXPERIENCE_FEATURES.arrow_schema))


def release_seq(release_id: str) -> int | None:
    """`<scenario>@r<seq>` -> seq."""
    m = RELEASE_SEQ_RE.search(release_id.strip())
    return int(m.group(1)) if m else None


def read_head_seq(data_dir: Path | str, scenario: str) -> int | None:
    """The seq of `<data_dir>/releases/<scenario>/HEAD`, if that file exists and names a release."""
    if _is_url(data_dir):
        fs, root = fsspec.core.url_to_fs(str(data_dir))
        head = (DataDir(root).releases(scenario) / "HEAD").as_posix()
        text = fs.cat_file(head).decode() if fs.isfile(head) else None
    else:
        path = DataDir(data_dir).releases(scenario) / "HEAD"
        head, text = str(path), path.read_text() if path.is_file() else None
    if text is None:
        return None
    seq = release_seq(text)
    if seq is None:
        log.warning("%s does not name a release (<scenario>@r<seq>); using the newest in the data", head)
    return seq


def _is_url(data_dir: Path | str) -> bool:
    return isinstance(data_dir, str) and "://" in data_dir


def _scan(data_dir: Path | str, scenario: str, table: str, features: datasets.Features) -> pl.LazyFrame:
    if _is_url(data_dir):
        fs, files = shards.url_shards(str(data_dir), scenario, table)
        if files:
            return shards.scan_files(fs, files, table)
    elif shards.has_shards(Path(data_dir), scenario, table):
        return shards.scan(shards.shard_glob(Path(data_dir), scenario, table), table)
    # scan_parquet refuses a glob matching nothing; an empty frame keeps the shard schema.
    empty = pl.from_arrow(features.arrow_schema.empty_table())
    assert isinstance(empty, pl.DataFrame)
    return empty.lazy()


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def load(
    scenario: str,
    data_dir: Path | str = "data",
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    release: str | list[str] | None = None,
    min_score: float | None = None,
    session: str | None = None,
    head_seq: int | None = None,
) -> Experience:
    """One scenario's records, each with its reports folded in, lazily.

    Filters: `since <= created_at < until` (naive datetimes are UTC), `release` (one release id or
    several), `min_score` (records without a report are dropped), `session` (the conversation id).
    `is_duplicate` and `staleness` are computed over the whole scenario, before filtering, so a
    filter never turns a duplicate into an original.
    """
    if not _is_url(data_dir):
        data_dir = Path(data_dir)
    shards.validate_scenario(scenario)
    if head_seq is None:
        head_seq = read_head_seq(data_dir, scenario)

    records = _scan(data_dir, scenario, "records", RECORD_FEATURES).unique(
        "record_id", keep="first", maintain_order=True  # a shard written twice repeats rows
    )
    per_record = (
        _scan(data_dir, scenario, "reports", REPORT_FEATURES)
        .unique("report_id", keep="first", maintain_order=True)
        .explode("record_ids")
        .rename({"record_ids": "record_id"})
        .drop_nulls("record_id")
        .unique(["report_id", "record_id"], keep="first")  # a report naming a record twice counts once
        .group_by("record_id")
        .agg(
            score=pl.col("score").sort_by("created_at", "report_id").last(),
            feedback=pl.col("feedback").sort_by("created_at", "report_id").last(),
            correction=pl.col("correction").sort_by("created_at", "report_id").last(),
            n_reports=pl.len().cast(pl.Int64),
        )
    )
    seq = pl.col("release_id").str.extract(RELEASE_SEQ_RE.pattern, 1).cast(pl.Int64)
    head = pl.lit(head_seq, dtype=pl.Int64) if head_seq is not None else seq.max()
    frame = (
        records.join(per_record, on="record_id", how="left")
        .with_columns(pl.col("n_reports").fill_null(0))
        .sort("created_at", "record_id")
        .with_columns(
            is_duplicate=~pl.col("content_hash").is_first_distinct(),
            staleness=head - seq,
        )
    )

    if since is not None:
        frame = frame.filter(pl.col("created_at") >= _utc(since))
    if until is not None:
        frame = frame.filter(pl.col("created_at") < _utc(until))
    if release is not None:
        frame = frame.filter(pl.col("release_id").is_in([release] if isinstance(release, str) else release))
    if min_score is not None:
        frame = frame.filter(pl.col("score") >= min_score)
    if session is not None:
        frame = frame.filter(pl.col(SESSION_COL) == session)
    return Experience(scenario, head_seq, frame.select(list(EXPERIENCE_FEATURES)))
