"""Helpers shared by the recipe and DVC pipeline tests."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "data" / "models" / "tiny"
READY = TINY / "reef-model.json"  # written last by `reef.model.tiny.build_tiny`


def copy_tiny(dest: Path, wait_s: float = 900.0) -> Path:
    """A private copy of the embedded tiny model; waits while another process (re)builds it
    rather than building it here (a build takes minutes of a shared CPU)."""
    deadline = time.monotonic() + wait_s
    while True:
        if READY.exists():
            try:
                shutil.copytree(TINY, dest)
                if (dest / "model.safetensors").exists() and (dest / "tokenizer.json").exists():
                    return dest
            except (FileNotFoundError, shutil.Error):
                pass  # swapped out mid-copy by a rebuild: try again
            shutil.rmtree(dest, ignore_errors=True)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{READY} did not appear within {wait_s:.0f}s; build it with `make model`")
        time.sleep(5)
