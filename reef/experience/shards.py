"""Parquet shards: the flushed, read-only form of the experience.

Layout, one folder per scenario, laid out as a Hugging Face dataset repository:

    <data_dir>/experience/<scenario>/README.md                        dataset card (configs)
    <data_dir>/experience/<scenario>/records/part-<segment:08d>.parquet
    <data_dir>/experience/<scenario>/reports/part-<segment:08d>.parquet
    <data_dir>/experience/.tmp/                                       shards being written

A shard is named after the WAL segment it came from, so writing a segment twice (a crash between
writing its shards and deleting it) overwrites the same files instead of duplicating rows. It is
written under `.tmp/` and renamed into place, so a reader's glob never sees half a file.
"""

from __future__ import annotations

import io
import logging
import os
import re
import uuid
from functools import cache
from pathlib import Path

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from reef.core.durable import fsync_path
from reef.core.paths import DataDir
from reef.experience.schema import TABLES

log = logging.getLogger(__name__)

TMP_DIR = ".tmp"
SHARD_RE = re.compile(r"^part-(\d{8,})\.parquet$")
# The same rule the gateway applies to the scenario header; enforced here too because the name
# becomes a path, and a leading dot would collide with `.tmp`.
SCENARIO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

CARD = """---
configs:
- config_name: records
  data_files:
  - split: train
    path: records/*.parquet
  default: true
- config_name: reports
  data_files:
  - split: train
    path: reports/*.parquet
---

# Reef experience: {scenario}

Every chat completion served for scenario `{scenario}` (`records`) and the rewards the
application reported for them (`reports`), as parquet shards written by Reef's experience store.

```python
import datasets
records = datasets.load_dataset("<data_dir>/experience/{scenario}", "records", split="train")
```

or, with the reports joined in: `reef.experience.load("{scenario}", data_dir=...)`.
"""


def validate_scenario(scenario: str) -> str:
    if not SCENARIO_RE.match(scenario):
        raise ValueError(f"scenario {scenario!r} must match {SCENARIO_RE.pattern}")
    return scenario


def table_dir(data_dir: Path, scenario: str, table: str) -> Path:
    return DataDir(data_dir).experience(scenario) / table


def shard_glob(data_dir: Path, scenario: str, table: str) -> str:
    return str(table_dir(data_dir, scenario, table) / "*.parquet")


def shard_path(data_dir: Path, scenario: str, table: str, seq: int) -> Path:
    return table_dir(data_dir, scenario, table) / f"part-{seq:08d}.parquet"


@cache
def arrow_schema(table: str) -> pa.Schema:
    """The table's arrow schema. `Features.arrow_schema` rebuilds it on every call (a deep walk of
    the features: some 5 ms, most of the CPU a flush of a few hundred records spent)."""
    return TABLES[table][1].arrow_schema


def scan(source: str, table: str) -> pl.LazyFrame:
    """Shards as one frame in the declared schema: shards written before a column existed read it as null."""
    schema = pl.from_arrow(arrow_schema(table).empty_table()).schema  # type: ignore[union-attr]
    return pl.scan_parquet(source, schema=schema, missing_columns="insert")


def has_shards(data_dir: Path, scenario: str, table: str) -> bool:
    return any(table_dir(data_dir, scenario, table).glob("*.parquet"))


def all_shards(data_dir: Path, table: str) -> list[Path]:
    return sorted(DataDir(data_dir).experience().glob(f"*/{table}/*.parquet"))


def shard_seq(path: Path) -> int | None:
    m = SHARD_RE.match(path.name)
    return int(m.group(1)) if m else None


def max_shard_seq(data_dir: Path) -> int:
    """The highest segment number any shard was written from (0 if none). New WAL segments must
    number above it, or a fresh segment would overwrite an old shard of the same name."""
    best = 0
    for table in TABLES:
        for path in all_shards(data_dir, table):
            best = max(best, shard_seq(path) or 0)
    return best


def clean_tmp(data_dir: Path) -> None:
    """Drop shards a crash left half-written: their rows are still in the WAL."""
    tmp = DataDir(data_dir).experience() / TMP_DIR
    if tmp.is_dir():
        for path in tmp.iterdir():
            path.unlink(missing_ok=True)


def rows_to_arrow(table: str, rows: list[bytes]) -> pa.Table:
    """Rows (JSON, as the WAL holds them) to an arrow table with the table's exact schema."""
    model = TABLES[table][0]
    schema = arrow_schema(table)
    # Arrow's JSON reader parses in C++ without the GIL, ~4x faster than building Python dicts.
    # A row longer than a block would fail to parse, so blocks are sized to the longest row.
    block = max(1 << 20, max(len(r) for r in rows) + 1)
    try:
        parsed = pa_json.read_json(
            io.BytesIO(b"\n".join(rows)),
            read_options=pa_json.ReadOptions(block_size=block),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error"),
        )
        return pa.Table.from_arrays([parsed.column(n) for n in schema.names], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
        # Whatever arrow's parser rejects, the model can still read: slower, but never stuck.
        log.warning("fast JSON->arrow conversion of %s failed (%s); using the slow path", table, exc)
        dicts = [model.model_validate(orjson.loads(r)).model_dump(by_alias=True) for r in rows]
        return pa.Table.from_pylist(dicts, schema=schema)


def write_shard(
    data_dir: Path, scenario: str, table: str, seq: int, rows: list[bytes], *, fsync: bool
) -> Path:
    """Write `rows` as shard `seq` of `scenario`/`table`, atomically; returns its path."""
    validate_scenario(scenario)
    arrow = rows_to_arrow(table, rows)
    final = shard_path(data_dir, scenario, table, seq)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = DataDir(data_dir).experience() / TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{scenario}.{table}.{final.stem}.{uuid.uuid4().hex[:8]}.parquet"
    try:
        # A path, not a Python file object: arrow then writes natively, without taking the GIL.
        pq.write_table(arrow, str(tmp), compression="zstd")
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_path(final.parent)
    ensure_card(data_dir, scenario, fsync=fsync)
    return final


def ensure_card(data_dir: Path, scenario: str, *, fsync: bool) -> None:
    """Write the scenario's dataset card once, so `datasets.load_dataset(<dir>, "records")` works."""
    card = DataDir(data_dir).experience(scenario) / "README.md"
    if card.exists():
        return
    tmp = DataDir(data_dir).experience() / TMP_DIR / f"{scenario}.README.{uuid.uuid4().hex[:8]}.md"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(CARD.format(scenario=scenario))
    if fsync:
        fsync_path(tmp)
    os.replace(tmp, card)
    if fsync:
        fsync_path(card.parent)
