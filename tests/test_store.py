"""The experience store on real files: durability, recovery, and shards every reader can read."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import datasets
import polars as pl
import pytest

from reef.config import StoreConfig
from reef.core.clock import utcnow
from reef.experience import shards
from reef.experience.store import ExperienceStore, StoreClosedError
from reef.experience.wal import WalEntry, encode, read_segment
from tests.helpers.records import MANUAL, make_record, make_report

pytestmark = pytest.mark.model_free

REPO = Path(__file__).resolve().parents[1]


def parquet_files(data_dir: Path, table: str = "records") -> list[Path]:
    return shards.all_shards(data_dir, table)


def test_append_get_round_trip(tmp_path: Path) -> None:
    records = [make_record(i) for i in range(20)]
    with ExperienceStore(tmp_path, MANUAL) as store:

        async def main() -> None:
            await asyncio.gather(*(store.append_record(r) for r in records))
            await store.append_report(make_report("rep_1", ["rec_00001"], 1.0))

        asyncio.run(main())
        # Before any flush: served from memory, counted as unflushed.
        assert store.get_record("rec_00003") == records[3]
        assert store.record_index("rec_00003") == ("demo", "body_3")
        assert store.report_index("rep_1") == ("demo", "hash_rep_1")
        assert store.get_record("nope") is None and store.record_index("nope") is None
        st = store.stats()["demo"]
        assert (st.records, st.reports, st.unflushed_records, st.unflushed_reports) == (20, 1, 20, 1)
        assert st.oldest_unflushed_age_s > 0
        assert not parquet_files(tmp_path)

        store.flush()
        st = store.stats()["demo"]
        assert (st.records, st.unflushed_records, st.oldest_unflushed_age_s) == (20, 0, 0.0)
        assert len(parquet_files(tmp_path)) == 1
        # After the flush: read back from parquet, equal field by field.
        assert store.get_record("rec_00003") == records[3]
        assert store.get_report("rep_1") is not None
        assert not list((tmp_path / "wal").glob("*.log")) or all(
            p.stat().st_size == 0 for p in (tmp_path / "wal").glob("*.log")
        )

    with ExperienceStore(tmp_path, MANUAL) as store:  # indexes rebuilt from the shards
        assert store.record_index("rec_00019") == ("demo", "body_19")
        assert store.get_record("rec_00019") == records[19]
        assert store.stats()["demo"].records == 20


def test_sync_batches_and_background_flusher(tmp_path: Path) -> None:
    config = StoreConfig(fsync=False, flush_interval_s=0.05, flush_max_records=10)
    with ExperienceStore(tmp_path, config) as store:
        store.append_records_sync([make_record(i) for i in range(25)])
        store.append_reports_sync([make_report("rep_a", ["rec_00000", "rec_00001"], 0.5)])
        deadline = time.monotonic() + 10
        while any(s.unflushed_records or s.unflushed_reports for s in store.stats().values()):
            assert time.monotonic() < deadline, "the flusher never flushed"
            time.sleep(0.02)
        assert store.get_record("rec_00024") is not None
    assert pl.scan_parquet(shards.shard_glob(tmp_path, "demo", "records")).select(pl.len()).collect().item() == 25


def test_segment_numbers_continue_across_restarts(tmp_path: Path) -> None:
    # A fresh WAL segment 1 after a restart would overwrite the old part-00000001 shard.
    for run in range(3):
        with ExperienceStore(tmp_path, MANUAL) as store:
            store.append_records_sync([make_record(run * 10 + i) for i in range(10)])
    assert len(parquet_files(tmp_path)) == 3
    with ExperienceStore(tmp_path, MANUAL) as store:
        assert store.stats()["demo"].records == 30
        # Each id is indexed with its shard, so a read opens that one file.
        assert store._index["records"]["rec_00025"][2] == shards.shard_path(tmp_path, "demo", "records", 3)
        assert store.get_record("rec_00025") == make_record(25, created_at=store.get_record("rec_00025").created_at)


WRITER = [sys.executable, "-m", "tests.helpers.crash_writer"]  # kill -9 it mid-write


def test_sigkill_loses_no_acknowledged_record(tmp_path: Path) -> None:
    proc = subprocess.Popen([*WRITER, str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked: list[str] = []
    deadline = time.monotonic() + 60
    while len(acked) < 400 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acked.append(line.strip())
    os.kill(proc.pid, signal.SIGKILL)
    acked += [line.strip() for line in proc.stdout]  # acknowledged before the kill, still in the pipe
    proc.wait()
    assert len(acked) >= 400, "the child did not get going"
    # The kill left acknowledged rows in the WAL only: recovery has something to do.
    assert any(p.stat().st_size for p in (tmp_path / "wal").glob("*.log"))

    with ExperienceStore(tmp_path, MANUAL) as store:
        missing = [r for r in acked if store.record_index(r) is None]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
        assert store.get_record(acked[-1]) is not None
        assert not any((tmp_path / "experience" / ".tmp").iterdir())
    ids = pl.scan_parquet(shards.shard_glob(tmp_path, "demo", "records")).select("record_id").collect()
    assert set(acked) <= set(ids["record_id"])


def test_torn_wal_tail_is_truncated(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    wal.mkdir(parents=True)
    good = [encode(WalEntry("records", make_record(i).model_dump_json(by_alias=True).encode())) for i in range(3)]
    torn = encode(WalEntry("records", make_record(3).model_dump_json(by_alias=True).encode()))
    bad_crc = b"00000000" + good[0][8:]
    segment = wal / "00000007.log"

    segment.write_bytes(b"".join(good) + torn[: len(torn) // 2])  # crash mid-write: no newline
    assert [e.row for e in read_segment(segment)] == [g.split(b'"row":', 1)[1][:-2] for g in good]
    assert segment.stat().st_size == sum(map(len, good))

    segment.write_bytes(b"".join(good[:2]) + bad_crc + good[2])  # everything after a bad entry is dropped
    assert len(read_segment(segment)) == 2
    assert segment.stat().st_size == len(good[0]) + len(good[1])

    segment.write_bytes(b"".join(good) + torn[:-1])
    with ExperienceStore(tmp_path, MANUAL) as store:
        assert [store.record_index(f"rec_{i:05d}") is not None for i in range(4)] == [True] * 3 + [False]
        assert not segment.exists()  # recovered into a shard named after it
        assert shards.shard_path(tmp_path, "demo", "records", 7).exists()
        store.append_records_sync([make_record(10)])
    # The next segment numbers above the recovered one: no shard is overwritten.
    assert shards.shard_path(tmp_path, "demo", "records", 8).exists()


def test_leftover_tmp_and_shard_written_twice(tmp_path: Path) -> None:
    with ExperienceStore(tmp_path, MANUAL) as store:
        store.append_records_sync([make_record(i) for i in range(5)])
    (shard,) = parquet_files(tmp_path)
    # A crash after writing a segment's shard but before deleting the segment rewrites it:
    # same name, same content. Simulate the worst case, the same rows under a second name.
    shutil.copy(shard, shard.with_name("part-00000099.parquet"))
    tmp = tmp_path / "experience" / ".tmp"
    (tmp / "demo.records.part-00000100.dead.parquet").write_bytes(b"PAR1 half a shard")

    glob = shards.shard_glob(tmp_path, "demo", "records")
    assert pl.scan_parquet(glob).select(pl.len()).collect().item() == 10  # .tmp is not under the glob
    with ExperienceStore(tmp_path, MANUAL) as store:
        assert store.stats()["demo"].records == 5
        assert not any(tmp.iterdir())  # cleaned on open
        store.append_records_sync([make_record(5)])
    assert shards.shard_path(tmp_path, "demo", "records", 100).exists()


def test_shards_read_by_datasets_and_polars(tmp_path: Path) -> None:
    created = utcnow() - timedelta(hours=1)
    with ExperienceStore(tmp_path, MANUAL) as store:
        store.append_records_sync([make_record(i, created_at=created) for i in range(4)])
        store.flush()
        store.append_records_sync([make_record(i) for i in range(4, 6)])
    glob = shards.shard_glob(tmp_path, "demo", "records")
    cache = str(tmp_path / "hf-cache")

    ds = datasets.load_dataset("parquet", data_files=glob, split="train", cache_dir=cache)
    assert ds.num_rows == 6
    # The features are the schema's, nested types included, read back from the shards' metadata.
    assert ds.features == datasets.Features(dict(shards.TABLES["records"][1]))
    row = next(r for r in ds if r["record_id"] == "rec_00000")
    assert row["choices"][0]["token_ids"] == [0, 1, 7] and row["gen_ai.conversation.id"] == "sess_0"

    # The dataset card makes the scenario folder loadable like a hub repository.
    by_card = datasets.load_dataset(str(tmp_path / "experience" / "demo"), "records", split="train",
                                    cache_dir=cache)
    assert by_card.num_rows == 6

    df = pl.scan_parquet(glob).filter(pl.col("created_at") < utcnow() - timedelta(minutes=30)).collect()
    assert df.height == 4
    assert df.schema["created_at"] == pl.Datetime("us", "UTC")


def test_rejects_bad_scenarios_second_store_and_closed_store(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path, MANUAL).open()
    with pytest.raises(ValueError):
        store.append_records_sync([make_record(0, scenario="../escape")])
    with pytest.raises(ValueError):
        store.append_records_sync([make_record(0, scenario=".tmp")])
    with pytest.raises(ValueError):  # a batch is all or nothing
        store.append_records_sync([make_record(1), make_record(2, scenario="a/b")])
    assert store.record_index("rec_00001") is None and store.stats()["demo"].records == 0
    with pytest.raises(RuntimeError, match="in use"):
        ExperienceStore(tmp_path, MANUAL).open()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        store.append_records_sync([make_record(0)])
    with pytest.raises(StoreClosedError):
        asyncio.run(store.append_record(make_record(1)))


def test_reads_never_miss_while_flushing(tmp_path: Path) -> None:
    # Rows move from memory to shards under the reader's feet: every acknowledged id stays readable.
    config = StoreConfig(fsync=False, flush_interval_s=0.01, flush_max_records=50)
    acked: list[str] = []
    misses: list[str] = []
    done = threading.Event()

    def reader(store: ExperienceStore) -> None:
        while not done.is_set():
            for record_id in acked[-20:]:
                if store.get_record(record_id) is None:
                    misses.append(record_id)

    with ExperienceStore(tmp_path, config) as store:
        thread = threading.Thread(target=reader, args=(store,))
        thread.start()

        async def one(i: int) -> None:
            await store.append_record(make_record(i))
            acked.append(f"rec_{i:05d}")

        async def main() -> None:
            for start in range(0, 1500, 50):
                await asyncio.gather(*(one(i) for i in range(start, start + 50)))

        asyncio.run(main())
        done.set()
        thread.join()
        assert len(parquet_files(tmp_path)) >= 2  # the flusher did run meanwhile
    assert not misses


def test_rows_arrow_rejects_still_convert() -> None:
    report = make_report("rep_x", ["rec_1"], 0.5)
    good = report.model_dump_json(by_alias=True).encode()
    odd = good.replace(b'"score":0.5', b'"score":"0.5"')  # the model reads it, arrow's parser does not
    assert odd != good
    assert shards.rows_to_arrow("reports", [odd]).equals(shards.rows_to_arrow("reports", [good]))
