"""Hypothesis strategies the fuzz tests of every route share: any JSON value, and Reef's request headers."""

from __future__ import annotations

from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=140).map(str.strip)
HEADERS = st.fixed_dictionaries({}, optional={
    "x-reef-scenario": HEADER_TEXT | st.just("default"), "x-reef-agent-record-id": HEADER_TEXT,
    "x-reef-session": HEADER_TEXT, "x-reef-tag-t": HEADER_TEXT, "authorization": HEADER_TEXT,
    "content-type": st.sampled_from(["application/json", "text/plain", "", "application/x-www-form-urlencoded"]),
})
