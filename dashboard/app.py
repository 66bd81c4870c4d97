"""Reef's dashboard: `reef dashboard` (or `streamlit run dashboard/app.py -- --data-dir data --url URL`).

Pages read the data dir directly (experience, release chain, candidates; dashboard/data.py) and act
through the running server's release API (dashboard/api.py, `reef.client.ReefClient`). One
script per page in dashboard/views/ (not pages/: Streamlit treats a `pages/` folder next to the main
script as a legacy multipage app and runs its files on their own, which breaks deep links).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: `dashboard` is a top-level package
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from dashboard import config, data  # noqa: E402

st.set_page_config(page_title="Reef", page_icon=":material/waves:", layout="wide")

if "settings" not in st.session_state:
    st.session_state["settings"] = config.settings()
cfg: config.Settings = st.session_state["settings"]

pages = [
    st.Page("views/overview.py", title="Overview", icon=":material/monitoring:", default=True),
    st.Page("views/experience.py", title="Experience", icon=":material/forum:"),
    st.Page("views/candidates.py", title="Candidates", icon=":material/science:"),
    st.Page("views/release.py", title="Release", icon=":material/rocket_launch:"),
    st.Page("views/lineage.py", title="Lineage", icon=":material/account_tree:"),
]
nav = st.navigation(pages)

# The chosen scenario lives under its own key, not the widget's: widget state is dropped on a run
# that does not draw the widget, and the choice must survive every page switch.
names = data.scenarios(cfg.data_dir)
if st.session_state.get("scenario") not in names:
    st.session_state["scenario"] = names[0] if names else None


def _pick() -> None:
    st.session_state["scenario"] = st.session_state["scenario_picker"]


with st.sidebar:
    if names:
        st.selectbox("Scenario", names, index=names.index(st.session_state["scenario"]), key="scenario_picker",
                     on_change=_pick)
    st.caption(f"data `{cfg.data_dir}`  \nserver `{cfg.url}`")
    if st.button("Refresh", icon=":material/refresh:", help="drop every cached query and read the data dir again"):
        st.cache_data.clear()
        st.cache_resource.clear()

nav.run()
