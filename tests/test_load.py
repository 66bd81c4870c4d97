"""`reef.experience.load`: records joined with their reports, filtered, deduplicated, aged."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from reef.experience import ExperienceStore, load, shards
from reef.experience.load import EXPERIENCE_FEATURES
from tests.helpers.records import MANUAL, make_record, make_report

pytestmark = pytest.mark.model_free

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def hours(n: float) -> datetime:
    return T0 + timedelta(hours=n)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("load")
    # (release, hour, content, session); content "A" repeats: records 2 and 4 duplicate record 0.
    layout = [("r0", 0, "A", "sess_a"), ("r1", 1, "B", "sess_a"), ("r1", 2, "A", "sess_b"),
              ("r2", 3, "C", "sess_b"), ("r2", 4, "A", "sess_b")]
    records = [
        make_record(i, release=f"demo@{rel}", created_at=hours(h), content_hash=content, session_id=sess)
        for i, (rel, h, content, sess) in enumerate(layout)
    ]
    with ExperienceStore(root, MANUAL) as store:
        # Appended out of time order, in two shards: order on disk must not matter.
        store.append_records_sync(records[3:])
        store.flush()
        store.append_records_sync(records[:3])
        store.append_records_sync([make_record(9, scenario="other", release="other@r7")])
        store.append_reports_sync([
            make_report("rep_late", ["rec_00001"], 0.9, created_at=hours(6), feedback="better"),
            make_report("rep_early", ["rec_00001"], 0.2, created_at=hours(5), feedback="meh"),
            make_report("rep_pair", ["rec_00003", "rec_00004", "rec_00003"], 0.7, created_at=hours(5)),
        ])
    return root


def rows(exp_or_frame: object) -> dict[str, dict[str, object]]:
    df = exp_or_frame.collect() if hasattr(exp_or_frame, "collect") else exp_or_frame  # type: ignore[union-attr]
    return {r["record_id"]: r for r in df.iter_rows(named=True)}


def test_reports_are_joined_latest_wins(data_dir: Path) -> None:
    got = rows(load("demo", data_dir))
    assert list(got) == [f"rec_{i:05d}" for i in range(5)]  # one scenario, ordered by created_at
    assert (got["rec_00001"]["score"], got["rec_00001"]["feedback"], got["rec_00001"]["n_reports"]) == (
        0.9, "better", 2)
    assert (got["rec_00003"]["score"], got["rec_00004"]["score"]) == (0.7, 0.7)
    assert got["rec_00003"]["n_reports"] == 1  # a report naming a record twice counts once
    assert (got["rec_00000"]["score"], got["rec_00000"]["n_reports"]) == (None, 0)


def test_duplicates_and_staleness(data_dir: Path) -> None:
    got = rows(load("demo", data_dir))
    assert [r["is_duplicate"] for r in got.values()] == [False, False, True, False, True]
    # No HEAD file: the newest release in the data (r2) is the head.
    assert [r["staleness"] for r in got.values()] == [2, 1, 1, 0, 0]
    assert [r["staleness"] for r in rows(load("demo", data_dir, head_seq=4)).values()] == [4, 3, 3, 2, 2]

    head = data_dir / "releases" / "demo" / "HEAD"
    head.parent.mkdir(parents=True, exist_ok=True)
    head.write_text("demo@r3\n")
    try:
        exp = load("demo", data_dir)
        assert exp.head_seq == 3
        assert [r["staleness"] for r in rows(exp).values()] == [3, 2, 2, 1, 1]
        assert load("demo", data_dir, head_seq=2).head_seq == 2  # the argument wins over HEAD
    finally:
        head.unlink()


def test_filters(data_dir: Path) -> None:
    assert list(rows(load("demo", data_dir, since=hours(1), until=hours(3)))) == ["rec_00001", "rec_00002"]
    naive = hours(3).replace(tzinfo=None)  # naive datetimes are UTC
    assert list(rows(load("demo", data_dir, since=naive))) == ["rec_00003", "rec_00004"]
    assert list(rows(load("demo", data_dir, release="demo@r0"))) == ["rec_00000"]
    assert list(rows(load("demo", data_dir, release=["demo@r0", "demo@r2"]))) == [
        "rec_00000", "rec_00003", "rec_00004"]
    # Records nobody reported on have no score: min_score drops them.
    assert list(rows(load("demo", data_dir, min_score=0.5))) == ["rec_00001", "rec_00003", "rec_00004"]
    assert list(rows(load("demo", data_dir, session="sess_a"))) == ["rec_00000", "rec_00001"]
    # Duplicates and staleness are computed before filtering: the original being filtered out
    # does not make a duplicate new.
    r2 = rows(load("demo", data_dir, release="demo@r2"))
    assert r2["rec_00004"]["is_duplicate"] and r2["rec_00003"]["staleness"] == 0
    assert list(rows(load("other", data_dir))) == ["rec_00009"]


def test_shards_written_twice_count_once(data_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    for table in ("records", "reports"):
        for i, shard in enumerate(shards.all_shards(copy, table)):
            shutil.copy(shard, shard.with_name(f"part-{90 + i:08d}.parquet"))
    df = load("demo", copy).collect()
    assert df.height == 5 and df["record_id"].is_unique().all()
    assert rows(df)["rec_00001"]["n_reports"] == 2
    assert load("demo", copy).collect().equals(load("demo", data_dir).collect())


def test_lazy_scans_parquet(data_dir: Path) -> None:
    lf = load("demo", data_dir).lazy()
    assert isinstance(lf, pl.LazyFrame)
    assert "parquet" in lf.explain().lower()


def test_to_dataset_keeps_nested_types(data_dir: Path) -> None:
    ds = load("demo", data_dir, release="demo@r1").to_dataset()
    assert ds.features == EXPERIENCE_FEATURES
    assert ds.num_rows == 2
    row = ds[0]
    assert row["choices"][0]["token_ids"] == [1, 2, 7] and row["choices"][0]["logprobs"] == [-0.5, -0.25, -1.0]
    assert row["messages"][0]["content"] == "question 1" and row["tags"] == [{"name": "k", "value": "v"}]
    assert row["score"] == 0.9 and row["is_duplicate"] is False


def test_empty_scenario_has_the_schema(tmp_path: Path) -> None:
    exp = load("nothing", tmp_path)
    df = exp.collect()
    assert df.height == 0 and df.columns == list(EXPERIENCE_FEATURES)
    assert df.schema["created_at"] == pl.Datetime("us", "UTC")
    ds = exp.to_dataset()
    assert ds.num_rows == 0 and ds.features == EXPERIENCE_FEATURES
    with pytest.raises(ValueError):
        load("../etc", tmp_path)
