"""Parquet shards: the flushed, read-only form of the experience.

Layout, one folder per scenario, laid out as a Hugging Face dataset repository:

    <data_dir>/experience/<scenario>/README.md                        dataset card (configs)
    <data_dir>/experience/<scenario>/records/part-<segment:08d>.parquet              one gateway
    <data_dir>/experience/<scenario>/records/part-<partition>-<segment:08d>.parquet  gateway <partition>
    <data_dir>/experience/<scenario>/reports/...                      the same two forms
    <data_dir>/experience/.tmp/, .tmp-<partition>/                    shards being written

A shard is named after the WAL segment it came from, so writing a segment twice (a crash between
writing its shards and deleting it) overwrites the same files instead of duplicating rows. It is
written under a `.tmp` folder and renamed into place, so a reader's glob never sees half a file.

Partitions (issue 26): several gateways write one data dir, each through its own WAL
(`DataDir.store_wal`) and under its own shard names, `part-<partition>-<segment>.parquet` beside the
one-gateway `part-<segment>.parquet` (the partition `None`), in the same `records/` and `reports/`
folders. Why a name prefix and not a folder per partition (`records/<partition>/part-*.parquet`):
the one flat folder is what every reader already globs, `records/*.parquet` (the dataset card's
configs, `datasets.load_dataset`, polars, `reef.experience.load`, the canary recount, the
dashboard), so the union of all partitions reads as one table with no reader changed and an old
data dir stays valid as it is; a folder per partition would need `**`, whose meaning (zero or more
folders) differs between polars, fsspec versions and `datasets`, and which a Hub repository or an
object store lists no cheaper than one prefix. Two partitions never write the same file: each
segment's name carries its partition, and each has its own `.tmp` folder, which only it cleans.
"""

from __future__ import annotations

import io
import logging
import os
import re
import time
import uuid
from functools import cache
from pathlib import Path

import fsspec
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from fsspec.spec import AbstractFileSystem

from reef.core.durable import fsync_path
from reef.core.paths import DataDir
from reef.experience.schema import TABLES

log = logging.getLogger(__name__)

TMP_DIR = ".tmp"
# part-<segment>.parquet, or part-<partition>-<segment>.parquet: the segment is the digits after the
# last dash, so a partition may hold dashes and digits too.
SHARD_RE = re.compile(r"^part-(?:(?P<partition>.+)-)?(?P<seq>\d{8,})\.parquet$")
# The same rule the gateway applies to the scenario header; enforced here too because the name
# becomes a path, and a leading dot would collide with `.tmp`.
SCENARIO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# A gateway's partition (`store.partition`): part of a file name and of a folder's.
PARTITION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

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


def validate_partition(partition: str | None) -> str | None:
    if partition is not None and not PARTITION_RE.match(partition):
        raise ValueError(f"partition {partition!r} must match {PARTITION_RE.pattern}")
    return partition


def table_dir(data_dir: Path, scenario: str, table: str) -> Path:
    return DataDir(data_dir).experience(scenario) / table


def shard_glob(data_dir: Path, scenario: str, table: str) -> str:
    return str(table_dir(data_dir, scenario, table) / "*.parquet")


def shard_name(seq: int, partition: str | None = None) -> str:
    return f"part-{seq:08d}.parquet" if partition is None else f"part-{partition}-{seq:08d}.parquet"


def shard_path(data_dir: Path, scenario: str, table: str, seq: int, partition: str | None = None) -> Path:
    return table_dir(data_dir, scenario, table) / shard_name(seq, partition)


@cache
def arrow_schema(table: str) -> pa.Schema:
    """The table's arrow schema. `Features.arrow_schema` rebuilds it on every call (a deep walk of
    the features: some 5 ms, most of the CPU a flush of a few hundred records spent)."""
    return TABLES[table][1].arrow_schema


def scan(source: str, table: str) -> pl.LazyFrame:
    """Shards as one frame in the declared schema: shards written before a column existed read it as null."""
    schema = pl.from_arrow(arrow_schema(table).empty_table()).schema  # type: ignore[union-attr]
    return pl.scan_parquet(source, schema=schema, missing_columns="insert")


def read_keys(files: list[Path], id_col: str, hash_col: str) -> pl.DataFrame:
    """(id, scenario, hash, shard path) of every row of `files`, each id once (a shard written twice
    repeats ids; the first stays, as readers keep it)."""
    return (
        pl.scan_parquet([str(p) for p in files], include_file_paths="_path")
        .select(id_col, "scenario", hash_col, "_path")
        .unique(id_col, keep="first")
        .collect()
    )


def url_shards(url: str, scenario: str, table: str) -> tuple[AbstractFileSystem, list[str]]:
    """The filesystem of an fsspec data dir URL (`s3://bucket/data`, `gs://...`, `file:///...`) and
    one scenario's shards of `table` there, of every partition."""
    fs, root = fsspec.core.url_to_fs(url)
    folder = DataDir(root).experience(validate_scenario(scenario)) / table
    return fs, sorted(fs.glob(f"{folder.as_posix()}/*.parquet"))


def scan_files(fs: AbstractFileSystem, files: list[str], table: str) -> pl.LazyFrame:
    """`scan` for shards on any fsspec filesystem, read through arrow (polars reads only some
    object stores itself); the declared schema again fills columns older shards lack."""
    dataset = pa_ds.dataset(files, schema=arrow_schema(table), format="parquet",
                            filesystem=pa_fs.PyFileSystem(pa_fs.FSSpecHandler(fs)))
    return pl.scan_pyarrow_dataset(dataset)


class ShardWatch:
    """The shards partitions other than `partition` wrote since the last look. A shard renamed into
    a folder changes the folder's mtime, so a folder is listed again only then (a long-lived data
    dir holds many thousands of shards; listing them all every flush round would cost a core's
    share), or while its mtime is too recent to tell two renames in one clock tick apart."""

    def __init__(self, data_dir: Path, partition: str | None) -> None:
        self.data_dir = data_dir
        self.partition = partition
        self._listed: dict[Path, tuple[int, int]] = {}  # folder -> (its mtime, when listed), in ns

    def new_shards(self, table: str) -> list[Path]:
        """The other partitions' shards of `table` in every folder that changed (some maybe seen before)."""
        out = []
        for folder in table_dirs(self.data_dir, table):
            try:
                mtime = folder.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            seen = self._listed.get(folder)
            if seen is not None and seen[0] == mtime and seen[1] - mtime > 1_000_000_000:
                continue
            self._listed[folder] = (mtime, time.time_ns())
            out += [p for p in folder.glob("*.parquet")
                    if (named := shard_partition(p)) is not None and named[0] != self.partition]
        return out


def has_shards(data_dir: Path, scenario: str, table: str) -> bool:
    return any(table_dir(data_dir, scenario, table).glob("*.parquet"))


def table_dirs(data_dir: Path, table: str) -> list[Path]:
    """Every scenario's `table` folder."""
    return [p for p in DataDir(data_dir).experience().glob(f"*/{table}") if p.is_dir()]


def all_shards(data_dir: Path, table: str) -> list[Path]:
    """Every scenario's shards of `table`, of every partition."""
    return sorted(DataDir(data_dir).experience().glob(f"*/{table}/*.parquet"))


def shard_partition(path: Path) -> tuple[str | None, int] | None:
    """(partition, segment) of a shard's file name; None for a file that is not a shard."""
    m = SHARD_RE.match(path.name)
    return (m.group("partition"), int(m.group("seq"))) if m else None


def max_shard_seq(data_dir: Path, partition: str | None = None) -> int:
    """The highest segment number any shard of `partition` was written from (0 if none). Its new WAL
    segments must number above it, or a fresh segment would overwrite an old shard of the same name."""
    best = 0
    for table in TABLES:
        for path in all_shards(data_dir, table):
            named = shard_partition(path)
            if named is not None and named[0] == partition:
                best = max(best, named[1])
    return best


def tmp_dir(data_dir: Path, partition: str | None = None) -> Path:
    """Where `partition` writes shards before renaming them into place: a folder of its own, so that
    cleaning it never deletes a shard another gateway is writing."""
    return DataDir(data_dir).experience() / (TMP_DIR if partition is None else f"{TMP_DIR}-{partition}")


def clean_tmp(data_dir: Path, partition: str | None = None) -> None:
    """Drop shards a crash left half-written: their rows are still in the WAL."""
    tmp = tmp_dir(data_dir, partition)
    if tmp.is_dir():
        for path in tmp.iterdir():
            if path.is_file():
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
    data_dir: Path, scenario: str, table: str, seq: int, rows: list[bytes], *, fsync: bool,
    partition: str | None = None,
) -> Path:
    """Write `rows` as shard `seq` of `partition`'s `scenario`/`table`, atomically; returns its path."""
    validate_scenario(scenario)
    arrow = rows_to_arrow(table, rows)
    final = shard_path(data_dir, scenario, table, seq, partition)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp_folder = tmp_dir(data_dir, partition)
    tmp_folder.mkdir(parents=True, exist_ok=True)
    tmp = tmp_folder / f"{scenario}.{table}.{final.stem}.{uuid.uuid4().hex[:8]}.parquet"
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
    ensure_card(data_dir, scenario, fsync=fsync, partition=partition)
    return final


def ensure_card(data_dir: Path, scenario: str, *, fsync: bool, partition: str | None = None) -> None:
    """Write the scenario's dataset card once, so `datasets.load_dataset(<dir>, "records")` works."""
    card = DataDir(data_dir).experience(scenario) / "README.md"
    if card.exists():
        return
    # Two partitions may both write it: the same text, each renamed over the other atomically.
    tmp = tmp_dir(data_dir, partition) / f"{scenario}.README.{uuid.uuid4().hex[:8]}.md"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(CARD.format(scenario=scenario))
    if fsync:
        fsync_path(tmp)
    os.replace(tmp, card)
    if fsync:
        fsync_path(card.parent)
