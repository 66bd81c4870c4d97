"""Content hashes: sha256 of a file, of a folder (from its files' hashes), and of a JSON value."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

_BLOCK = 1 << 20  # read in blocks: weights files are larger than memory should hold twice


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_sha256(model_dir: Path | str) -> str | None:
    """The hash of a model folder's weights (`model.safetensors`), None when it has none (an adapter)."""
    path = Path(model_dir) / "model.safetensors"
    return sha256_file(path) if path.is_file() else None


def sha256_tree(files: Iterable[tuple[str, str]]) -> str:
    """A folder's hash from its `(relative path, sha256)` pairs: of the `sha256sum`-style listing
    (`<sha256>  <path>` lines, sorted by path), so equal files give an equal hash wherever they are."""
    listing = "".join(f"{sha}  {path}\n" for path, sha in sorted(files))
    return hashlib.sha256(listing.encode()).hexdigest()


def sha256_json(value: Any) -> str:
    """Hash of a JSON value with sorted keys, so equal content gives equal hashes."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()
