"""The experience store: every record and report is durable in the WAL before it is acknowledged,
then moved to parquet shards in the background.

A row lives in memory from its append until its shard exists, so reads never miss the window
between the two; ids (with the hash the gateway checks retries against) are indexed in memory for
the store's whole life, rebuilt on open from the shards.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import orjson
import polars as pl
from pydantic import BaseModel

from reef.config import StoreConfig
from reef.core.paths import DataDir
from reef.experience import shards
from reef.experience.schema import TABLES, Record, RecordRow, Report
from reef.experience.wal import Segment, WalEntry, WalError, WriteAheadLog

log = logging.getLogger(__name__)

Table = Literal["records", "reports"]
# (id column, the hash the index keeps for it)
_KEYS: dict[str, tuple[str, str]] = {
    "records": ("record_id", "body_hash"),
    "reports": ("report_id", "content_hash"),
}
# pydantic-core's serializer writes JSON straight from the model, ~2x faster than
# model_dump(mode="json") + orjson, with the same output.
_SERIALIZERS = {table: model.__pydantic_serializer__ for table, (model, _) in TABLES.items()}


class ScenarioStats(BaseModel):
    records: int = 0
    reports: int = 0
    unflushed_records: int = 0
    unflushed_reports: int = 0
    oldest_unflushed_age_s: float = 0.0


class StoreClosedError(RuntimeError):
    pass


@dataclass(slots=True)
class _Mem:
    # The serialized row, not the model: one bytes object is all the collector and the allocator see
    # of a row held until its shard exists (a Record is some 200 objects), and reads from memory are
    # rare (retries, `GET /reef/records`).
    row: bytes
    appended_at: float  # time.monotonic()
    session: tuple[str, datetime] | None  # a record's (session id, created_at), for session_records


class ExperienceStore:
    def __init__(self, data_dir: Path | str, config: StoreConfig | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.config = config or StoreConfig()
        self._wal = WriteAheadLog(DataDir(self.data_dir).wal, fsync=self.config.fsync)
        self._lock = threading.Lock()
        self._state: Literal["new", "open", "closing", "closed"] = "new"
        # table -> id -> (scenario, hash, segment of the shard holding it; None while in memory)
        self._index: dict[str, dict[str, tuple[str, str, int | None]]] = {t: {} for t in _KEYS}
        self._counts: dict[str, dict[str, int]] = {}  # scenario -> table -> rows
        self._mem: dict[tuple[str, str], dict[str, _Mem]] = {}  # (scenario, table) -> id -> row
        self._unflushed = 0
        self._valid_scenarios: set[str] = set()
        self._flush_lock = threading.Lock()
        self._rotated: list[Segment] = []  # rotated out of the WAL, shards not yet written
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None
        self._lock_fd = -1

    # --- lifecycle ---------------------------------------------------------------------------

    def open(self) -> ExperienceStore:
        """Recover what a previous run left in the WAL, rebuild the indexes, start writing."""
        with self._lock:
            if self._state != "new":
                raise StoreClosedError(f"store is {self._state}; open() works once")
        self._wal.directory.mkdir(parents=True, exist_ok=True)
        self._take_dir_lock()
        try:
            shards.clean_tmp(self.data_dir)
            recovered = self._wal.recover()
            for seg in recovered:
                if seg.entries:
                    log.info("recovering %d entries from WAL segment %s", len(seg.entries), seg.path.name)
                    self._write_segment(seg)
                self._wal.remove(seg)
            self._load_indexes()
            first_seq = max([shards.max_shard_seq(self.data_dir), *(s.seq for s in recovered)]) + 1
            self._wal.start(first_seq)
        except BaseException:
            self._release_dir_lock()  # so that open() can be retried
            raise
        with self._lock:
            self._state = "open"
        self._flusher = threading.Thread(target=self._flush_loop, name="reef-flusher", daemon=True)
        self._flusher.start()
        return self

    def close(self) -> None:
        """Flush everything to parquet and stop; later appends raise. Idempotent."""
        with self._lock:
            if self._state in ("closing", "closed"):
                return
            was_open = self._state == "open"
            self._state = "closing"
        try:
            if was_open:
                self._stopping.set()
                self._wake.set()
                assert self._flusher is not None
                self._flusher.join()
                try:
                    self._flush(barrier=True)
                except Exception:  # what is not in parquet is still in the WAL, recovered on open
                    log.exception("final flush failed")
                self._wal.close()
        finally:
            self._release_dir_lock()
            with self._lock:
                self._state = "closed"

    def __enter__(self) -> ExperienceStore:
        return self.open()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _take_dir_lock(self) -> None:
        # Two stores appending to one WAL would interleave segments: refuse the second.
        fd = os.open(self._wal.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"{self.data_dir} is in use by another experience store") from None
        self._lock_fd = fd

    def _release_dir_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _load_indexes(self) -> None:
        for table, (id_col, hash_col) in _KEYS.items():
            files = shards.all_shards(self.data_dir, table)
            if not files:
                continue
            df = (
                pl.scan_parquet([str(p) for p in files], include_file_paths="_path")
                .select(id_col, "scenario", hash_col, "_path")
                .unique(id_col, keep="first")  # a shard written twice repeats ids
                .collect()
            )
            seqs = {str(p): shards.shard_seq(p) for p in files}
            ids, scenarios, hashes, paths = (df[c].to_list() for c in (id_col, "scenario", hash_col, "_path"))
            where = zip(scenarios, hashes, (seqs[p] for p in paths), strict=True)
            self._index[table].update(zip(ids, where, strict=True))
            for scenario, n in df.group_by("scenario").len().iter_rows():
                self._counts.setdefault(scenario, {t: 0 for t in _KEYS})[table] = n

    # --- appending ---------------------------------------------------------------------------

    async def append_record(self, record: Record | RecordRow) -> None:
        """Return once `record` is durable (fsynced, unless the config turns that off)."""
        await self._append_async("records", [record])

    async def append_report(self, report: Report) -> None:
        await self._append_async("reports", [report])

    async def append_records(self, records: Sequence[Record | RecordRow]) -> None:
        """Return once every one of `records` is durable (one WAL write for the batch)."""
        await self._append_async("records", records)

    async def append_reports(self, reports: Sequence[Report]) -> None:
        await self._append_async("reports", reports)

    def append_records_sync(self, records: Sequence[Record]) -> None:
        """Blocking batch append, for tools and benches (one WAL write for the whole batch)."""
        self._append_sync("records", records)

    def append_reports_sync(self, reports: Sequence[Report]) -> None:
        self._append_sync("reports", reports)

    async def _append_async(self, table: Table, objs: Sequence[Record | RecordRow] | Sequence[Report]) -> None:
        entries = self._stage_all(table, objs)
        try:
            await self._wal.append(entries)
        except WalError:
            self._unstage(entries)
            raise

    def _append_sync(self, table: Table, objs: Sequence[Record | RecordRow] | Sequence[Report]) -> None:
        entries = self._stage_all(table, objs)
        try:
            self._wal.append_sync(entries)
        except WalError:
            self._unstage(entries)
            raise

    def _stage_all(self, table: Table, objs: Sequence[Record | RecordRow] | Sequence[Report]) -> list[WalEntry]:
        entries: list[WalEntry] = []
        try:
            for obj in objs:
                entries.append(self._stage(table, obj))
        except BaseException:  # a batch is all or nothing: no half of it may look stored
            self._unstage(entries)
            raise
        return entries

    def _stage(self, table: Table, obj: Record | RecordRow | Report) -> WalEntry:
        """Serialize once and make the row visible in memory; the WAL makes it durable next."""
        id_col, hash_col = _KEYS[table]
        key: str = getattr(obj, id_col)
        scenario = obj.scenario
        if scenario not in self._valid_scenarios:
            self._valid_scenarios.add(shards.validate_scenario(scenario))
        row = obj.row if isinstance(obj, RecordRow) else _SERIALIZERS[table].to_json(obj, by_alias=True)
        session = None if isinstance(obj, Report) else (obj.session_id, obj.created_at)
        mem = _Mem(row, time.monotonic(), session)
        with self._lock:
            if self._state != "open":
                raise StoreClosedError(f"experience store is {self._state}")
            index = self._index[table]
            prev = index.get(key)
            if prev is None:
                self._counts.setdefault(scenario, {t: 0 for t in _KEYS})[table] += 1
            index[key] = (scenario, getattr(obj, hash_col), None)
            rows = self._mem.get((scenario, table))
            if rows is None:
                rows = self._mem[(scenario, table)] = {}
            rows[key] = mem
            self._unflushed += 1
            full = self._unflushed >= self.config.flush_max_records
        if full and not self._wake.is_set():
            self._wake.set()
        return WalEntry(table, row, (scenario, key, mem, prev))

    def _unstage(self, entries: Sequence[WalEntry]) -> None:
        # The WAL refused these: they must not look stored (a retry would be answered from them).
        with self._lock:
            for e in entries:
                scenario, key, mem, prev = e.tag
                rows = self._mem.get((scenario, e.table), {})
                if rows.get(key) is mem:
                    del rows[key]
                    if prev is None:
                        self._index[e.table].pop(key, None)
                        self._counts[scenario][e.table] -= 1
                    else:  # an id appended again (the gateway avoids that): the old row stands
                        self._index[e.table][key] = prev
                self._unflushed -= 1

    # --- reading -----------------------------------------------------------------------------

    def record_index(self, record_id: str) -> tuple[str, str] | None:
        """(scenario, body_hash) of a stored record, or None."""
        where = self._index["records"].get(record_id)
        return None if where is None else where[:2]

    def report_index(self, report_id: str) -> tuple[str, str] | None:
        """(scenario, content_hash) of a stored report, or None."""
        where = self._index["reports"].get(report_id)
        return None if where is None else where[:2]

    def get_record(self, record_id: str) -> Record | None:
        obj = self._get("records", record_id)
        assert obj is None or isinstance(obj, Record)
        return obj

    def get_report(self, report_id: str) -> Report | None:
        obj = self._get("reports", report_id)
        assert obj is None or isinstance(obj, Report)
        return obj

    def _get(self, table: Table, key: str) -> Record | Report | None:
        with self._lock:
            where = self._index[table].get(key)
            if where is None:
                return None
            scenario, _, seq = where
            mem = self._mem.get((scenario, table), {}).get(key)
        if mem is not None:
            return TABLES[table][0].model_validate_json(mem.row)  # type: ignore[return-value]
        # Not in memory any more means its shard was in place before it was dropped from memory;
        # knowing which shard keeps a read at one file however many the scenario has.
        path = shards.shard_path(self.data_dir, scenario, table, seq) if seq is not None else None
        if path is not None and path.exists():
            source = str(path)
        elif shards.has_shards(self.data_dir, scenario, table):
            source = shards.shard_glob(self.data_dir, scenario, table)
        else:
            return None
        df = shards.scan(source, table).filter(pl.col(_KEYS[table][0]) == key).head(1).collect()
        if df.height == 0:
            return None
        model = TABLES[table][0]
        return model.model_validate(df.row(0, named=True))  # type: ignore[return-value]

    def session_records(self, scenario: str, session_id: str) -> list[str]:
        """Ids of the durable records of one session (its turns), oldest first."""
        with self._lock:
            rows = list(self._mem.get((scenario, "records"), {}).items())
        found = {key: m.session[1] for key, m in rows if m.session is not None and m.session[0] == session_id}
        if shards.has_shards(self.data_dir, scenario, "records"):
            df = (pl.scan_parquet(shards.shard_glob(self.data_dir, scenario, "records"))
                  .filter(pl.col("gen_ai.conversation.id") == session_id)
                  .select("record_id", "created_at").collect())
            for record_id, created_at in df.iter_rows():
                found.setdefault(record_id, created_at)
        return sorted(found, key=lambda r: (found[r], r))

    def stats(self) -> dict[str, ScenarioStats]:
        now = time.monotonic()
        with self._lock:
            out = {
                s: ScenarioStats(records=c["records"], reports=c["reports"]) for s, c in self._counts.items()
            }
            for (scenario, table), rows in self._mem.items():
                if not rows:
                    continue
                st = out.setdefault(scenario, ScenarioStats())
                if table == "records":
                    st.unflushed_records = len(rows)
                else:
                    st.unflushed_reports = len(rows)
                # Insertion order: the first row still in memory is the oldest one.
                age = now - next(iter(rows.values())).appended_at
                st.oldest_unflushed_age_s = max(st.oldest_unflushed_age_s, age)
        return out

    # --- flushing ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Move everything appended so far into parquet shards, now."""
        self._flush(barrier=True)

    def _flush(self, *, barrier: bool) -> None:
        with self._flush_lock:
            if barrier:
                self._wal.barrier()
            seg = self._wal.rotate()
            if seg is not None:
                self._rotated.append(seg)
            # Oldest first; a segment whose shards failed stays here and is retried next time.
            while self._rotated:
                seg = self._rotated[0]
                self._write_segment(seg)
                self._wal.remove(seg)
                self._forget(seg)
                self._rotated.pop(0)

    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_s
        while not self._stopping.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self._flush(barrier=False)
            except Exception:
                log.exception("flush failed; the rows stay in the WAL and memory, retrying")
                self._stopping.wait(interval)

    def _write_segment(self, seg: Segment) -> None:
        groups: dict[tuple[str, str], list[bytes]] = {}
        for e in seg.entries:
            if e.tag is not None:
                scenario = e.tag[0]
            else:  # recovered from disk: only the row knows its scenario
                scenario = _scenario_of(e)
                if scenario is None:
                    continue
            groups.setdefault((scenario, e.table), []).append(e.row)
        for (scenario, table), rows in groups.items():
            shards.write_shard(self.data_dir, scenario, table, seg.seq, rows, fsync=self.config.fsync)

    def _forget(self, seg: Segment) -> None:
        with self._lock:
            for e in seg.entries:
                if e.tag is None:
                    continue
                scenario, key, mem, _ = e.tag
                rows = self._mem.get((scenario, e.table))
                # Identity, not key: a newer append of the same id is not flushed yet.
                if rows is not None and rows.get(key) is mem:
                    del rows[key]
                    where = self._index[e.table][key]
                    self._index[e.table][key] = (where[0], where[1], seg.seq)
                self._unflushed -= 1


def _scenario_of(entry: WalEntry) -> str | None:
    try:
        row: dict[str, Any] = orjson.loads(entry.row)
        if entry.table not in TABLES:
            raise ValueError(f"unknown table {entry.table!r}")
        return shards.validate_scenario(row["scenario"])
    except (ValueError, KeyError, TypeError) as exc:
        log.error("dropping unreadable WAL entry of %s: %s", entry.table, exc)
        return None
