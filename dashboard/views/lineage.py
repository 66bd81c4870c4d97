"""Lineage: from a release back through its candidate, snapshot, recipe, params, parent release and
the DVC stages, drawn as a graph (DOT, rendered in the browser: no graphviz binary needed)."""

from __future__ import annotations

import streamlit as st

from dashboard import data, graph, ui

cfg, scenario = ui.require_scenario()
version = ui.version(cfg, scenario)
st.title(f"Lineage · {scenario}")

chain = data.releases(cfg.data_dir, scenario, version)
if not chain:
    st.info("No release chain yet: nothing has been released for this scenario.")
    st.stop()

by_id = {r["release_id"]: r for r in chain}
a, b = st.columns([3, 1])
chosen = a.selectbox(
    "Release", list(reversed(list(by_id))), key="lineage_release",
    format_func=lambda rid: f"{rid} · {by_id[rid]['operation']} · {ui.short(by_id[rid]['content_id'])}")
depth = b.number_input("Ancestors", min_value=0, max_value=50, value=min(5, len(chain) - 1), key="lineage_depth")

candidates = {c["candidate_id"]: c for c in data.candidates(cfg.data_dir, scenario, version)}
manifests = {r["content_id"]: data.manifest(cfg.data_dir, r["content_id"]) for r in chain}
dot = graph.lineage_dot(chain, chosen, int(depth), candidates, manifests, data.dvc_stages(cfg.data_dir))
st.graphviz_chart(dot, width="stretch")

release = by_id[chosen]
lineage = release.get("lineage") or {}
left, right = st.columns(2)
with left:
    st.markdown(f"**{chosen}**: {release['operation']} of a {release['kind']} artifact, approved by "
                f"{release.get('approved_by') or '-'} at {ui.when(release['created_at'])}")
    if release.get("restores"):
        st.markdown(f"restores **{release['restores']}**")
    cand = candidates.get(release["content_id"])
    if cand:
        st.markdown(f"candidate `{cand['candidate_id'][:12]}` ({cand['status']}), from `{cand.get('source') or '-'}`")
    st.json(lineage, expanded=1)
with right:
    manifest = manifests.get(release["content_id"])
    if manifest:
        st.markdown(f"artifact `{ui.short(release['content_id'])}`: {len(manifest['files'])} files, "
                    f"{sum(f['size'] for f in manifest['files']) / 1e6:.1f} MB")
        st.dataframe([{"path": f["path"], "size": f["size"], "sha256": f["sha256"][:16]} for f in manifest["files"]],
                     hide_index=True, width="stretch")
    if release.get("evaluation"):
        st.markdown("**Gate evaluation at release**")
        st.json(release["evaluation"], expanded=False)
with st.expander("DOT source"):
    st.code(dot, language="dot")
