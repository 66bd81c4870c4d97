"""Private copies of the default tiny model, for tests that train it or load it with other settings."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers import TINY

READY = TINY / "reef-model.json"  # written last by `tests.helpers.tiny.model.build_tiny`


def copy_tiny(dest: Path) -> Path:
    """A private copy of the embedded tiny model, built first when missing (a fresh clone)."""
    if not READY.exists():
        from tests.helpers.tiny.model import build_tiny

        build_tiny(TINY, seed=0)  # written to a sibling folder and renamed: never seen half-built
    shutil.copytree(TINY, dest)
    return dest
