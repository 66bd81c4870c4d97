"""The experience store: every record and report is durable in the WAL before it is acknowledged,
then moved to parquet shards in the background.

A row lives in memory from its append until its shard exists, so reads never miss the window
between the two; ids (with the hash the gateway checks retries against) are indexed in memory for
the store's whole life, rebuilt on open from the shards.

Several gateways on one data dir (issue 26) each open a store with their own `store.partition`: its
own WAL folder and lock, its own shard names and `.tmp` folder (reef.experience.shards), so two of
them never take each other's lock or write each other's files. Readers of the shards read every
partition. A store indexes every partition's shards on open, and a partitioned one also indexes the
shards the others flush later: after each of its own flush rounds, and at once when
`locate_record` misses (a report through this gateway for a record another one recorded is found
once that gateway has flushed it, within its `store.flush_interval_s`). A partitioned store that
finds the one-gateway WAL (`wal/`) unlocked with segments in it, left by a crash before the data
dir was shared, moves them into shards first, so switching a gateway to a partition loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
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
        self.partition = shards.validate_partition(self.config.partition)
        self._wal = WriteAheadLog(DataDir(self.data_dir).store_wal(self.partition), fsync=self.config.fsync)
        self._lock = threading.Lock()
        self._state: Literal["new", "open", "closing", "closed"] = "new"
        # table -> id -> (scenario, hash, the shard holding it; None while in memory). One Path
        # object per shard, shared by its rows.
        self._index: dict[str, dict[str, tuple[str, str, Path | None]]] = {t: {} for t in _KEYS}
        self._indexed: set[str] = set()  # shards read into the index from disk
        self._refresh_lock = threading.Lock()
        self._refresh_started = 0.0  # time.monotonic() the latest look at other partitions' shards began
        self._watch = shards.ShardWatch(self.data_dir, self.partition)
        # Called with (table, shards) for the other partitions' shards a refresh indexed: the gateway
        # learns their sessions from them (reef.server.seed_sessions).
        self.on_their_shards: Callable[[str, list[Path]], None] | None = None
        self._counts: dict[str, dict[str, int]] = {}  # scenario -> table -> rows
        self._mem: dict[tuple[str, str], dict[str, _Mem]] = {}  # (scenario, table) -> id -> row
        self._unflushed = 0
        self._valid_scenarios: set[str] = set()
        self._flush_lock = threading.Lock()
        self._rotated: list[Segment] = []  # rotated out of the WAL, shards not yet written
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def open(self) -> ExperienceStore:
        """Recover what a previous run left in the WAL, rebuild the indexes, start writing."""
        with self._lock:
            if self._state != "new":
                raise StoreClosedError(f"store is {self._state}; open() works once")
        if not self._wal.try_lock():
            hint = "" if self.partition else "; several gateways on one data dir: give each a store.partition"
            raise RuntimeError(f"{self._wal.directory} is in use by another experience store{hint}")
        try:
            shards.clean_tmp(self.data_dir, self.partition)
            if self.partition is not None:
                self._adopt_one_gateway_wal()
            recovered = self._recover(self._wal, self.partition)
            for table in _KEYS:
                self._index_shards(table, shards.all_shards(self.data_dir, table))
            first_seq = max([shards.max_shard_seq(self.data_dir, self.partition), *(s.seq for s in recovered)]) + 1
            self._wal.start(first_seq)
        except BaseException:
            self._wal.unlock()  # so that open() can be retried
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
            self._wal.unlock()
            with self._lock:
                self._state = "closed"

    def __enter__(self) -> ExperienceStore:
        return self.open()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _recover(self, wal: WriteAheadLog, partition: str | None) -> list[Segment]:
        """Move what `wal` holds into `partition`'s shards, then delete its segments."""
        recovered = wal.recover()
        for seg in recovered:
            if seg.entries:
                log.info("recovering %d entries from WAL segment %s", len(seg.entries), seg.path)
                self._write_segment(seg, partition)
            wal.remove(seg)
        return recovered

    def _adopt_one_gateway_wal(self) -> None:
        # The one-gateway WAL, when no store holds it: what a crash left there before this gateway
        # took a partition. Its lock is held meanwhile, so a one-gateway store cannot open beside.
        wal = WriteAheadLog(DataDir(self.data_dir).wal, fsync=self.config.fsync)
        if not wal.segments_on_disk():
            return
        if not wal.try_lock():  # a one-gateway store writes it now: its own to recover
            return
        try:
            shards.clean_tmp(self.data_dir)
            self._recover(wal, None)
        finally:
            wal.unlock()

    def _index_shards(self, table: str, files: Sequence[Path]) -> None:
        """Index the rows of `files` whose ids are not indexed yet (the first one stays, as readers keep it)."""
        files = [p for p in files if str(p) not in self._indexed]
        if not files:
            return
        df = shards.read_keys(files, *_KEYS[table])
        by_name = {str(p): p for p in files}
        ids, scenarios, hashes, paths = (df[c].to_list() for c in df.columns)
        rows = zip(ids, zip(scenarios, hashes, (by_name[p] for p in paths), strict=True), strict=True)
        with self._lock:
            index = self._index[table]
            if index:  # a look at other partitions' new shards: few rows, some maybe known
                fresh = [(key, where) for key, where in rows if key not in index]
                index.update(fresh)
                counts: dict[str, int] = {}
                for _, (scenario, _, _) in fresh:
                    counts[scenario] = counts.get(scenario, 0) + 1
            else:  # on open: every id is new, and there may be millions
                index.update(rows)
                counts = dict(df.group_by("scenario").len().iter_rows())
            for scenario, n in counts.items():
                self._counts.setdefault(scenario, {t: 0 for t in _KEYS})[table] += n
            self._indexed.update(by_name)

    def refresh(self) -> None:
        """Index the shards other partitions flushed since the last look (a partitioned store)."""
        asked = time.monotonic()
        with self._refresh_lock:
            if self._refresh_started > asked:  # a look that began after this call covered it
                return
            self._refresh_started = time.monotonic()
            for table in _KEYS:
                theirs = [p for p in self._watch.new_shards(table) if str(p) not in self._indexed]
                self._index_shards(table, theirs)
                if theirs and self.on_their_shards is not None:
                    try:
                        self.on_their_shards(table, theirs)
                    except Exception:  # what it feeds is a convenience; the index is what must hold
                        log.exception("on_their_shards failed for %d shards of %s", len(theirs), table)

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

    async def locate_record(self, record_id: str) -> tuple[str, str] | None:
        """`record_index`, and for a partitioned store that does not know the id, the same after a
        look at the shards the other partitions flushed since its last look: a record another
        gateway recorded is found once that gateway flushed it."""
        where = self.record_index(record_id)
        if where is None and self.partition is not None:
            await asyncio.to_thread(self.refresh)
            where = self.record_index(record_id)
        return where

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
            scenario, _, path = where
            mem = self._mem.get((scenario, table), {}).get(key)
        if mem is not None:
            return TABLES[table][0].model_validate_json(mem.row)  # type: ignore[return-value]
        # Not in memory any more means its shard was in place before it was dropped from memory;
        # knowing which shard keeps a read at one file however many the scenario has.
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
                self._write_segment(seg, self.partition)
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
            if self.partition is not None:
                try:
                    self.refresh()
                except Exception:  # a shard being replaced, a mount away: the next round looks again
                    log.exception("indexing other partitions' shards failed; retrying")

    def _write_segment(self, seg: Segment, partition: str | None) -> None:
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
            shards.write_shard(self.data_dir, scenario, table, seg.seq, rows, fsync=self.config.fsync,
                               partition=partition)

    def _forget(self, seg: Segment) -> None:
        paths: dict[tuple[str, str], Path] = {}
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
                    path = paths.get((scenario, e.table))
                    if path is None:
                        path = paths[(scenario, e.table)] = shards.shard_path(
                            self.data_dir, scenario, e.table, seg.seq, self.partition)
                    self._index[e.table][key] = (where[0], where[1], path)
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
