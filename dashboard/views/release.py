"""Release: approve, reject, release, roll back and run canaries through the server's release API,
for weights and harness candidates alike (a weights candidate and a harness candidate together make
one composite release); the harness releases with their diffs; the chain with what each release
changed (weights, harness, both, or the traffic split of a routing release).

Every button carries the head this page showed (bound when the page rendered, not re-read at the
click), so a release made by someone else in between is refused by the server (409 head_moved)
and reported here; nothing is overwritten.
"""

from __future__ import annotations

import getpass

import polars as pl
import streamlit as st

from dashboard import api, data, ui

cfg, scenario = ui.require_scenario()
version = ui.version(cfg, scenario)
st.title(f"Release · {scenario}")

live = api.serving(cfg.url, scenario)
chain = (live or {}).get("releases") or data.releases(cfg.data_dir, scenario, version)
head = (live or {}).get("head") or (chain[-1] if chain else None)
head_id = head["release_id"] if head else None


def _keep(widget_key: str, value_key: str) -> None:
    st.session_state[value_key] = st.session_state[widget_key]


# Widget state is dropped when the page is left: the values are kept under keys of their own.
st.session_state.setdefault("approver_value", getpass.getuser())
for widget_key, value_key in (("admin_token_input", "admin_token_value"), ("approver_input", "approver_value")):
    if widget_key not in st.session_state:
        st.session_state[widget_key] = st.session_state.get(value_key, "")
left, right = st.columns(2)
if not cfg.admin_token:
    left.text_input("Admin token", type="password", key="admin_token_input", on_change=_keep,
                    args=("admin_token_input", "admin_token_value"),
                    help="the server's `admin_token` (serve.yaml or REEF_ADMIN_TOKEN); set REEF_ADMIN_TOKEN "
                         "before `reef dashboard` to skip this")
right.text_input("Approve as", key="approver_input", on_change=_keep, args=("approver_input", "approver_value"))


def token() -> str | None:
    return (cfg.admin_token or st.session_state.get("admin_token_input")
            or st.session_state.get("admin_token_value") or None)


def act(kind: str, target: str, expected_parent: str) -> None:
    """Button callback: runs before the rerun, with the head the page showed when it was clicked."""
    by = st.session_state.get("approver_input") or st.session_state.get("approver_value") or None
    if kind == "release":
        outcome = api.release(cfg.url, token(), scenario, target, expected_parent, by)
    elif kind == "composite":
        outcome = api.release(cfg.url, token(), scenario, target, expected_parent, by,
                              harness=st.session_state.get("release_harness") or None)
    elif kind == "rollback":
        outcome = api.rollback(cfg.url, token(), scenario, target, expected_parent, by)
    elif kind == "canary":
        outcome = api.start_canary(cfg.url, token(), scenario, target, float(st.session_state["canary_fraction"]),
                                   expected_parent, by)
    elif kind == "abort_canary":
        outcome = api.stop_canary(cfg.url, token(), scenario)
    else:
        reason = (st.session_state.get(f"reason_{target}") or "").strip() or "rejected in the dashboard"
        outcome = api.reject(cfg.url, token(), target, reason, by)
    st.session_state["release_outcome"] = outcome
    st.cache_data.clear()


outcome: api.Outcome | None = st.session_state.pop("release_outcome", None)
if outcome is not None:
    if outcome.ok:
        st.success(outcome.message, icon=":material/check_circle:")
    elif outcome.code == "head_moved":
        st.error(outcome.message, icon=":material/call_split:")
    else:
        st.error(outcome.message, icon=":material/error:")

can_act = live is not None and head_id is not None
if live is None:
    st.warning(f"The server at {cfg.url} does not answer: showing the chain from `{cfg.data_dir}`, actions are off.")
elif not token():
    st.info("Actions need the server's admin token.")

# --- head ---------------------------------------------------------------------------------------
with st.container(border=True):
    if head is None:
        st.markdown(f"No release yet: `{scenario}` serves its base model as `{scenario}@r0` until the first "
                    "candidate is gated.")
    else:
        c = st.columns([2, 2, 3])
        c[0].metric("Head", head_id)
        serving = (live or {}).get("serving") or {}
        c[1].metric("Serving", serving.get("release_id") or "-")
        split = data.split_text(head)
        c[2].markdown(f"{head['operation']} · {head['kind']} · content `{ui.short(head['content_id'])}` · "
                      f"harness `{ui.short(head.get('harness_id'))}`"
                      + (f" · split {split}" if split else "") + "  \n"
                      f"approved by {head.get('approved_by') or '-'} · {ui.when(head['created_at'])}")
        if serving.get("error"):
            st.error(f"last swap failed: {serving['error']}")

views = data.candidates(cfg.data_dir, scenario, version)

# --- waiting for approval -----------------------------------------------------------------------
st.subheader("Waiting for approval")
pending = [v for v in views if v["status"] == "selected"]
if not pending:
    st.caption("No selected candidate is waiting.")
for v in pending:
    cid = v["candidate_id"]
    gate = v.get("gate") or {}
    with st.container(border=True):
        left, right = st.columns([3, 2])
        left.markdown(f"**{cid[:12]}** · {v['kind']} · {ui.when(v['created_at'])}  \n"
                      f"gate vs {gate.get('head_release_id')}: success {ui.pct(gate.get('candidate_success'))} vs "
                      f"{ui.pct(gate.get('head_success'))}, delta {ui.signed(gate.get('delta'))} "
                      f"[{ui.signed(gate.get('ci_low'))}, {ui.signed(gate.get('ci_high'))}]")
        if v["kind"] == "harness":
            with left.expander("Harness diff", expanded=False):
                ui.harness_changes(cfg, v, head)
        right.text_input("Reason (for a reject)", key=f"reason_{cid}", label_visibility="collapsed",
                         placeholder="reason, for a reject")
        a, b = right.columns(2)
        a.button("Approve", key=f"approve_{cid}", type="primary", icon=":material/check:", disabled=not can_act,
                 on_click=act, args=("release", cid, head_id), help=f"release it on top of {head_id}")
        b.button("Reject", key=f"reject_{cid}", icon=":material/close:", disabled=not can_act,
                 on_click=act, args=("reject", cid, head_id or ""))

# --- release any candidate, roll back ------------------------------------------------------------
left, right = st.columns(2)
with left:
    st.subheader("Release a candidate")
    ids = [v["candidate_id"] for v in views if v["status"] != "released"]
    by_cid = {v["candidate_id"]: v for v in views}
    if ids:
        chosen = st.selectbox("Candidate", ids, key="release_candidate",
                              format_func=lambda cid: f"{cid[:12]} · {by_cid[cid]['kind']} · {by_cid[cid]['status']}")
        trees = [cid for cid in ids if by_cid[cid]["kind"] == "harness"]
        if by_cid[chosen]["kind"] != "harness" and trees:
            st.selectbox("With harness (one composite release)", [""] + trees, key="release_harness",
                         format_func=lambda cid: "- (keep the head's harness)" if not cid else
                         f"{cid[:12]} · {by_cid[cid]['status']}")
        else:
            st.session_state.pop("release_harness", None)
        st.caption("Only a `selected` candidate can be released; the server refuses the others. A weights "
                   "release keeps the head's harness, a harness release the head's weights.")
        st.button("Release", key="release_button", icon=":material/rocket_launch:", disabled=not can_act,
                  on_click=act, args=("composite", chosen, head_id))
    else:
        st.caption("No unreleased candidate.")
with right:
    st.subheader("Roll back")
    targets = [r for r in chain[:-1] if head is None or data.serves(r) != data.serves(head)]
    if targets:
        by_id = {r["release_id"]: r for r in targets}

        def _target(rid: str) -> str:
            r = by_id[rid]
            split = data.split_text(r)
            return (f"{rid} · {r['operation']} · weights {ui.short(r['content_id'])} · harness "
                    f"{ui.short(r.get('harness_id'))}" + (f" · split {split}" if split else ""))

        target = st.selectbox("Serve again", list(reversed(list(by_id))), key="rollback_target", format_func=_target)
        st.caption("A rollback restores the release's weights, harness and traffic split (a canary's routing "
                   "release splits traffic again, with a new canary deciding over it).")
        st.button("Rollback", key="rollback_button", icon=":material/undo:", disabled=not can_act,
                  on_click=act, args=("rollback", target, head_id))
    else:
        st.caption("Nothing to roll back to.")

# --- canary --------------------------------------------------------------------------------------
st.subheader("Canary")
canary = ((live or {}).get("serving") or {}).get("canary")
if canary:
    arms = canary.get("arms") or {}
    st.markdown(f"**{canary['state']}** · candidate `{ui.short(canary['candidate_id'])}` · "
                f"{canary['fraction']:.0%} of requests · split by routing release {canary.get('head_release_id')}"
                + (f"  \n{canary['reason']}" if canary.get("reason") else ""))
    st.dataframe(pl.DataFrame([{"arm": name, **arm} for name, arm in arms.items()],
                              schema_overrides={"mean_score": pl.Float64}), hide_index=True, width="stretch")
running = bool(canary and canary["state"] == "running")
if running:
    st.caption(f"It decides once each arm has {canary.get('min_reports')} reports: promote if the candidate's "
               f"mean reward is at least the head's minus {canary.get('tolerance')}, else abort.")
    st.button("Abort canary", key="canary_abort", icon=":material/cancel:", disabled=not can_act,
              on_click=act, args=("abort_canary", canary["candidate_id"], head_id))
else:
    loras = [v["candidate_id"] for v in views if v["status"] == "selected" and v["kind"] == "lora"]
    if loras:
        c = st.columns([3, 2])
        pick = c[0].selectbox("Candidate", loras, key="canary_candidate", format_func=lambda cid: cid[:12])
        c[1].number_input("Share of requests", min_value=0.01, max_value=0.99, value=0.1, step=0.05,
                          key="canary_fraction")
        st.caption("A canary sends a share of live traffic to a selected LoRA candidate and compares live "
                   "rewards with the head's over the same period; the scenario's rule promotes or aborts it. "
                   "The split is a routing release on the chain: a restart or a rollback restores it.")
        st.button("Start canary", key="canary_start", icon=":material/science:", disabled=not can_act,
                  on_click=act, args=("canary", pick, head_id))
    else:
        st.caption("No selected LoRA candidate to run a canary with.")

# --- harness releases ---------------------------------------------------------------------------
parents = {r["release_id"]: r for r in chain}
harness_releases = [r for r in chain[1:] if r.get("harness_id") != parents[r["parent_release_id"]].get("harness_id")]
st.subheader("Harness releases")
if not harness_releases:
    st.caption("No release changed the harness yet.")
for r in reversed(harness_releases):
    parent = parents[r["parent_release_id"]]
    evaluation = r.get("evaluation") or {}
    gate = evaluation.get("harness") or evaluation  # a composite keeps the harness's gate under "harness"
    title = (f"{r['release_id']} · {data.change_of(r, parent)} · harness {ui.short(r.get('harness_id'))} · "
             f"{r['operation']} · by {r.get('approved_by') or '-'}")
    with st.expander(title, expanded=r is harness_releases[-1]):
        if gate.get("delta") is not None:
            st.markdown(f"gate vs {gate.get('head_release_id') or parent['release_id']}: success "
                        f"{ui.pct(gate.get('candidate_success'))} vs {ui.pct(gate.get('head_success'))}, delta "
                        f"{ui.signed(gate.get('delta'))} [{ui.signed(gate.get('ci_low'))}, "
                        f"{ui.signed(gate.get('ci_high'))}]")
        diff = data.harness_diff(cfg.data_dir, parent.get("harness_id"), r.get("harness_id"),
                                 parent["release_id"], r["release_id"])
        st.code(diff or "(no difference)", language="diff")

# --- the chain -----------------------------------------------------------------------------------
st.subheader("Release chain")
if chain:
    st.dataframe(pl.DataFrame([{
        "release": r["release_id"], "operation": r["operation"],
        "change": data.change_of(r, parents.get(r.get("parent_release_id") or "")), "kind": r["kind"],
        "content": ui.short(r["content_id"]), "harness": ui.short(r.get("harness_id")), "split": data.split_text(r),
        "parent": r.get("parent_release_id"), "restores": r.get("restores"), "approved by": r.get("approved_by"),
        "created": ui.when(r["created_at"]), "gate delta": (r.get("evaluation") or {}).get("delta"),
    } for r in reversed(chain)], infer_schema_length=None), hide_index=True, width="stretch")
