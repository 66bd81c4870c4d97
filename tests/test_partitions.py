"""Several gateways on one data dir (issue 26 part 3): each experience store writes its own partition
(`store.partition`: its own WAL, lock and shard names), and every reader reads the union: `load`,
snapshots, polars, `datasets` by the dataset card, and a store that did not record the row."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import fsspec
import httpx
import polars as pl
import pytest

from reef.config import ServeConfig, StoreConfig
from reef.experience import load, shards
from reef.experience.store import ExperienceStore
from reef.experience.wal import WalEntry, encode
from reef.gateway.admission import ScenarioAdmission
from reef.gateway.app import create_app
from reef.gateway.sessions import SessionIndex
from reef.gateway.state import GatewayState
from reef.gateway.transport.replicas import Replicas
from reef.recipe.snapshot import ExperienceSpec, Snapshot
from reef.server import seed_sessions
from reef.serving.routing import Routes
from tests.helpers.records import MANUAL, make_record, make_report

pytestmark = pytest.mark.model_free

REPO = Path(__file__).resolve().parents[1]


def store(data_dir: Path, partition: str | None, **kw: object) -> ExperienceStore:
    return ExperienceStore(data_dir, MANUAL.model_copy(update={"partition": partition, **kw}))


def test_two_partitions_write_apart_and_read_as_one(tmp_path: Path) -> None:
    with store(tmp_path, "gw-a") as a, store(tmp_path, "gw-b") as b, store(tmp_path, None) as one:
        # Each holds its own WAL lock: a second writer of a partition is refused, not interleaved.
        with pytest.raises(RuntimeError, match="in use"):
            store(tmp_path, "gw-a").open()
        a.append_records_sync([make_record(i) for i in range(0, 4)])
        b.append_records_sync([make_record(i) for i in range(4, 8)])
        one.append_records_sync([make_record(8)])
        # A report through b for a record a recorded, and one through a for b's.
        b.append_reports_sync([make_report("rep_b", ["rec_00001"], 1.0)])
        a.append_reports_sync([make_report("rep_a", ["rec_00005"], 0.0)])
        for s in (a, b, one):
            s.flush()
    # The same segment number in three partitions: three files, none overwritten.
    names = sorted(p.name for p in shards.all_shards(tmp_path, "records"))
    assert names == ["part-00000001.parquet", "part-gw-a-00000001.parquet", "part-gw-b-00000001.parquet"]
    assert (tmp_path / "wal" / "partitions" / "gw-a" / "LOCK").exists() and not list((tmp_path / "wal").rglob("*.log"))

    frame = load("demo", tmp_path).collect()
    assert sorted(frame["record_id"]) == [f"rec_{i:05d}" for i in range(9)]
    scores = dict(zip(frame["record_id"], frame["score"], strict=True))
    assert (scores["rec_00001"], scores["rec_00005"]) == (1.0, 0.0)  # reports joined across partitions

    snap = Snapshot.create("demo", tmp_path, ExperienceSpec(scenario="demo", needs_reports=False),
                           root=tmp_path / "snaps", ledger_root=tmp_path / "ledger")
    assert sorted(snap.record_ids) == [f"rec_{i:05d}" for i in range(9)]

    by_card = datasets.load_dataset(str(tmp_path / "experience" / "demo"), "records", split="train",
                                    cache_dir=str(tmp_path / "hf-cache"))
    assert by_card.num_rows == 9
    assert pl.scan_parquet(shards.shard_glob(tmp_path, "demo", "reports")).select(pl.len()).collect().item() == 2

    # Reopened, each partition continues above its own segments; each store indexes the union.
    with store(tmp_path, "gw-b") as b:
        assert b.stats()["demo"].records == 9 and b.stats()["demo"].reports == 2
        got = b.get_record("rec_00002")
        assert got is not None and got == make_record(2, created_at=got.created_at)
        b.append_records_sync([make_record(9)])
    assert shards.shard_path(tmp_path, "demo", "records", 2, "gw-b").exists()


def test_a_store_finds_what_another_partition_flushed(tmp_path: Path) -> None:
    with store(tmp_path, "a") as a, store(tmp_path, "b") as b:
        sessions = SessionIndex()  # the gateway learns the others' sessions from their new shards
        b.on_their_shards = lambda table, files: seed_sessions(sessions, tmp_path, files)
        a.append_records_sync([make_record(1, reply_hashes=["reply-1"])])
        # Not flushed yet: only a knows it (the bound is a's flush interval).
        assert asyncio.run(b.locate_record("rec_00001")) is None
        a.flush()
        assert b.record_index("rec_00001") is None  # b has not looked since
        assert asyncio.run(b.locate_record("rec_00001")) == ("demo", "body_1")
        assert len(sessions) == 1
        assert b.get_record("rec_00001") is not None and b.stats()["demo"].records == 1
        # b's session lookup reads every partition's shards too.
        assert b.session_records("demo", "sess_1") == ["rec_00001"]
        assert asyncio.run(b.locate_record("rec_nope")) is None


def test_only_folders_that_changed_are_listed_again(tmp_path: Path) -> None:
    folder = tmp_path / "experience" / "demo" / "records"
    with store(tmp_path, "a") as a, store(tmp_path, "b") as b:
        a.append_records_sync([make_record(1)])
        a.flush()
        os.utime(folder, ns=(10**18, 10**18))  # long before now: listing it once tells all
        assert asyncio.run(b.locate_record("rec_00001")) is not None
        # A file that appears without changing the folder's mtime (no rename into it) is not seen...
        other = make_record(2).model_dump_json(by_alias=True).encode()
        shards.write_shard(tmp_path, "demo", "records", 99, [other], fsync=False, partition="c")
        os.utime(folder, ns=(10**18, 10**18))
        assert asyncio.run(b.locate_record("rec_00002")) is None
        # ... a shard renamed in changes it, and the folder is listed again.
        a.append_records_sync([make_record(3)])
        a.flush()
        assert asyncio.run(b.locate_record("rec_00003")) is not None
        assert b.record_index("rec_00002") is not None


def test_a_partitioned_flusher_indexes_the_others(tmp_path: Path) -> None:
    with store(tmp_path, "a") as a, store(tmp_path, "b", flush_interval_s=0.05) as b:
        a.append_records_sync([make_record(i) for i in range(3)])
        a.flush()
        deadline = time.monotonic() + 10
        while b.record_index("rec_00002") is None:
            assert time.monotonic() < deadline, "b's flusher never looked at a's shards"
            time.sleep(0.02)
        assert b.stats()["demo"].records == 3


def test_the_one_gateway_layout_still_reads_and_its_wal_is_adopted(tmp_path: Path) -> None:
    with store(tmp_path, None) as one:  # today's layout: wal/, part-<segment>.parquet
        one.append_records_sync([make_record(i) for i in range(3)])
    # A crash of the one gateway left a segment in wal/; then the data dir is shared.
    row = make_record(3).model_dump_json(by_alias=True).encode()
    (tmp_path / "wal" / "00000005.log").write_bytes(encode(WalEntry("records", row)))
    with store(tmp_path, "a") as a:
        assert [a.record_index(f"rec_{i:05d}") is not None for i in range(4)] == [True] * 4
        assert not list((tmp_path / "wal").glob("*.log"))  # moved into the one-gateway shard it names
        assert shards.shard_path(tmp_path, "demo", "records", 5).exists()
        a.append_records_sync([make_record(4)])
        # While a one-gateway store writes wal/, a partitioned store opening leaves it alone.
        with store(tmp_path, None) as one:
            one.append_records_sync([make_record(5)])
            with store(tmp_path, "b") as b:
                assert b.record_index("rec_00005") is None
    assert sorted(load("demo", tmp_path).collect()["record_id"]) == [f"rec_{i:05d}" for i in range(6)]


WRITER = [sys.executable, "-m", "tests.helpers.crash_writer"]  # kill -9 it mid-write


def test_kill_9_of_one_gateway_loses_nothing_either_acknowledged(tmp_path: Path) -> None:
    survivor = store(tmp_path, "b", flush_interval_s=0.05).open()
    proc = subprocess.Popen([*WRITER, str(tmp_path), "--partition", "a", "--concurrency", "16"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    theirs: list[str] = []
    ours: list[str] = []
    try:
        deadline = time.monotonic() + 60
        # Killed once it acknowledged 200 and flushed some: both its shards and its WAL hold rows.
        while (len(theirs) < 200 or not list(tmp_path.glob("experience/demo/records/part-a-*"))) \
                and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            theirs.append(line.strip())
            if len(theirs) % 8 == 0:  # the survivor writes beside it, into the same folders
                i = 500_000 + len(ours)
                survivor.append_records_sync([make_record(i)])
                ours.append(f"rec_{i:05d}")
        os.kill(proc.pid, signal.SIGKILL)
        theirs += [line.strip() for line in proc.stdout]  # acknowledged before the kill, still in the pipe
    finally:
        proc.kill()
        proc.wait()
    assert len(theirs) >= 200, "the writer did not get going"
    # The kill left acknowledged rows in the dead one's WAL only: its restart has something to do.
    assert any(p.stat().st_size for p in (tmp_path / "wal" / "partitions" / "a").glob("*.log"))
    # The survivor writes on; its lock was never the dead one's.
    survivor.append_records_sync([make_record(600_000)])
    ours.append("rec_600000")
    survivor.flush()
    # What the dead one flushed reads already; the rest waits in its WAL for its restart.
    flushed = set(load("demo", tmp_path).collect()["record_id"])
    assert set(ours) <= flushed and flushed & set(theirs)
    survivor.close()

    with store(tmp_path, "a") as restarted:
        assert all(restarted.record_index(r) is not None for r in theirs)
    ids = load("demo", tmp_path).collect()["record_id"].to_list()
    missing = (set(theirs) | set(ours)) - set(ids)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
    assert len(ids) == len(set(ids))  # record ids are unique across partitions


class Gateway:
    """A gateway's app in this process (reports need no engine), with its own store's partition."""

    def __init__(self, data_dir: Path, partition: str) -> None:
        config = ServeConfig.model_validate({"data_dir": str(data_dir), "model": "stand-in",
                                             "store": {"partition": partition}})
        self.store = store(data_dir, partition).open()
        self.state = GatewayState(config=config, store=self.store, upstream=Replicas(["http://127.0.0.1:9"]),
                                  routes=Routes("stand-in"))
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(self.state)),
                                      base_url="http://gateway")

    async def close(self) -> None:
        await self.http.aclose()
        self.store.close()


def test_a_report_through_the_other_gateway(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = Gateway(tmp_path, "a"), Gateway(tmp_path, "b")
        try:
            await a.store.append_record(make_record(1))

            async def report() -> httpx.Response:
                return await b.http.post("/reef/report", json={"agent_record_id": "rec_00001", "score": 1.0},
                                         headers={"x-reef-scenario": "demo"})

            early = await report()  # a has not flushed: b cannot know the record yet
            assert early.status_code == 404 and early.json()["error"]["code"] == "record_not_found"
            a.store.flush()
            late = await report()
            assert late.status_code == 200, late.text
            got = await b.http.get("/reef/records/rec_00001")
            assert got.status_code == 200 and got.json()["record_id"] == "rec_00001"
            other = await b.http.post("/reef/report", json={"agent_record_id": "rec_00001", "score": 1.0},
                                      headers={"x-reef-scenario": "other"})
            assert other.status_code == 404  # scenarios still do not see each other
        finally:
            await a.close()
            await b.close()
        frame = load("demo", tmp_path).collect()
        assert frame.filter(pl.col("record_id") == "rec_00001")["score"].to_list() == [1.0]

    asyncio.run(main())


def test_a_partition_name_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="partition"):
        StoreConfig(partition="../up")
    with pytest.raises(ValueError, match="partition"):
        ExperienceStore(tmp_path, MANUAL.model_copy(update={"partition": ".tmp"}))
    assert shards.shard_partition(Path("part-gw-1-00000012.parquet")) == ("gw-1", 12)
    assert shards.shard_partition(Path("part-00000012.parquet")) == (None, 12)
    assert shards.shard_partition(Path("README.md")) is None


def test_load_reads_the_union_from_an_fsspec_url(tmp_path: Path) -> None:
    local = tmp_path / "data"
    with store(local, "a") as a, store(local, "b") as b:
        a.append_records_sync([make_record(i) for i in range(3)])
        b.append_records_sync([make_record(i) for i in range(3, 5)])
        b.append_reports_sync([make_report("rep_1", ["rec_00001"], 1.0)])
    (local / "releases" / "demo").mkdir(parents=True)
    (local / "releases" / "demo" / "HEAD").write_text("demo@r3\n")
    expected = load("demo", local).collect()
    assert expected.height == 5 and load("demo", local).head_seq == 3

    # The data dir synced to an object store: fsspec's in-memory one, a filesystem with no local path.
    fs = fsspec.filesystem("memory")
    fs.put(str(local / "experience"), f"/{tmp_path.name}/experience", recursive=True)
    fs.put(str(local / "releases"), f"/{tmp_path.name}/releases", recursive=True)
    for url in (f"memory://{tmp_path.name}", local.as_uri()):
        exp = load("demo", url)
        assert exp.head_seq == 3
        assert exp.collect().equals(expected), url
        assert exp.to_dataset().num_rows == 5
    assert load("demo", "memory://nothing-here").collect().height == 0


def test_staging_folders_are_not_scenarios(tmp_path: Path) -> None:
    with store(tmp_path, "a") as a:
        a.append_records_sync([make_record(1)])
    assert (tmp_path / "experience" / ".tmp-a").is_dir()
    config = ServeConfig.model_validate({"data_dir": str(tmp_path), "model": "stand-in"})
    known = ScenarioAdmission.seeded(config, []).known
    assert "demo" in known and not [k for k in known if k.startswith(".")]
