"""Token-level details of a recorded reply: ids, logprobs and, when the scenario's base model is in
the artifact store, the text of each token."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl
import streamlit as st

from dashboard import data


@st.cache_resource(show_spinner="Loading the tokenizer ...")
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def tokenizer_for(data_dir: Path, scenario: str, version: tuple[Any, ...]) -> Any | None:
    """The tokenizer of the scenario's r0 (its base model), if that is a model folder."""
    chain = data.releases(data_dir, scenario, version)
    if not chain or chain[0]["kind"] != "full":
        return None
    manifest = data.manifest(data_dir, chain[0]["content_id"])
    if manifest is None or not any(f["path"] == "tokenizer.json" for f in manifest["files"]):
        return None
    try:
        return _load_tokenizer(str(data_dir / "artifacts" / chain[0]["content_id"] / "files"))
    except Exception:  # noqa: BLE001 - decoding is a convenience: fall back to ids
        return None


def token_table(token_ids: list[int], logprobs: list[float], tokenizer: Any | None = None) -> pl.DataFrame:
    n = len(token_ids)
    lps = list(logprobs) + [None] * (n - len(logprobs))
    frame: dict[str, Any] = {"position": list(range(n)), "token_id": token_ids}
    if tokenizer is not None:
        frame["text"] = [tokenizer.decode([t]) for t in token_ids]
    frame["logprob"] = lps
    frame["prob"] = [None if lp is None else math.exp(lp) for lp in lps]
    return pl.DataFrame(frame, schema_overrides={"logprob": pl.Float64, "prob": pl.Float64})
