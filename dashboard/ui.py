"""Small pieces every page shares: the settings and scenario the sidebar chose, release colours,
short ids and times."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import altair as alt
import streamlit as st

from dashboard import data
from dashboard.config import Settings

PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
           "#bab0ac"]


def settings() -> Settings:
    return st.session_state["settings"]


def scenario() -> str | None:
    return st.session_state.get("scenario")


def require_scenario() -> tuple[Settings, str]:
    """The settings and the chosen scenario; stops the page with a hint when there is none."""
    cfg, name = settings(), scenario()
    if not name:
        st.info(f"No scenario in `{cfg.data_dir}` yet: serve some traffic (`reef simulate`) or point "
                "`--data-dir` at the data dir `reef serve` uses.")
        st.stop()
    return cfg, name


def version(cfg: Settings, name: str) -> tuple[Any, ...]:
    return data.version(cfg.data_dir, name)


def short(content_id: str | None, n: int = 12) -> str:
    return "-" if not content_id else content_id[:n]


def when(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    return value.strftime("%Y-%m-%d %H:%M:%S")


def release_scale(release_ids: list[str]) -> alt.Scale:
    """The same colour for a release on every chart: ordered by sequence number."""

    def seq(rid: str) -> tuple[int, str]:
        tail = rid.rsplit("@r", 1)[-1]
        return (int(tail), rid) if tail.isdigit() else (10**9, rid)

    domain = sorted(set(release_ids), key=seq)
    return alt.Scale(domain=domain, range=[PALETTE[i % len(PALETTE)] for i in range(len(domain))])


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def harness_changes(cfg: Settings, view: dict[str, Any], head: dict[str, Any] | None) -> None:
    """A harness candidate's changes: the mutations its recipe proposed and the diff of its files
    against the harness it changes (its parent harness, else the head's)."""
    import polars as pl

    base, label = data.harness_base(view, head)
    st.caption(f"against the {label}" if base else "the head serves no harness: every file is new")
    mutations = view.get("mutations") or []
    if mutations:
        st.dataframe(pl.DataFrame([{"op": m.get("op"), "path": m.get("path"), "reason": m.get("reason")}
                                   for m in mutations]), hide_index=True, width="stretch")
    diff = data.harness_diff(cfg.data_dir, base, view["candidate_id"], label.split()[0], "candidate")
    st.code(diff or "(no difference)", language="diff")
