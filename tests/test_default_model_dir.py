"""Where a process finds the embedded default model: its working folder's `data/models/...`, else the
nearest folder above holding one (an example's folder inside a checkout), else the working folder's
(built there on first use)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.config.serve import DEFAULT_MODEL_DIR, find_default_model

pytestmark = pytest.mark.model_free


def _model(root: Path) -> Path:
    folder = root / DEFAULT_MODEL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_the_default_model_is_found_in_the_working_folder_or_above(tmp_path: Path) -> None:
    example = tmp_path / "checkout" / "examples" / "reviews"
    example.mkdir(parents=True)
    assert find_default_model(example) == DEFAULT_MODEL_DIR  # none anywhere: built in the working folder
    above = _model(tmp_path / "checkout")
    assert find_default_model(example) == above.resolve()
    assert find_default_model(tmp_path / "checkout") == DEFAULT_MODEL_DIR  # here: the relative path, as before
    (example / DEFAULT_MODEL_DIR).mkdir(parents=True)  # a folder without a model in it is not one
    assert find_default_model(example) == above.resolve()
    _model(example)
    assert find_default_model(example) == DEFAULT_MODEL_DIR
