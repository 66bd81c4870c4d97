"""The dashboard under Streamlit's AppTest: one page opened against a data dir and a server URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.helpers import REPO

APP = str(REPO / "dashboard" / "app.py")


def app(monkeypatch: pytest.MonkeyPatch, data_dir: Path, url: str, page: str | None = None,
        token: str | None = None) -> AppTest:
    monkeypatch.setenv("REEF_DATA_DIR", str(data_dir))
    monkeypatch.setenv("REEF_URL", url)
    if token:
        monkeypatch.setenv("REEF_ADMIN_TOKEN", token)
    else:
        monkeypatch.delenv("REEF_ADMIN_TOKEN", raising=False)
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    if page:
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, at.exception
    return at


def texts(at: AppTest, kind: str) -> list[str]:
    return [e.value for e in getattr(at, kind)]
