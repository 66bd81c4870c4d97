"""Overview: traffic and reward over time by release, the head, the learner, recent gate decisions."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import api, data, ui

cfg, scenario = ui.require_scenario()
version = ui.version(cfg, scenario)
st.title(f"Overview · {scenario}")

summary = data.summary(cfg.data_dir, scenario, version)
chain = data.releases(cfg.data_dir, scenario, version)
head = chain[-1] if chain else None
status = api.server_status(cfg.url)

c = st.columns([1, 1, 1, 1, 2])
c[0].metric("Records", f"{summary['records']:,}")
c[1].metric("Sessions", f"{summary['sessions']:,}")
c[2].metric("Scored", f"{summary['scored']:,}")
c[3].metric("Mean reward", "-" if summary["mean_score"] is None else f"{summary['mean_score']:.3f}")
c[4].metric("Head", head["release_id"] if head else f"{scenario}@r0")

# --- traffic and reward over time ---------------------------------------------------------------
bucket = data.bucket_for(summary["first"], summary["last"])
grid = data.traffic(cfg.data_dir, scenario, version, bucket)
if grid.height:
    scale = ui.release_scale(grid["release_id"].unique().to_list() + [r["release_id"] for r in chain])
    colour = alt.Color("release_id:N", title="release", scale=scale)
    base = alt.Chart(grid.to_pandas()).encode(x=alt.X("time:T", title=f"time ({bucket} buckets, UTC)"))
    requests = base.mark_bar().encode(y=alt.Y("requests:Q", title="requests"), color=colour,
                                      tooltip=["time:T", "release_id:N", "requests:Q", "scored:Q"])
    reward = base.mark_line(point=True).encode(
        y=alt.Y("mean_reward:Q", title="mean reward"), color=colour,
        tooltip=["time:T", "release_id:N", alt.Tooltip("mean_reward:Q", format=".3f"), "scored:Q"])
    left, right = st.columns(2)
    left.subheader("Traffic")
    left.altair_chart(requests.properties(height=260), width="stretch")
    right.subheader("Reward")
    right.altair_chart(reward.properties(height=260), width="stretch")
else:
    st.info("No experience recorded for this scenario yet.")

by_release = summary["by_release"]
if by_release.height:
    st.dataframe(by_release.rename({"release_id": "release", "mean_score": "mean reward"}), hide_index=True,
                 width="stretch")

# --- head, serving, learner ---------------------------------------------------------------------
left, right = st.columns(2)
with left:
    st.subheader("Current head")
    if head is None:
        st.write(f"No release chain yet: the scenario serves its base model as `{scenario}@r0`.")
    else:
        st.markdown(f"**{head['release_id']}** · {head['operation']} · {head['kind']} · content "
                    f"`{ui.short(head['content_id'])}`  \napproved by {head.get('approved_by') or '-'} "
                    f"at {ui.when(head['created_at'])}")
    if status is not None:
        serving = (status.get("scenarios") or {}).get(scenario) or {}
        if serving.get("serving_release"):
            st.caption(f"server serves **{serving['serving_release']}** (model `{serving.get('serving_model')}`)")
            if head and serving["serving_release"] != head["release_id"]:
                st.warning(f"The server serves {serving['serving_release']}, the chain's head is "
                           f"{head['release_id']}.")
with right:
    st.subheader("Learner")
    rounds = data.learner_rounds(cfg.data_dir, limit=5, scenario=scenario)
    learner = (status or {}).get("learner")
    mine = ((learner or {}).get("scenarios") or {}).get(scenario)
    if learner is None:
        st.caption(f"Server at {cfg.url} not reachable: live learner status unknown.")
    elif not learner.get("enabled"):
        st.caption("The server's learner is off (`learner.enabled: false`).")
    elif mine is None:
        st.caption(f"The learner has no recipe for {scenario} (serve.yaml `scenarios.{scenario}.recipe`).")
    else:
        pending = mine.get("pending") or {}
        if mine.get("running"):
            state = "running a round"
        elif learner.get("running_scenario"):
            state = f"waiting (a round of {learner['running_scenario']} is running)"
        else:
            state = "waiting"
        need = mine.get("thresholds") or {"records": mine.get("min_records", "?")}
        starts = ", ".join(f"{n} {k}" for k, n in need.items() if n)
        st.markdown(f"**{state}** · recipe `{mine.get('recipe')}` · {mine.get('rounds', 0)} rounds since start  \n"
                    f"next round: **{pending.get('records', '?')}** eligible records waiting "
                    f"(starts at {starts})")
        if mine.get("waiting"):  # below a threshold: which counts are short
            st.caption(mine["waiting"])
        if rnd := mine.get("round"):
            why = f" ({rnd['reason']})" if rnd.get("reason") else ""
            st.caption(f"round {rnd['round_id']}: **{rnd['state']}**{why}")
        details = {k: v for k, v in pending.items() if k != "records"}
        if details:
            st.caption(", ".join(f"{k}: {v}" for k, v in details.items()))
        if mine.get("last_error"):
            st.error(f"last round failed: {mine['last_error']}")
    if rounds:
        last = rounds[0]
        cand = (last.get("candidate") or {}).get("id") if isinstance(last.get("candidate"), dict) else None
        st.markdown(f"last round: **{last.get('status', '?')}** in {last.get('seconds', '?')} s"
                    + (f", candidate `{cand}`" if cand else ""))
    elif learner is not None:
        st.caption("No learning round has finished yet.")

# --- gate decisions ----------------------------------------------------------------------------
st.subheader("Recent gate decisions")
gated = [c for c in data.candidates(cfg.data_dir, scenario, version) if c.get("gate")]
gated.sort(key=lambda c: c["gate"]["evaluated_at"], reverse=True)
if gated:
    st.dataframe(pl.DataFrame([{
        "evaluated": ui.when(c["gate"]["evaluated_at"]), "candidate": ui.short(c["candidate_id"]),
        "kind": c["kind"], "decision": c["gate"]["decision"], "status": c["status"],
        "vs": c["gate"].get("head_release_id"), "delta": c["gate"].get("delta"),
        "ci_low": c["gate"].get("ci_low"), "ci_high": c["gate"].get("ci_high"), "reason": c["gate"]["reason"],
    } for c in gated[:10]]), hide_index=True, width="stretch")
else:
    st.caption("No candidate has been through the gate yet.")
