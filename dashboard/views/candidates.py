"""Candidates: every candidate (weights and harness) with its gate result; one compared with the head
in detail, a harness candidate with its mutations and the diff of its files."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import data, ui

cfg, scenario = ui.require_scenario()
version = ui.version(cfg, scenario)
st.title(f"Candidates · {scenario}")

views = data.candidates(cfg.data_dir, scenario, version)
chain = data.releases(cfg.data_dir, scenario, version)
head = chain[-1] if chain else None
if not views:
    st.info("No candidate registered for this scenario yet (`reef learn --once`, or a learner round in "
            "`reef serve`, then `register_candidate`).")
    st.stop()


def gate_field(view: dict, name: str) -> object:
    return (view.get("gate") or {}).get(name)


table = pl.DataFrame([{
    "created": ui.when(v["created_at"]), "candidate": ui.short(v["candidate_id"]), "kind": v["kind"],
    "status": v["status"], "gate": gate_field(v, "decision"), "vs": gate_field(v, "head_release_id"),
    "candidate success": gate_field(v, "candidate_success"), "head success": gate_field(v, "head_success"),
    "delta": gate_field(v, "delta"), "ci low": gate_field(v, "ci_low"), "ci high": gate_field(v, "ci_high"),
    "wins": gate_field(v, "wins"), "losses": gate_field(v, "losses"), "release": v.get("release_id"),
    "recipe": (v.get("lineage") or {}).get("recipe"),
} for v in views], infer_schema_length=None)
st.dataframe(table, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.3f")
                            for c in ("candidate success", "head success", "delta", "ci low", "ci high")})

by_id = {v["candidate_id"]: v for v in views}
chosen = st.selectbox(
    "Compare with the head", list(by_id), key="cand_selected",
    format_func=lambda cid: f"{cid[:12]} · {by_id[cid]['status']} · {by_id[cid]['kind']} · "
                            f"{ui.when(by_id[cid]['created_at'])}",
)
view = data.candidate(cfg.data_dir, scenario, version, chosen) or by_id[chosen]
gate = view.get("gate")

st.subheader(f"{chosen[:12]} vs {gate.get('head_release_id') if gate else (head or {}).get('release_id', 'head')}")
if view.get("reject_reason"):
    st.warning(f"Rejected by {view.get('rejected_by') or '?'}: {view['reject_reason']}")
if view.get("release_id"):
    st.success(f"Released as {view['release_id']}.")
if gate is None:
    st.info("Not evaluated by the gate yet (status `registered`).")
else:
    c = st.columns(4)
    c[0].metric("Candidate success", ui.pct(gate.get("candidate_success")),
                delta=None if gate.get("delta") is None else f"{gate['delta']:+.1%}")
    c[1].metric(f"Head success ({gate.get('head_release_id')})", ui.pct(gate.get("head_success")))
    confidence = gate.get("confidence") or 0.95
    c[2].metric(f"Delta, {confidence:.0%} CI", ui.signed(gate.get("delta")),
                delta=f"[{ui.signed(gate.get('ci_low'))}, {ui.signed(gate.get('ci_high'))}]", delta_color="off")
    c[3].metric("Wins / losses / ties", f"{gate.get('wins', 0)} / {gate.get('losses', 0)} / {gate.get('ties', 0)}")
    decision = st.success if gate["decision"] == "select" else st.error
    decision(f"Gate: **{gate['decision']}**: {gate['reason']}  \n{gate.get('prompts', 0)} prompts x "
             f"{gate.get('samples_per_prompt', 0)} samples, {gate.get('seconds') or '?'} s, "
             f"at {ui.when(gate.get('evaluated_at'))}")

    left, right = st.columns(2)
    with left:
        st.markdown("**Success rate and the delta's confidence interval**")
        bars = pl.DataFrame({"arm": ["candidate", "head"],
                             "success": [gate.get("candidate_success"), gate.get("head_success")]})
        chart = alt.Chart(bars.to_pandas()).mark_bar().encode(
            x=alt.X("success:Q", scale=alt.Scale(domain=[0, 1])), y=alt.Y("arm:N", title=None),
            color=alt.Color("arm:N", legend=None), tooltip=["arm", alt.Tooltip("success:Q", format=".3f")])
        st.altair_chart(chart.properties(height=120), width="stretch")
        ci = pl.DataFrame({"what": ["delta"], "delta": [gate.get("delta")], "low": [gate.get("ci_low")],
                           "high": [gate.get("ci_high")]}).to_pandas()
        rule = alt.Chart(ci).mark_rule(strokeWidth=3).encode(
            x=alt.X("low:Q", title=f"delta (candidate - head), {gate.get('confidence') or 0.95:.0%} CI"), x2="high:Q",
            y=alt.Y("what:N", title=None, axis=None))
        point = alt.Chart(ci).mark_point(filled=True, size=90).encode(x="delta:Q", y="what:N",
                                                                      tooltip=["delta", "low", "high"])
        zero = (alt.Chart(pl.DataFrame({"x": [0.0]}).to_pandas())
                .mark_rule(strokeDash=[4, 4], color="gray").encode(x="x:Q"))
        st.altair_chart((rule + point + zero).properties(height=80), width="stretch")

    per_prompt = data.per_prompt_frame(view)
    with right:
        st.markdown("**Reward curves on the eval suite** (per-prompt success, sorted)")
        if per_prompt.height:
            curves = pl.concat([
                per_prompt.select(pl.col(f"{arm}_score").sort(descending=True).alias("success"))
                .with_row_index("rank").with_columns(arm=pl.lit(arm))
                for arm in ("candidate", "head")
            ])
            chart = alt.Chart(curves.to_pandas()).mark_line(interpolate="step-after").encode(
                x=alt.X("rank:Q", title="prompts, best first"), y=alt.Y("success:Q", scale=alt.Scale(domain=[0, 1])),
                color="arm:N")
            st.altair_chart(chart.properties(height=200), width="stretch")
        else:
            st.caption("The gate kept no per-prompt outputs.")

    if per_prompt.height:
        st.subheader("Per prompt, side by side (wins, then losses, then ties)")
        show = st.segmented_control("Show", ["all", "win", "loss", "tie"], default="all", key="cand_outcome")
        subset = per_prompt if show in (None, "all") else per_prompt.filter(pl.col("outcome") == show)
        st.dataframe(
            subset.select("outcome", "prompt", "candidate_score", "head_score", "delta",
                          pl.col("candidate_replies").list.first().alias("candidate reply"),
                          pl.col("head_replies").list.first().alias("head reply")),
            hide_index=True, width="stretch", height=320,
            column_config={c: st.column_config.NumberColumn(format="%.2f")
                           for c in ("candidate_score", "head_score", "delta")})
        for row in subset.head(8).iter_rows(named=True):
            with st.expander(f"{row['outcome']} · {row['prompt']} · {row['candidate_score']:.2f} vs "
                             f"{row['head_score']:.2f}"):
                a, b = st.columns(2)
                a.markdown("**candidate**")
                b.markdown("**head**")
                for reply in row["candidate_replies"]:
                    a.code(reply, language=None)
                for reply in row["head_replies"]:
                    b.code(reply, language=None)

# --- what the candidate is -----------------------------------------------------------------------
st.subheader("Training curves")
steps = data.training_curves(view.get("training_log") or [])
if steps.height:
    picked = st.multiselect("Metrics", sorted(steps["metric"].unique()), key="cand_curves",
                            default=[m for m in data.DEFAULT_CURVES if m in set(steps["metric"])])
    shown = steps.filter(pl.col("metric").is_in(picked or steps["metric"].unique().to_list()))
    chart = alt.Chart(shown.to_pandas()).mark_line(point=shown["step"].n_unique() <= 40).encode(
        x=alt.X("step:Q", title="optimizer step"), y=alt.Y("value:Q", title=None),
        tooltip=["metric", "step", alt.Tooltip("value:Q", format=".4g")],
    ).properties(height=160).facet(facet=alt.Facet("metric:N", title=None), columns=3).resolve_scale(y="independent")
    st.altair_chart(chart)
    st.caption("Per-step metrics the recipe logged (also TensorBoard event files in the candidate's "
               "`tensorboard/` folder: `tensorboard --logdir data/candidates`).")
else:
    st.caption("No per-step training metrics recorded for this candidate.")

left, right = st.columns(2)
with left:
    st.markdown("**Training metrics**")
    metrics = view.get("train_metrics") or {}
    scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if scalars:
        st.dataframe(pl.DataFrame({"metric": list(scalars), "value": [float(v) for v in scalars.values()]}),
                     hide_index=True, width="stretch")
    else:
        st.caption("none recorded")
with right:
    st.markdown("**Lineage**")
    st.json(view.get("lineage") or {}, expanded=1)
    st.page_link("views/lineage.py", label="Open the lineage graph", icon=":material/account_tree:")

if view["kind"] == "harness":
    st.subheader("Harness: mutations and diff")
    ui.harness_changes(cfg, view, head)
    st.page_link("views/release.py", label="Approve, reject or release it on the Release page",
                 icon=":material/rocket_launch:")
