"""Folders that state depends on (snapshots, candidates) and the consumed ledger are replaced
whole and durably: at no moment of a replace is the target missing or half-written."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from reef.core import durable
from reef.recipe import ledger

pytestmark = pytest.mark.model_free


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_replace_dir_never_leaves_the_target_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, staging = tmp_path / "snap", tmp_path / ".snap.tmp"
    target.mkdir()
    (target / "records.parquet").write_text("old")
    staging.mkdir()
    (staging / "records.parquet").write_text("new")
    (staging / "manifest.json").write_text("{}")
    seen: list[dict[str, str]] = []
    sync = durable.fsync_path

    def watching(path: Path) -> None:  # every durability point is a moment a crash could hit
        seen.append(_tree(target) if target.exists() else {})
        sync(path)

    monkeypatch.setattr(durable, "fsync_path", watching)
    durable.replace_dir(staging, target)
    assert _tree(target) == {"manifest.json": "{}", "records.parquet": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]  # nothing left beside it
    assert all(tree in ({"records.parquet": "old"}, _tree(target)) for tree in seen), seen


def test_a_crash_after_the_swap_keeps_the_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, staging = tmp_path / "cand", tmp_path / ".cand.tmp"
    for folder, text in ((target, "old"), (staging, "new")):
        folder.mkdir()
        (folder / "model.safetensors").write_text(text)

    def crash(path: Path, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # killed while removing the old folder

    monkeypatch.setattr(durable.shutil, "rmtree", crash)
    with pytest.raises(KeyboardInterrupt):
        durable.replace_dir(staging, target)
    assert _tree(target) == {"model.safetensors": "new"}


def test_the_ledger_is_written_through_the_durable_primitive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    real = ledger.replace_atomically

    def spy(path: Path, data: bytes, **kwargs: object) -> None:
        calls.append(path)
        real(path, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger, "replace_atomically", spy)
    written = ledger.mark_consumed(tmp_path, "s", "h" * 64, ["rec-1", "rec-2"], "cand")
    assert calls == [written]
    assert sorted(pl.read_parquet(written)["record_id"]) == ["rec-1", "rec-2"]
    assert ledger.mark_consumed(tmp_path, "s", "h" * 64, ["rec-1"], "cand2") == written  # the first round wins
    assert sorted(ledger.consumed(tmp_path, "s")["record_id"]) == ["rec-1", "rec-2"]
