"""Experience: filter records, open a session as a conversation, export the filtered set."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import altair as alt
import polars as pl
import streamlit as st

from dashboard import data, tokens, ui

cfg, scenario = ui.require_scenario()
version = ui.version(cfg, scenario)
st.title(f"Experience · {scenario}")

summary = data.summary(cfg.data_dir, scenario, version)
if not summary["records"]:
    st.info("No records yet.")
    st.stop()

# --- filters ------------------------------------------------------------------------------------
with st.container(border=True):
    a, b, c = st.columns([2, 3, 2])
    session = a.text_input("Session or record id (prefix)", key="exp_text").strip() or None
    releases = b.multiselect("Releases", summary["by_release"]["release_id"].to_list(), key="exp_releases")
    scored = c.radio("Reports", ["any", "scored", "unscored"], horizontal=True, key="exp_scored")
    a, b = st.columns(2)
    lo_score, hi_score = summary["min_score"], summary["max_score"]
    score_range = None
    if lo_score is not None and hi_score is not None and lo_score < hi_score:
        score_range = a.slider("Score", float(lo_score), float(hi_score), (float(lo_score), float(hi_score)),
                               key="exp_score")
    # The slider takes naive datetimes (the data is UTC), its ends on whole steps around the data.
    first, last = (None if t is None else t.replace(tzinfo=None) for t in (summary["first"], summary["last"]))
    time_range: tuple[datetime, datetime] | None = None
    if first is not None and last is not None and (last - first).total_seconds() >= 2:
        step = timedelta(seconds=max(1, int((last - first).total_seconds() / 500)))
        first = first.replace(microsecond=0)
        last = first + step * math.ceil((last - first) / step)
        time_range = b.slider("Time (UTC)", first, last, (first, last), step=step, format="MM-DD HH:mm:ss",
                              key="exp_time")

filters = data.Filters(
    text=session, releases=tuple(releases), scored=scored,
    min_score=score_range[0] if score_range and score_range[0] > lo_score else None,
    max_score=score_range[1] if score_range and score_range[1] < hi_score else None,
    since=time_range[0].replace(tzinfo=UTC) if time_range and time_range[0] > first else None,
    until=time_range[1].replace(tzinfo=UTC) if time_range and time_range[1] < last else None,
)

# --- one page of records ------------------------------------------------------------------------
a, b, c = st.columns([1, 1, 3])
page_size = a.selectbox("Rows per page", [25, 50, 100, 200], index=1, key="exp_page_size")
total = data.count(cfg.data_dir, scenario, version, filters)
pages = max(1, math.ceil(total / page_size))
page = b.number_input(f"Page (of {pages:,})", min_value=1, max_value=pages, value=1, step=1, key="exp_page")
rows = data.records_page(cfg.data_dir, scenario, version, filters, int(page) - 1, page_size)
c.markdown(f"**{total:,}** of {summary['records']:,} records match")
c.download_button("Export filtered set (parquet)", data=lambda: data.export_parquet(cfg.data_dir, scenario, filters),
                  file_name=f"{scenario}-experience.parquet", mime="application/vnd.apache.parquet",
                  icon=":material/download:", disabled=total == 0, key="exp_export")

if rows.height:
    st.dataframe(
        rows.select("created_at", "release_id", "score", "prompt", "reply", "feedback", "n_reports",
                    pl.col("gen_ai.usage.output_tokens").alias("tokens"), "latency_ms",
                    pl.col(data.SESSION).alias("session"), "record_id", "is_duplicate", "staleness"),
        hide_index=True, width="stretch", height=min(36 * (rows.height + 1), 420),
        column_config={"latency_ms": st.column_config.NumberColumn("latency ms", format="%.0f"),
                       "created_at": st.column_config.DatetimeColumn("created (UTC)", format="MM-DD HH:mm:ss")},
    )
else:
    st.info("No record matches these filters.")
    st.stop()

# --- a session as a conversation ----------------------------------------------------------------
sessions = list(dict.fromkeys(rows[data.SESSION].to_list()))
st.subheader("Session")
chosen = st.selectbox("Open a session from this page", sessions, key="exp_session")
decode = st.toggle("Decode tokens with the scenario's base tokenizer", key="exp_decode")
turns = data.session_records(cfg.data_dir, scenario, version, chosen)
reports = data.reports_for(cfg.data_dir, scenario, version, tuple(turns["record_id"]))
tokenizer = tokens.tokenizer_for(cfg.data_dir, scenario, version) if decode else None
if decode and tokenizer is None:
    st.caption("No tokenizer: the scenario's base release is not a model folder in the artifact store.")

shown = 0
for number, turn in enumerate(turns.iter_rows(named=True), 1):
    messages = turn["messages"] or []
    for message in messages[shown:]:
        role = message["role"] if message["role"] in ("user", "assistant") else "assistant"
        with st.chat_message(role, avatar=":material/settings:" if message["role"] == "system" else None):
            if message["role"] == "system":
                st.caption("system")
            st.markdown(message.get("content") or "")
    choices = turn["choices"] or []
    for choice in choices:
        with st.chat_message("assistant"):
            st.markdown(choice.get("content") or "_(no text)_")
            score = "-" if turn["score"] is None else f"{turn['score']:g}"
            label = f"choice {choice['index']} · " if len(choices) > 1 else ""
            st.caption(f"{label}{turn['release_id']} · score {score} · {turn['record_id']} · "
                       f"{ui.when(turn['created_at'])} · {turn['latency_ms']:.0f} ms · "
                       f"finish {choice.get('finish_reason')}")
            last = number == turns.height and choice is choices[0]
            with st.expander(f"Tokens ({len(choice.get('token_ids') or [])})", expanded=last):
                table = tokens.token_table(choice.get("token_ids") or [], choice.get("logprobs") or [], tokenizer)
                if table.height:
                    chart = alt.Chart(table.to_pandas()).mark_bar().encode(
                        x=alt.X("position:O"), y=alt.Y("logprob:Q"),
                        tooltip=[c for c in table.columns])
                    st.altair_chart(chart.properties(height=140), width="stretch")
                    st.dataframe(table, hide_index=True, width="stretch")
                st.caption(f"prompt: {len(turn['prompt_token_ids'] or [])} tokens · model "
                           f"{turn['gen_ai.response.model']} · temperature {turn['gen_ai.request.temperature']}")
    mine = reports.filter(pl.col("record_id") == turn["record_id"])
    for report in mine.iter_rows(named=True):
        st.info(f"report {report['report_id']}: score **{report['score']:g}**"
                + (f" · {report['feedback']}" if report["feedback"] else "")
                + f" · {ui.when(report['created_at'])}", icon=":material/grade:")
    shown = len(messages) + 1  # the next turn repeats this one's messages and its reply
